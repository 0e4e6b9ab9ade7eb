"""``attach``: hook memory sites into a Hugging Face (or any) causal LM.

``attach(model, table_or_asset, tokenizer, layers=[1], train="projection")`` registers forward pre-hooks: one on
the model (captures ``input_ids``, keeps the last N−1 ids of each row for incremental decoding with a KV cache)
and one per chosen block (adds the site's output to the block's input hidden states). It returns an
:class:`AttachHandle` (``detach``, ``trainable_parameters``, ``save``; :func:`load_attached` is the inverse)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn

from polymem.errors import FormatError, PolymemError, SpecMismatchError
from polymem.hash.layout import LAYOUT_KINDS, Layout
from polymem.hash.spec import HashSpec
from polymem.torch._grads import hold_grads, release_grads
from polymem.torch.hash import TorchTokenHashes
from polymem.torch.modelinfo import check_vocab, find_blocks, hidden_size
from polymem.torch.site import MemorySite, SiteConfig
from polymem.torch.sitefile import find_table, read_site, save_site, site_header
from polymem.torch.tables import AssetTable, MemoryTable, TrainableTable

TRAIN_MODES = ("projection", "table", "all")


@dataclass
class AttachReport:
    """What attach matched (module name, d_model) and what it could not (name, reason)."""

    matched: list[dict[str, Any]] = field(default_factory=list)
    unmatched: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"matched   {m['module']} (layer {m['layer']}, d_model {m['d_model']})" for m in self.matched]
        lines += [f"UNMATCHED {u['requested']!r}: {u['reason']}" for u in self.unmatched]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def _resolve_table(table_or_asset: Any, spec: HashSpec | None, in_memory: bool, trainable: bool,
                   serving: dict[str, Any] | None = None) -> MemoryTable:
    if isinstance(table_or_asset, MemoryTable):
        return table_or_asset
    if isinstance(table_or_asset, Layout):
        return TrainableTable(None, spec=spec or HashSpec(), layout=table_or_asset, trainable=trainable)
    asset = table_or_asset
    if isinstance(asset, (str, os.PathLike)):
        from polymem.torch.tablefile import open_table

        asset = open_table(asset)
    if not all(hasattr(asset, a) for a in ("spec", "layout", "orders", "read_pages", "to_numpy")):
        raise PolymemError(
            f"table_or_asset is a {type(table_or_asset).__name__}; accepted: a MemoryAsset or its path, a "
            "MemoryTable (e.g. TrainableTable), or a Layout (fresh all-zero trainable table)"
        )
    if type(asset.spec).__name__ != "IdHashSpec":
        _check_usable(asset.spec, asset.layout, where=str(getattr(asset, "path", "asset")))
    if in_memory or trainable:
        source = {"kind": "asset", "path": str(getattr(asset, "path", "")), "dtype": str(getattr(asset, "dtype", ""))}
        t: MemoryTable = TrainableTable(asset.to_numpy(), spec=asset.spec, layout=asset.layout,
                                        orders=tuple(asset.orders), trainable=trainable, source=source)
    else:
        t = AssetTable(asset, **(serving or {}))
    t._counts_source = asset  # read only by a gate="count" site (:func:`_load_counts`)
    return t


def _load_counts(table: MemoryTable, report: AttachReport) -> None:
    """A gate="count" site reads the rows' training counts: the table's own, else its asset's ``counts`` array;
    a table without any reads every row as fully known (the context gate), and the report says so."""
    if table.counts is not None:
        return
    src = getattr(table, "_counts_source", None)
    got = src.row_counts() if src is not None and callable(getattr(src, "row_counts", None)) else None
    if got is None:
        report.notes.append("gate='count' but the table records no per-row training counts: every row counts as "
                            "known, so the gate acts as gate='context' (tables trained by polymem record counts)")
        return
    table.set_counts(got)


def _check_usable(spec: Any, layout: Any, *, where: str) -> None:
    if not isinstance(spec, HashSpec):
        raise SpecMismatchError(
            f"{where}: hash spec {type(spec).__name__} cannot be used by a memory site; sites hash token bytes with "
            "the byte-level polynomial HashSpec (an XOR/token-id hash is tied to one tokenizer). Retrain the table "
            "with HashSpec()"
        )
    if not isinstance(layout, Layout) or layout.kind not in LAYOUT_KINDS:
        raise SpecMismatchError(f"{where}: layout {layout!r} is not usable; accepted kinds: {', '.join(LAYOUT_KINDS)}")


def _token_cache(tokenizer: Any, spec: HashSpec):
    from polymem.hash.token_hashes import TokenHashes

    if isinstance(tokenizer, TokenHashes):
        if tokenizer.spec != spec:
            raise SpecMismatchError(
                f"the token cache was built with hash spec {tokenizer.spec.to_dict().get('base')} / normalizer "
                f"{tokenizer.spec.normalizer!r}, the table with {spec.to_dict().get('base')} / {spec.normalizer!r}; "
                "rebuild the cache with the table's spec: TokenHashes.build(tokenizer, table.spec)"
            )
        return tokenizer
    return TokenHashes.build(tokenizer, spec)


class AttachHandle:
    """The result of :func:`attach`: hooks, sites, the table and the report. Use as a context manager to detach."""

    freeze_model: bool = True  # whether the model's own weights are held frozen (set by attach)
    byte_reader: Any = None  # next bytes over the same rows (polymem.torch.bytesite.SiteBytes), saved with the site

    def __init__(self, model, table, sites, names, cache, tokenizer_info, train, report, block_path) -> None:
        self.model, self.table, self.sites, self.layer_names = model, table, sites, names
        self.cache, self.tokenizer_info, self.train, self.report = cache, tokenizer_info, train, report
        self.block_path = block_path
        self.enabled = True
        self.max_n = next(iter(sites.values())).cfg.max_n
        self._hooks: list[Any] = []
        self._rows: torch.Tensor | None = None  # rows of the forward in progress [B, T, N, K]
        self._history: torch.Tensor | None = None  # last max_n-1 ids of each row [B, <=N-1]
        self._pending_rows: torch.Tensor | None = None

    # -- hooks
    def _model_pre_hook(self, module, args, kwargs):
        if not self.enabled:
            return None
        if self._pending_rows is not None:
            self._rows, self._pending_rows = self._pending_rows, None
            self._prefetch(self._rows)
            return None
        ids = kwargs.get("input_ids")
        if ids is None and args and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point():
            ids = args[0]
        if ids is None:
            raise PolymemError(
                f"{type(module).__name__} was called without input_ids (inputs_embeds?); memory sites hash token "
                "ids, so call the model with input_ids, or use handle.set_rows(rows) before the call"
            )
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = 0
        if cache is not None and hasattr(cache, "get_seq_length"):
            past = int(cache.get_seq_length())
        if self.cache.C.device != ids.device:
            self.to(ids.device)
        T = ids.shape[-1]
        if past > 0 and self._history is not None and self._history.shape[0] == ids.shape[0]:
            full = torch.cat([self._history, ids], dim=1)  # [B, h + T]
        else:
            full = ids
        rows = self.cache.ngram_rows(full, self.table.layout, self.max_n)[:, -T:]  # [B, T, N, K]
        self._history = full[:, -(self.max_n - 1):] if self.max_n > 1 else None
        self._rows = rows
        self._prefetch(rows)
        return None

    def _prefetch(self, rows: torch.Tensor) -> None:
        pf = getattr(self.table, "prefetch", None)
        if pf is not None:  # an asset-backed table starts reading the rows' pages now, before block 0
            pf(rows)

    def _model_post_hook(self, module, args, output):
        # rows stay until the next forward: activation checkpointing re-runs blocks during backward
        return None

    def _block_hook(self, name: str):
        key = name.replace(".", "/")

        def hook(module, args, kwargs):
            if not self.enabled:
                return None
            site = self.sites[key]  # looked up now: a site may be replaced (polymem.torch.stitch)
            if self._rows is None:
                raise PolymemError(f"block {name} ran outside a forward of the attached model; call the model itself")
            h = args[0] if args else kwargs["hidden_states"]
            if tuple(h.shape[:2]) != tuple(self._rows.shape[:2]):
                raise PolymemError(
                    f"block {name} received hidden states for {tuple(h.shape[:2])} (batch, positions) but the model "
                    f"was called with ids of shape {tuple(self._rows.shape[:2])}; call the attached model itself"
                )
            if h.shape[-1] != site.cfg.d_model:
                raise PolymemError(
                    f"block {name} received hidden states of width {h.shape[-1]}, the site was built for "
                    f"{site.cfg.d_model}; attach to blocks whose input is the residual stream"
                )
            e = self.table.gather(self._rows)  # [B, T, N, K, r]
            c = self.table.gather_counts(self._rows) if site.cfg.gate == "count" else None
            out = site(h, e, c)
            if args:
                return (out, *args[1:]), kwargs
            kwargs = dict(kwargs)
            kwargs["hidden_states"] = out
            return args, kwargs

        return hook

    def _install(self) -> None:
        self._hooks.append(self.model.register_forward_pre_hook(self._model_pre_hook, with_kwargs=True))
        self._hooks.append(self.model.register_forward_hook(self._model_post_hook))
        for name in self.layer_names:
            block = self.model.get_submodule(name)
            self._hooks.append(block.register_forward_pre_hook(self._block_hook(name), with_kwargs=True))

    # -- public
    def set_rows(self, rows: torch.Tensor) -> None:
        """Use precomputed rows ([B, T, N, K], e.g. hashed in a data loader) for the next forward."""
        self._pending_rows = rows

    def reset(self) -> None:
        """Forget the incremental-decoding history (a new sequence starts)."""
        self._history = None

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Memory switched off inside the block (the model runs as if nothing were attached)."""
        prev, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = prev

    def to(self, device) -> "AttachHandle":
        """Move the sites, the token hashes and an in-memory table to ``device``; returns the handle."""
        self.cache = self.cache.to(device)
        self.sites.to(device)
        from polymem.torch.sharded import ShardedTable

        if isinstance(self.table, (TrainableTable, ShardedTable)):
            self.table.to(device)
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What trains under ``train=``: the sites' parameters, the table's rows (``table``/``all``) and, unless the model is frozen, the model's own."""
        ps = [p for p in self.sites.parameters() if p.requires_grad]
        if self.train in ("table", "all") and self.table.trainable:
            ps.append(self.table.weight)
        if not getattr(self, "freeze_model", True):
            ps += [p for p in self.model.parameters() if p.requires_grad]
        return ps

    def table_parameters(self) -> list[nn.Parameter]:
        """The table's rows as a parameter list (for a row-wise optimizer such as SparseRowRMS); empty when frozen."""
        return [self.table.weight] if self.table.trainable else []

    def stats(self) -> dict[str, Any]:
        """Page-service counters of an asset-backed table (``in_memory=False``): hits, misses, joined, reads,
        bytes_read, wait_s, cache_bytes, cache_peak_bytes, capacity_bytes, … ({} for in-memory tables)."""
        fn = getattr(self.table, "stats", None)
        return fn() if fn is not None else {}

    def swap_table(self, table_or_asset: Any, *, in_memory: bool = True) -> MemoryTable:
        """Read the sites' rows from another copy of their table (e.g. quantized): same spec and layout, checked;
        not the fingerprint (a quantized copy has its own). Returns the old table."""
        new = _resolve_table(table_or_asset, self.table.spec, in_memory, trainable=False)
        if new.spec != self.table.spec or new.layout != self.table.layout:
            raise SpecMismatchError(f"the new table's layout {new.layout.to_dict()} or hash spec is not the sites' "
                                    f"({self.table.layout.to_dict()}); pass a copy of the same table")
        if any(s.cfg.gate == "count" for s in self.sites.values()):
            _load_counts(new, self.report)
        old, self.table, self._rows = self.table, new, None
        return old

    def detach(self) -> None:
        """Remove every hook and restore the model's requires_grad flags; the model is as before attach.
        An asset-backed table stops using its page service (its reader threads stop when no table uses it)."""
        close = getattr(self.table, "close", None)
        if close is not None:
            close()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self.byte_reader is not None:
            self.byte_reader.remove()
        release_grads(self.model, self)
        self._rows = self._history = None

    def __enter__(self) -> "AttachHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    def header(self) -> dict[str, Any]:
        """What ``site.json`` records: the sites' config, the layers, the tokenizer and the table's fingerprint."""
        return site_header(self)

    def save(self, path: str | os.PathLike[str], *, bundle: bool = False) -> Path:
        """Write ``site.safetensors`` (site weights; the table too when it was trained) and ``site.json``,
        which names the table by fingerprint and path (:mod:`polymem.torch.sitefile`). ``bundle=True`` writes one
        folder that also holds a frozen table and a README card (:func:`polymem.torch.bundle.bundle_site`)."""
        if not bundle:
            return save_site(self, path)
        from polymem.torch.bundle import save_bundle

        return save_bundle(self, path)

    save_pretrained = save  # the PEFT adapter's name for it

    @classmethod
    def from_pretrained(cls, model: nn.Module, path: str | os.PathLike[str], table_or_asset: Any = None,
                        tokenizer: Any = None, **kw: Any) -> "AttachHandle":
        """:func:`load_attached` under the PEFT adapter's name: the saved site re-attached to ``model``."""
        return load_attached(model, path, table_or_asset, tokenizer, **kw)

    def parameter_counts(self) -> dict[str, int]:
        """Trainable and total parameters of the sites, and the table's rows × width (trainable or not)."""
        site = list(self.sites.parameters())
        tw = getattr(self.table, "weight", None)
        table = int(tw.numel()) if isinstance(tw, torch.Tensor) else int(self.table.layout.num_rows * self.table.layout.head_dim)
        return {"site_trainable": sum(p.numel() for p in site if p.requires_grad), "site_total": sum(p.numel() for p in site),
                "table": table, "table_trainable": table if self.table.trainable else 0}

    def __repr__(self) -> str:
        c = self.parameter_counts()
        cfg = next(iter(self.sites.values())).cfg
        return (f"AttachHandle({type(self.model).__name__}, sites before {', '.join(self.layer_names)}, gate={cfg.gate}, "
                f"orders 1..{cfg.max_n}, train={self.train!r}; trainable params: {c['site_trainable'] + c['table_trainable']:,} "
                f"(site {c['site_trainable']:,}, table {c['table_trainable']:,}); table {self.table.layout.num_rows:,} rows × "
                f"{self.table.layout.head_dim}, tokenizer {self.tokenizer_info['name']})")


def attach(
    model: nn.Module,
    table_or_asset: Any,
    tokenizer: Any,
    layers: Sequence[int | str] = (1,),
    train: str = "projection",
    *,
    max_n: int | None = None,
    gate: str = "scalar",
    gate_init: float = 0.5,
    conv: bool = False,
    spec: HashSpec | None = None,
    in_memory: bool = True,
    cache_mb: float = 256.0,
    prefetch: bool = True,
    read_workers: int = 4,
    init_seed: int = 0,
    strict: bool = True,
    freeze_model: bool | None = None,
    value_init: str | None = None,
    allow_vocab_padding: bool = False,
) -> AttachHandle:
    """Attach a hashed n-gram memory to ``model`` before each block in ``layers``.

    table_or_asset: a :class:`polymem.MemoryAsset` (or its path), a :class:`~polymem.torch.tables.MemoryTable`,
    or a :class:`polymem.Layout` (a fresh all-zero fp32 table with ``spec`` or the default HashSpec).
    tokenizer: anything :func:`polymem.load_tokenizer` accepts, or a TokenHashes built with the table's spec.
    layers: block indices or module names. train: "projection" (table frozen, model frozen; sites train),
    "table" (table and sites train, model frozen) or "all"; freeze_model=False keeps the model's own weights
    trainable whatever ``train`` says (a recipient trained from scratch next to a frozen donor table).
    max_n: orders 1..max_n read (default: the table's largest order). in_memory=False serves a frozen asset page by page instead of loading it (tables bigger
    than memory): the rows of each forward are read through a RAM page cache of ``cache_mb`` MiB (shared by
    every table on the same opened asset), started from the model's pre-hook before block 0 when ``prefetch``
    (else inside the first site): chunks in the OS page cache are read there, the others by one I/O thread
    (local assets) or ``read_workers`` threads (URLs), and decoded (NF4 too) in torch on the
    model's device; results are bit-identical to in_memory=True. ``handle.stats()`` has the cache counters.
    strict=False skips layers that cannot be matched (they are listed in ``handle.report``).
    The tokenizer must be the model's: a tokenizer with more ids than the model's vocabulary, or with far fewer
    (more than :func:`polymem.torch.modelinfo.vocab_padding_limit` padding ids) is refused up front;
    allow_vocab_padding=True accepts a model whose embedding really is padded further. Several handles may be stacked on one model and detached in
    any order: the model's requires_grad flags come back once no live handle freezes it.
    """
    if train not in TRAIN_MODES:
        raise PolymemError(f"train={train!r} is unknown; accepted: {', '.join(TRAIN_MODES)}")
    table, cache, id_bound = _build_table(
        model, table_or_asset, tokenizer, train, spec=spec, in_memory=in_memory,
        serving={"cache_mb": cache_mb, "prefetch": prefetch, "read_workers": read_workers},
        allow_vocab_padding=allow_vocab_padding)
    d = hidden_size(model)
    report = AttachReport()
    path, names = _resolve_sites(model, layers, strict, report)
    n = max_n if max_n is not None else max(table.orders)
    if value_init is None:
        value_init = "orthogonal" if table.trainable else "zero"
    cfg = SiteConfig(d_model=d, max_n=n, gate=gate, gate_init=gate_init, conv=conv, init_seed=init_seed,
                     value_init=value_init)
    sites = _build_sites(names, cfg, table.layout, report)
    if gate == "count":
        _load_counts(table, report)
    rows = _device_rows(model, cache, table, id_bound, allow_vocab_padding, report)
    _report_notes(report, table, cache, n, value_init)
    return _hook(model, table, sites, names, rows, cache, train, report, path, freeze_model)


def _build_table(model: nn.Module, table_or_asset: Any, tokenizer: Any, train: str, *, spec: HashSpec | None,
                 in_memory: bool, serving: dict[str, Any], allow_vocab_padding: bool) -> tuple[MemoryTable, Any, bool]:
    """(table, token cache, whether the table is token-id bound): the tokenizer loaded and checked against the
    model's vocabulary before the table is read, then the table, its training mode and the cache checked."""
    from polymem.hash.idhash import IdHashSpec
    from polymem.hash.token_hashes import TokenHashes
    from polymem.tokenizers import load_tokenizer

    if not isinstance(tokenizer, TokenHashes):
        tokenizer = load_tokenizer(tokenizer)  # loaded once, checked before the table is read
    tok_name = tokenizer.tokenizer_name if isinstance(tokenizer, TokenHashes) else tokenizer.name
    check_vocab(model, tok_name, int(tokenizer.vocab_size), allow_vocab_padding)
    table = _resolve_table(table_or_asset, spec, in_memory, trainable=train in ("table", "all"), serving=serving)
    id_bound = isinstance(table.spec, IdHashSpec)  # a token-id (Engram XOR) table asset: polymem.torch.idrows
    if not id_bound:
        _check_usable(table.spec, table.layout, where="table")
    if isinstance(table, TrainableTable):
        table.set_trainable(train in ("table", "all"))
    elif getattr(table, "weight", None) is not None and isinstance(table.weight, nn.Parameter):  # e.g. ShardedTable
        table.weight.requires_grad_(train in ("table", "all"))
    elif train != "projection":
        raise PolymemError(f"train={train!r} needs the table in memory; an asset read page by page is frozen (in_memory=True)")
    tspec = table.spec
    cache = _token_cache(tokenizer, HashSpec() if isinstance(tspec, IdHashSpec) else tspec)
    if isinstance(tspec, IdHashSpec) and cache.fingerprint != tspec.tokenizer["fingerprint"]:
        raise SpecMismatchError(
            f"the table is tokenizer-bound to {tspec.tokenizer['name']!r} (fingerprint "
            f"{tspec.tokenizer['fingerprint'][:16]}…), the model's tokenizer {cache.tokenizer_name!r} has "
            f"{cache.fingerprint[:16]}…: token-id rows mean nothing under another tokenizer; re-address the table by "
            "bytes with `polymem convert`"
        )
    return table, cache, id_bound


def _resolve_sites(model: nn.Module, layers: Sequence[int | str], strict: bool, report: AttachReport
                   ) -> tuple[str, list[str]]:
    """(where the blocks live, the module name of each requested layer); a layer that matches nothing goes to
    ``report.unmatched`` and is refused when ``strict``."""
    path, blocks = find_blocks(model)
    names: list[str] = []
    for req in layers:
        if isinstance(req, (int, np.integer)) and not isinstance(req, bool):
            i = int(req)
            if -len(blocks) <= i < len(blocks):
                names.append(f"{path}.{i % len(blocks)}")
                continue
            report.unmatched.append({"requested": req, "reason": f"block index out of range: {path} has {len(blocks)} blocks (0..{len(blocks) - 1})"})
            continue
        try:
            model.get_submodule(str(req))
            names.append(str(req))
        except AttributeError:
            report.unmatched.append({"requested": req, "reason": f"no module named {req!r}; blocks are {path}.0..{len(blocks) - 1}"})
    if report.unmatched and strict:
        raise PolymemError("attach could not match every layer:\n" + str(report))
    if not names:
        raise PolymemError(f"attach matched no layer of {type(model).__name__} (requested {list(layers)}):\n{report}")
    if len(set(names)) != len(names):
        raise PolymemError(f"layers {list(layers)} name the same block twice")
    return path, names


def _build_sites(names: list[str], cfg: SiteConfig, layout: Layout, report: AttachReport) -> nn.ModuleDict:
    """One site per block, initialised from ``cfg.init_seed`` + its position."""
    sites = nn.ModuleDict()
    for j, name in enumerate(names):
        sites[name.replace(".", "/")] = MemorySite(
            SiteConfig(**{**asdict(cfg), "init_seed": cfg.init_seed + j}), layout)
        report.matched.append({"layer": name.rsplit(".", 1)[-1], "module": name, "d_model": cfg.d_model})
    return sites


def _device_rows(model: nn.Module, cache: Any, table: MemoryTable, id_bound: bool, allow_vocab_padding: bool,
                 report: AttachReport) -> Any:
    """The token cache as tensors (byte-hash or token-id rows); ids beyond the tokenizer's vocabulary (padded
    embeddings) are invalid."""
    tc = TorchTokenHashes.from_cache(cache)
    V = tc.C.numel()
    vocab = check_vocab(model, cache.tokenizer_name, V, allow_vocab_padding)
    if id_bound:
        from polymem.hash.idhash import IdHashSpec
        from polymem.torch.idrows import TorchIdRows

        spec = table.spec
        assert isinstance(spec, IdHashSpec)  # (id_bound says so)
        return TorchIdRows.build(spec, cache.special, vocab)  # ids >= V are treated as special
    if vocab is not None and vocab != V:  # vocab > V: padding, checked above
        report.notes.append(f"model vocab_size {vocab} > tokenizer vocab size {V}: the {vocab - V:,} ids "
                            f"({V}..{vocab - 1}) never hit memory")
        if vocab > V:
            pad = vocab - V
            tc = TorchTokenHashes(
                C=torch.cat([tc.C, torch.zeros(pad, dtype=torch.int64)]),
                P=torch.cat([tc.P, torch.ones(pad, dtype=torch.int64)]),
                special=torch.cat([tc.special, torch.ones(pad, dtype=torch.bool)]),
            )
    return tc


def _report_notes(report: AttachReport, table: MemoryTable, cache: Any, n: int, value_init: str) -> None:
    """What the user should know about the result: orders the table lacks, a lossy tokenizer, a zero projection."""
    if not set(range(1, n + 1)) & set(table.orders):
        report.notes.append(f"the table was trained with orders {list(table.orders)}, the site reads 1..{n}")
    if getattr(cache, "lossy", False):
        report.notes.append(f"tokenizer {cache.tokenizer_name!r} is not byte-faithful: few n-grams will match")
    if value_init == "zero":
        report.notes.append("the projection starts at zero, so the model computes exactly what it did without memory "
                            "until the site trains (handle.trainable_parameters()); whether the table then helps is "
                            "measured, e.g. `polymem transfer --model` or `polymem eval --site` (docs/real-models.md)")


def _hook(model: nn.Module, table: MemoryTable, sites: nn.ModuleDict, names: list[str], rows: Any, cache: Any,
          train: str, report: AttachReport, path: str, freeze_model: bool | None) -> AttachHandle:
    """The handle on the model's device, the model's gradients held as ``train``/``freeze_model`` say, hooks in."""
    try:
        dev = next(model.parameters()).device
    except StopIteration:
        dev = torch.device("cpu")
    handle = AttachHandle(
        model, table, sites, names, rows, {"name": cache.tokenizer_name, "fingerprint": cache.fingerprint}, train,
        report, path,
    )
    handle.to(dev)
    freeze = (train != "all") if freeze_model is None else bool(freeze_model)
    handle.freeze_model = freeze
    hold_grads(model, handle, freeze)
    handle._install()
    return handle


def load_attached(
    model: nn.Module, path: str | os.PathLike[str], table_or_asset: Any = None, tokenizer: Any = None, **kw: Any
) -> AttachHandle:
    """Re-attach what :meth:`AttachHandle.save` wrote. ``table_or_asset`` is needed when the table was frozen
    (it is named by fingerprint, not stored); a table with another fingerprint, spec or layout is refused."""
    header, tensors = read_site(path)
    d = Path(path)
    th = header["table"]
    spec, layout = HashSpec.from_dict(th["hash_spec"]), Layout.from_dict(th["layout"])
    if "table" in tensors:
        table: Any = TrainableTable(tensors.pop("table"), spec=spec, layout=layout, orders=tuple(th["orders"]))
    else:
        if table_or_asset is None:  # the path site.json records (relative to the site), or a table in or beside it
            table_or_asset = find_table(d, header, fix="pass that asset as table_or_asset")
        table = _resolve_table(table_or_asset, spec, kw.get("in_memory", True), False, kw.get("serving"))
        _check_usable(table.spec, table.layout, where="table")
        if table.spec != spec or table.layout != layout:
            raise SpecMismatchError(
                f"the saved site expects layout {layout.to_dict()} and hash base {th['hash_spec'].get('base')}, the "
                f"given table has layout {table.layout.to_dict()} and base {table.spec.to_dict().get('base')}; pass "
                f"the asset the site was trained with (fingerprint {th['fingerprint']})"
            )
        if table.fingerprint() != th["fingerprint"]:
            raise SpecMismatchError(
                f"the given table has fingerprint {table.fingerprint()}, the saved site was trained with "
                f"{th['fingerprint']} ({th['source']}); pass that asset"
            )
    site = header["site"]
    tok = tokenizer if tokenizer is not None else header["tokenizer"]["name"]
    handle = attach(
        model, table, tok, layers=header["layers"], train=header["train"], max_n=site["max_n"], gate=site["gate"],
        gate_init=site["gate_init"], conv=site["conv"], init_seed=site["init_seed"],
        freeze_model=header.get("freeze_model"), value_init=site.get("value_init", "orthogonal"),
    )
    if handle.tokenizer_info["fingerprint"] != header["tokenizer"]["fingerprint"]:
        handle.detach()
        raise SpecMismatchError(
            f"tokenizer fingerprint {handle.tokenizer_info['fingerprint']} ({handle.tokenizer_info['name']}) differs "
            f"from the saved site's {header['tokenizer']['fingerprint']} ({header['tokenizer']['name']}); pass that tokenizer"
        )
    sd = {k[len("sites."):]: v for k, v in tensors.items() if k.startswith("sites.")}
    try:
        handle.sites.load_state_dict(sd)
    except RuntimeError as e:
        handle.detach()
        raise FormatError(f"{str(d / 'site.safetensors')!r} does not hold the weights site.json describes "
                          f"({str(e).splitlines()[0][:160]}); the site was edited or is damaged: save it again") from None
    md = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    if md:
        model.load_state_dict(md)
    if header.get("next_bytes") is not None:  # the byte reader polymem attach trained with the site
        from polymem.torch.bytesite import RECORD, read_next_bytes

        try:
            read_next_bytes(handle, model, tok, d, header[RECORD])
        except BaseException:
            handle.detach()
            raise
    return handle
