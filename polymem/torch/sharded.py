"""A memory table sharded by rows across the processes of a ``torch.distributed`` group: :class:`ShardedTable`.

Rank ``k`` of ``N`` holds the rows of whole shards of the table's asset (``N`` does not need to divide the rows;
:func:`polymem.asset._together.shard_pages` shrinks the shards where there are fewer than ranks), so each rank
writes the asset's shards of its own rows; it holds those rows and their optimizer state, nothing else of the
table. A lookup is two all-to-all exchanges: each rank sends the distinct rows its batch reads to their owners and receives their
vectors; in backward, each rank sends the gradient of those rows back to their owners, which hold it as the sparse
gradient of their own rows. The owners then apply polymem's row-wise rule (:class:`polymem.torch.optim.SparseRowRMS`)
to their rows alone: the update a row gets is the one a single process would give it (the gradient summed over
the whole global batch), up to the order of float additions.

Why not TorchRec's sharded embeddings: on a CPU their row-wise sharding runs only FBGEMM's fused kernels, whose
CPU optimizers (exact SGD, Adagrad, row-wise Adagrad, EMA-in-place) are not polymem's rule, and the mode that
hands the gradient back instead (``OptimType.NONE``) runs only on a GPU; a table trained with them would not be
the table ``polymem train`` trains. docs/scale-out.md has the measurements.

Every rank must call :meth:`ShardedTable.gather` (and backward) the same number of times with its own rows (an
empty batch is fine): the exchanges are collective.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from polymem.errors import PolymemError
from polymem.hash import HashSpec, Layout
from polymem.hash.idhash import IdHashSpec
from polymem.torch.tables import MemoryTable


def page_bounds(layout: Layout, world: int, unit: int = 1) -> list[int]:
    """Row boundaries of ``world`` ranks: rank k holds rows [b[k], b[k+1]), whole units of ``unit`` pages (an
    asset's shard: each rank then writes whole shards of its own), as even as units allow."""
    if not (isinstance(world, int) and world >= 1):
        raise PolymemError(f"world size {world!r} must be a whole number >= 1")
    pages, rpp = layout.pages, layout.rows_per_page
    units = -(-pages // unit)
    if world > units:
        raise PolymemError(f"a table of {pages:,} pages cannot be sharded over {world} processes (a rank holds whole "
                           f"shards of {unit} pages); use at most {units} processes or a larger table")
    return [min(pages, (units * k // world) * unit) * rpp for k in range(world + 1)]


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
    """all_to_all_single of ``x``'s rows: ``send[k]`` rows to rank k, ``recv[k]`` rows from rank k."""
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


class _ShardedGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight: torch.Tensor, flat: torch.Tensor, table: "ShardedTable") -> torch.Tensor:
        valid = flat >= 0
        uniq, inv = torch.unique(flat[valid], sorted=True, return_inverse=True)  # ascending: grouped by owner
        owner = torch.bucketize(uniq, table._inner.to(uniq.device), right=True)
        send = torch.bincount(owner, minlength=table.world).tolist()
        counts = torch.tensor(send, dtype=torch.long, device=flat.device)  # nccl exchanges device tensors only
        recv = _exchange(counts, [1] * table.world, [1] * table.world, table.group).tolist()
        asked = _exchange(uniq, send, recv, table.group) - table.lo  # [sum recv] my rows others read
        got = _exchange(weight.detach().index_select(0, asked), recv, send, table.group)  # [len(uniq), r]
        out = weight.new_zeros((flat.numel(), weight.shape[1]))
        out[valid] = got.index_select(0, inv)
        ctx.save_for_backward(valid, inv, asked)
        ctx.splits, ctx.n_uniq, ctx.shape, ctx.table = (send, recv), uniq.numel(), weight.shape, table
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        valid, inv, asked = ctx.saved_tensors
        send, recv = ctx.splits
        g = grad_out.new_zeros((ctx.n_uniq, grad_out.shape[1])).index_add_(0, inv, grad_out[valid])
        mine = _exchange(g.float(), send, recv, ctx.table.group)  # [sum recv, r]: gradients of my rows
        return torch.sparse_coo_tensor(asked.unsqueeze(0), mine, ctx.shape, check_invariants=False), None, None


class ShardedTable(MemoryTable):
    """This rank's rows of a table sharded across ``group`` (default: the world). ``weight`` holds only rows
    ``[lo, hi)``; :meth:`gather` takes global row ids, as every table does. ``local`` (float32 [hi - lo, r]) sets
    this rank's rows; None starts them at zero (the rows of a fresh table)."""

    def __init__(self, *, spec: HashSpec | IdHashSpec, layout: Layout, orders: tuple[int, ...] = (), local: Any = None,
                 trainable: bool = True, group: Any = None) -> None:
        from polymem.asset._together import shard_pages

        super().__init__()
        if not dist.is_initialized():
            raise PolymemError("a ShardedTable needs torch.distributed initialised (torchrun, or "
                               "torch.distributed.init_process_group); a single process uses TrainableTable")
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.chunks_per_shard, unit = shard_pages(layout, self.world)
        self.bounds = page_bounds(layout, self.world, unit)
        self.lo, self.hi = self.bounds[self.rank], self.bounds[self.rank + 1]
        self._inner = torch.tensor(self.bounds[1:-1], dtype=torch.long)
        self.spec, self.layout, self.orders = spec, layout, tuple(orders)
        self.source = {"kind": "sharded", "world": self.world}
        from polymem.torch.tables import check_table_memory

        check_table_memory(layout, trainable=trainable, copy=local is not None, rows=self.hi - self.lo)
        shape = (self.hi - self.lo, layout.head_dim)
        w = torch.zeros(shape) if local is None else torch.as_tensor(np.asarray(local, np.float32)).clone()
        if tuple(w.shape) != shape:
            raise PolymemError(f"rank {self.rank} holds rows [{self.lo:,}, {self.hi:,}) of width {layout.head_dim}: "
                               f"{shape}; the rows given are {tuple(w.shape)}")
        self.weight = nn.Parameter(w.contiguous(), requires_grad=trainable)

    @property
    def trainable(self) -> bool:
        return self.weight.requires_grad

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        flat = rows.reshape(-1).to(torch.long)
        if self.weight.requires_grad and torch.is_grad_enabled():
            out = _ShardedGather.apply(self.weight, flat, self)
        else:
            with torch.no_grad():
                out = _ShardedGather.apply(self.weight, flat, self)
        return out.view(*rows.shape, self.layout.head_dim)

    def to_numpy(self) -> np.ndarray:
        """The whole table, gathered from every rank (collective; for checks and small tables)."""
        return self._gather_rows(self.weight.detach().float())

    def _gather_rows(self, local: torch.Tensor, to: int | None = None) -> Any:
        """Every rank's [its rows, ...] tensor, concatenated in row order: on every rank, or only on rank ``to``
        (the others get None). Collective."""
        sizes = [self.bounds[k + 1] - self.bounds[k] for k in range(self.world)]
        mine = local.new_zeros((max(sizes), *local.shape[1:]))  # gloo gathers equal shapes: pad to the largest share
        mine[: self.hi - self.lo] = local
        parts: list[torch.Tensor] | None
        if to is None:
            parts = [torch.zeros_like(mine) for _ in range(self.world)]
            dist.all_gather(parts, mine, group=self.group)
        else:
            parts = [torch.zeros_like(mine) for _ in range(self.world)] if self.rank == to else None
            dist.gather(mine, parts, dst=to, group=self.group)
            if parts is None:
                return None
        return torch.cat([p[:n] for p, n in zip(parts, sizes)]).cpu().numpy()

    def rows_touched(self) -> int:
        """Rows with any non-zero entry, over every rank (collective)."""
        w = self.weight.detach()
        n = torch.tensor(sum(int((w[a:a + (1 << 20)] != 0).any(1).sum()) for a in range(0, w.shape[0], 1 << 20)),
                         device=w.device)
        dist.all_reduce(n, group=self.group)
        return int(n)

    _fp: str | None = None

    def fingerprint(self) -> str:
        """The whole table's fingerprint: read back from the asset :meth:`write_asset` wrote (one block of pages at
        a time), else gathered (collective)."""
        if self._fp is not None:
            return self._fp
        from polymem.torch.tables import table_fingerprint

        return table_fingerprint(self.to_numpy(), self.spec, self.layout)

    def write_asset(self, path: Any, *, provenance: dict[str, Any] | None = None, overwrite: bool = False,
                    row_counts: torch.Tensor | None = None, fingerprint: bool = True) -> Any:
        """Write the table as one asset, each rank writing the shards of its own rows (no rank ever holds another's
        rows; rank 0 writes the metadata and installs). ``row_counts``: this rank's rows' update counts.
        ``fingerprint``: read the written table back for :meth:`fingerprint` (process 0). Collective. Returns the
        opened asset."""
        from polymem.asset import MemoryAsset
        from polymem.asset._format import geometry
        from polymem.asset._together import write_together

        geom = geometry(self.layout, "float32", self.chunks_per_shard)
        rpp, lo_page = self.layout.rows_per_page, self.lo // self.layout.rows_per_page
        per = geom.chunks_per_shard * geom.pages_per_chunk
        mine = [s for s in range(geom.num_shards) if self.lo <= s * per * rpp < self.hi]
        w = self.weight.detach().float()

        def source(a: int, b: int) -> np.ndarray:
            part = w[(a - lo_page) * rpp:(b - lo_page) * rpp].cpu()  # a block at a time off a device
            return part.numpy().reshape(b - a, rpp, self.layout.head_dim)

        counts = None
        if row_counts is not None:  # 4 bytes a row (1/head_dim of the rows' bytes): gathered to rank 0 only
            local = row_counts.detach().to(self.weight.device, torch.int32)  # nccl gathers device tensors
            counts = lambda: self._gather_rows(local, to=0)  # noqa: E731
        comm = _Comm(self.group)
        asset = write_together(MemoryAsset, path, self.spec, self.layout, source, shards=mine,
                               chunks_per_shard=self.chunks_per_shard, comm=comm, orders=self.orders,
                               provenance=provenance, overwrite=overwrite, row_counts=counts)
        if fingerprint:
            self._fp = comm.broadcast(_stream_fingerprint(asset, self.spec, self.layout) if self.rank == 0 else None)
        return asset

    def local_bytes(self) -> int:
        """Bytes this rank holds for its rows (weights)."""
        return self.weight.numel() * self.weight.element_size()


def all_reduce_grads(params: list) -> None:
    """Sum the gradients of ``params`` over the world. Every process has the same model and batch shapes, so the
    same parameters have a gradient everywhere (one without stays without, as it would in one process)."""
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)


def init_from_env(device: str = "auto") -> bool:
    """Join the torch.distributed group torchrun describes (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR`` … in the
    environment): gloo on a CPU, nccl on CUDA. False (nothing done) when not started by torchrun."""
    import os

    if "WORLD_SIZE" not in os.environ:
        return False
    if not dist.is_available():
        raise PolymemError("WORLD_SIZE is set (started by torchrun) but this torch has no torch.distributed; install "
                           "a build that has it: pip install torch==2.13.0 (the wheels from pytorch.org have it)")
    if dist.is_initialized():
        return True
    for k in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if k not in os.environ:
            raise PolymemError(f"WORLD_SIZE is set but {k} is not: start the processes with torchrun "
                               "(torchrun --nproc-per-node N -m polymem train …), which sets both")
    from polymem.torch.device import resolve_device

    cuda = resolve_device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # torchrun --max-restarts starts the processes again against the same store (its static rendezvous keeps
    # one), where the killed group's addresses still stand: each attempt gets keys of its own, or a restarted
    # process connects to a dead one's port ("Gloo connectFullMesh failed ... Connection refused").
    store, rank, world = next(dist.rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.PrefixStore(f"polymem-attempt-{attempt}", store),
                            rank=rank, world_size=world)
    return True


def check_same_everywhere(what: dict[str, Any]) -> None:
    """Stop every process with one line when the processes were given different runs (corpora, table sizes,
    settings): ``what`` maps a name to a JSON-able value that must be equal on every rank."""
    import json

    mine = json.dumps(what, sort_keys=True, default=str)
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, mine)
    if all(g == mine for g in got):
        return
    first = json.loads(got[0])
    for k, v in enumerate(got):
        other = json.loads(v)
        diff = [name for name in first if first[name] != other.get(name)]
        if diff:
            name = diff[0]
            raise PolymemError(f"the processes were started with different runs: rank 0 has {name} = {first[name]!r}, "
                               f"rank {k} has {other.get(name)!r}; start every process with the same flags and files")


class _Comm:
    """The few objects :func:`polymem.asset._together.write_together` exchanges, over torch.distributed."""

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(out, obj, group=self.group)
        return out


def finish(*, exit_process: bool = False) -> None:
    """Leave the torch.distributed group together (a barrier first: a process that tears its connections down
    while another still uses them aborts it). ``exit_process``: then end this process at once (exit status 0,
    output flushed), the last step of a command: gloo's transport threads can still abort a process while the
    interpreter tears down ("terminate called without an active exception", SIGABRT, seen about once in ten
    two-process test runs here after everything was written), which torchrun reports as a failed run."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        if exit_process:
            import os
            import sys

            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


def _stream_fingerprint(asset: Any, spec: Any, layout: Layout, block: int = 4096) -> str:
    """:func:`polymem.torch.tables.table_fingerprint` of an asset's rows, read ``block`` pages at a time."""
    import hashlib
    import json

    h = hashlib.sha256()
    h.update(json.dumps({"spec": spec.to_dict(), "layout": layout.to_dict()}, sort_keys=True).encode())
    for a in range(0, layout.pages, block):
        pages = np.asarray(asset.read_pages(np.arange(a, min(layout.pages, a + block))), dtype=np.float32)
        h.update(np.ascontiguousarray(pages).tobytes())
    return h.hexdigest()[:32]
