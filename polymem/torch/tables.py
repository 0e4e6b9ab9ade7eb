"""Memory tables as torch modules: where a site's rows come from.

* :class:`TrainableTable` — an fp32 ``[num_rows, r]`` tensor in memory, either trainable (a parameter with
  *sparse* gradients: only rows read in the batch get a gradient entry) or frozen (no gradient, never changes).
* :class:`AssetTable` — frozen, rows read page by page from a :class:`polymem.MemoryAsset` on each forward
  (an NF4 asset is dequantised by the asset's page reader), so the table never has to fit in memory.

All tables answer ``gather(rows)``: int64 rows ``[...]`` (-1 = invalid n-gram) -> fp32 ``[..., r]`` with zeros
for invalid rows. Not here: hashing (:mod:`polymem.torch.hash`), projections and gates (:mod:`.site`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from polymem.errors import PolymemError
from polymem.hash.idhash import IdHashSpec
from polymem.hash.spec import HashSpec
from polymem.hash.layout import Layout


class _RowGather(torch.autograd.Function):
    """out[i] = W[rows[i]] (0 where rows[i] < 0); the gradient of W is a sparse COO tensor whose indices are
    exactly the valid rows read (one entry per read, summed when coalesced)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # rows long [M]
        valid = rows >= 0
        out = weight.index_select(0, rows.clamp_min(0))  # [M, r]
        out = out * valid.unsqueeze(-1).to(out.dtype)
        ctx.save_for_backward(rows, valid)
        ctx.shape = weight.shape
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # grad_out [M, r]
        rows, valid = ctx.saved_tensors
        idx = rows[valid]  # [m]
        g = torch.sparse_coo_tensor(idx.unsqueeze(0), grad_out[valid].float(), ctx.shape, check_invariants=False)
        return g, None


def table_fingerprint(table: np.ndarray | torch.Tensor, spec: HashSpec | IdHashSpec, layout: Layout) -> str:
    """sha256 over the spec, the layout and the fp32 table bytes (hex, first 32 chars)."""
    arr = table.detach().float().cpu().numpy() if isinstance(table, torch.Tensor) else np.asarray(table, np.float32)
    h = hashlib.sha256()
    h.update(json.dumps({"spec": spec.to_dict(), "layout": layout.to_dict()}, sort_keys=True).encode())
    h.update(np.ascontiguousarray(arr, dtype=np.float32).tobytes())
    return h.hexdigest()[:32]


class MemoryTable(nn.Module):
    """Common interface. ``spec``, ``layout``, ``orders`` (the n-gram orders the table was trained with)."""

    spec: HashSpec | IdHashSpec  # byte-addressed, or a token-id (Engram XOR) table: polymem.torch.idrows
    layout: Layout
    orders: tuple[int, ...]
    source: dict[str, Any]

    @property
    def trainable(self) -> bool:
        """Whether the rows are a parameter with gradients."""
        raise NotImplementedError

    def gather(self, rows: torch.Tensor) -> torch.Tensor:  # rows long [...] -> fp32 [..., r]
        """Rows ``rows`` (int64 [...], -1 = no row) -> float32 [..., r] on the rows' device; 0 where a row is -1."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """A short content id of the table (its rows, hash spec and layout): what a saved site names its table by."""
        raise NotImplementedError

    counts: torch.Tensor | None = None  # float32 [num_rows]: how many updates each row received (None: unknown)

    def set_counts(self, counts: Any) -> None:
        """Record the rows' training counts (uint32/int [num_rows], e.g. an asset's ``counts`` array): what
        ``gate="count"`` sites read. None forgets them."""
        if counts is None:
            self.counts = None
            return
        c = torch.as_tensor(np.asarray(counts)).reshape(-1)
        if c.numel() != self.layout.num_rows or c.is_floating_point() or c.dtype == torch.bool:
            raise PolymemError(f"row counts must be integers, one per row ({self.layout.num_rows:,}); got "
                               f"{c.numel():,} of dtype {c.dtype}")
        w = getattr(self, "weight", None)
        self.counts = c.to(device=w.device if isinstance(w, torch.Tensor) else torch.device("cpu"), dtype=torch.float32)

    def gather_counts(self, rows: torch.Tensor) -> torch.Tensor | None:
        """The training counts of ``rows`` (int64 [...]) as float32 [...] (0 where a row is -1), or None when the
        table has no counts."""
        if self.counts is None:
            return None
        c = self.counts.to(rows.device)
        return c.index_select(0, rows.reshape(-1).clamp_min(0)).view(rows.shape) * (rows >= 0)

    def to_numpy(self) -> np.ndarray:
        """The whole table as float32 [num_rows, r] in host memory (a copy)."""
        raise NotImplementedError


def _proc_field(path: str, key: str) -> int | None:
    """``key:  N kB`` of a /proc file, in bytes."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory() -> int | None:
    """Bytes of memory a new allocation of this process can get now, or None where unknown: the machine's
    MemAvailable, and less where this process has a limit — its address-space limit (``ulimit -v``, RLIMIT_AS)
    less what it has mapped, its cgroup's ``memory.max`` less ``memory.current``."""
    import resource

    known = [_proc_field("/proc/meminfo", "MemAvailable")]
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        used = _proc_field("/proc/self/status", "VmSize")
        known.append(max(0, soft - used) if used is not None else None)
    try:
        cap = open("/sys/fs/cgroup/memory.max", encoding="ascii").read().strip()
        if cap != "max":
            known.append(max(0, int(cap) - int(open("/sys/fs/cgroup/memory.current", encoding="ascii").read())))
    except (OSError, ValueError):
        pass
    have = [k for k in known if k is not None]
    return min(have) if have else None


def check_table_memory(layout: Layout, *, trainable: bool, copy: bool = False, rows: int | None = None) -> None:
    """Refuse, before allocating, a table that does not fit this process's memory: its fp32 rows, a copy of the
    given weights while they are taken over (``copy``), and, when it trains, the row-wise optimizer's state (a
    float and a count per row). ``rows``: only that many of the table's rows (one process's share of a sharded
    table). Names both numbers and the ways out."""
    share = rows is not None
    rows = int(layout.num_rows) if rows is None else int(rows)
    table = rows * int(layout.head_dim) * 4
    need = table * (2 if copy else 1) + (rows * 8 if trainable else 0)
    avail = available_memory()
    if avail is not None and need > avail:
        gib = 2**30
        what = "this process's share of the table" if share else "a table"
        raise PolymemError(
            f"{what} of {rows * int(layout.head_dim):,} scalars needs {need / gib:,.1f} GiB of memory "
            f"({table / gib:,.1f} GiB of fp32 rows{', a copy while it is taken over' if copy else ''}"
            f"{', optimizer state' if trainable else ''}) and {avail / gib:,.1f} GiB is available; pass a smaller "
            "--params, train it across more processes (torchrun --nproc-per-node N -m polymem train …: each holds "
            "1/N of the rows), or keep a frozen table on disk (attach(..., in_memory=False))")


class TrainableTable(MemoryTable):
    """fp32 table in memory. ``trainable=True``: a parameter with sparse gradients; else a frozen parameter."""

    def __init__(
        self, weight: torch.Tensor | np.ndarray | None, *, spec: HashSpec | IdHashSpec, layout: Layout,
        orders: tuple[int, ...] = (1, 2, 3), trainable: bool = True, source: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        check_table_memory(layout, trainable=trainable, copy=weight is not None)
        if weight is None:  # rows start at zero: step 0 equals the model without memory (PageGram)
            w = torch.zeros(layout.num_rows, layout.head_dim)
        else:
            w = torch.as_tensor(weight).detach().float().clone()  # the table owns its weights
        if tuple(w.shape) != (layout.num_rows, layout.head_dim):
            raise PolymemError(
                f"table has shape {tuple(w.shape)}, layout {layout.to_dict()} needs "
                f"({layout.num_rows}, {layout.head_dim}); pass the layout the table was made with"
            )
        self.weight = nn.Parameter(w.contiguous(), requires_grad=trainable)
        self.spec, self.layout, self.orders = spec, layout, tuple(orders)
        self.source = dict(source or {"kind": "memory"})

    @property
    def trainable(self) -> bool:
        return self.weight.requires_grad

    def set_trainable(self, flag: bool) -> None:
        """Let the rows train (``True``: a parameter with sparse gradients) or freeze them."""
        self.weight.requires_grad_(flag)

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        flat = rows.reshape(-1)  # [M]
        if self.weight.requires_grad and torch.is_grad_enabled():
            out = _RowGather.apply(self.weight, flat)
        else:
            out = self.weight.index_select(0, flat.clamp_min(0)) * (flat >= 0).unsqueeze(-1)
        return out.view(*rows.shape, self.layout.head_dim)  # [..., r]

    def fingerprint(self) -> str:
        return table_fingerprint(self.weight, self.spec, self.layout)

    def to_numpy(self) -> np.ndarray:
        return self.weight.detach().cpu().numpy().copy()


class AssetTable(MemoryTable):
    """Frozen rows read from a :class:`polymem.MemoryAsset` through its page service (a bounded RAM cache of
    stored chunks filled by background reads, :mod:`polymem.serve`), decoded in torch on the device of
    the request (:mod:`polymem.torch.pages`). The table never has to fit in memory.

    cache_mb: RAM for cached chunks, shared by every table reading the same opened asset. prefetch: reads
    start in :meth:`prefetch` (the model's forward pre-hook calls it) and overlap the blocks before the first
    site; False reads inside the first site's forward (synchronous). read_workers: reader threads for URLs
    (a local asset is read by one I/O thread).
    """

    def __init__(self, asset: Any, *, cache_mb: float = 256.0, prefetch: bool = True, read_workers: int = 4) -> None:
        super().__init__()
        from polymem.serve.service import service_for
        from polymem.torch.pages import PagedRows

        self.asset = asset
        self.spec, self.layout = asset.spec, asset.layout
        self.orders = tuple(int(o) for o in asset.orders)
        self.source = {"kind": "asset", "path": str(getattr(asset, "path", "")), "dtype": str(asset.dtype)}
        self._fp: str | None = None
        self.prefetch_enabled = bool(prefetch)
        self.service = service_for(asset, cache_mb=cache_mb, workers=read_workers)
        self.service.acquire()
        self._closed = False
        self._paged = PagedRows(asset, self.service)

    trainable = False

    def prefetch(self, rows: torch.Tensor) -> None:
        """Start reading (and decoding) the rows of the coming forward in the background (no-op without prefetch)."""
        if self.prefetch_enabled:
            self._reopen()
            self._paged.start(rows)

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        self._reopen()
        return self._paged.gather(rows)

    def stats(self) -> dict[str, Any]:
        """The page service's counters (:meth:`polymem.serve.service.PageService.stats`) and ``prefetch``."""
        return {**self.service.stats(), "prefetch": self.prefetch_enabled}

    def _reopen(self) -> None:
        if self._closed:
            self._closed = False
            self.service.acquire()

    def close(self) -> None:
        """Stop using the page service (the last table of an asset stops its workers and empties its cache)."""
        self._paged.forget()
        if not self._closed:
            self._closed = True
            self.service.release()

    def fingerprint(self) -> str:
        if self._fp is None:
            fp = getattr(self.asset, "fingerprint", None)
            self._fp = str(fp() if callable(fp) else fp) if fp else table_fingerprint(
                self.asset.to_numpy(), self.spec, self.layout)
        return self._fp

    def to_numpy(self) -> np.ndarray:
        return np.asarray(self.asset.to_numpy(), dtype=np.float32)


def random_like(table: np.ndarray | torch.Tensor, *, seed: int) -> torch.Tensor:
    """A random table of the same shape and row-norm distribution: Gaussian directions, scaled by the donor's
    row norms in a random order (zero rows stay as common as in the donor). The transfer control arm."""
    w = torch.as_tensor(np.asarray(table) if not isinstance(table, torch.Tensor) else table).float()
    g = torch.Generator().manual_seed(int(seed))
    norms = w.norm(dim=1)  # [R]
    norms = norms[torch.randperm(norms.numel(), generator=g)]
    d = torch.randn(w.shape, generator=g)
    return d / d.norm(dim=1, keepdim=True).clamp_min(1e-12) * norms.unsqueeze(1)


class SingleRowTable(TrainableTable):
    """The capacity-1 control (the ``null`` transfer arm): one trainable row of width r that every valid n-gram
    reads, whatever its hash — the same layout (so the same site) as a real table, and no n-gram content at all.
    If a table like this helps as much as a real one, the gain came from the extra projection, not from memory."""

    def __init__(self, *, spec: HashSpec, layout: Layout, orders: tuple[int, ...] = (1, 2, 3),
                 trainable: bool = True) -> None:
        MemoryTable.__init__(self)
        self.weight = nn.Parameter(torch.zeros(1, layout.head_dim), requires_grad=trainable)
        self.spec, self.layout, self.orders = spec, layout, tuple(orders)
        self.source = {"kind": "single-row"}

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        valid = (rows >= 0).unsqueeze(-1).to(self.weight.dtype)  # [..., 1]
        return self.weight[0] * valid  # [..., r]; a dense gradient of one row
