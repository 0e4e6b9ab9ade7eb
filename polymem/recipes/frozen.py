"""Training a memory table (and its site) on a frozen pretrained backbone.

The recipe: one site before block ``layers`` (default 2), a fresh all-zero table of ``params`` scalars in the
page-local layout, rows updated sparsely by the row-wise RMS rule (:class:`polymem.torch.SparseRowRMS`,
``table_lr``), the site's projection and gate by AdamW (``site_lr``), warmup-stable-decay schedule, gradient
clipping on the site. Every weight of the model stays frozen. Nothing is computed for gradients that are not
needed: the layers below the first site see no tensor that requires grad, so autograd records nothing there,
and the layers above it keep only what the backward to the site needs (no weight gradients).

Data: documents split train / held-out (every ``heldout_every``-th held out, as ``polymem train``); the
training documents are joined into one stream with the model's EOS id between them; a training window is
``[BOS] + stream[s : s + T - 1]`` predicting ``stream[s : s + T]`` (without a BOS: ``stream[s : s + T]``
predicting the next tokens), ``s`` drawn from ``numpy.random.default_rng(seed)`` — the data order is a
function of the seed only, the same for every arm of a transfer run.

The training loss (``softmax="corpus"``, the default) is the cross-entropy over the ids that occur in the
training stream, not the whole vocabulary: the output layer is cut to those rows for the forward and backward
of training (:func:`restricted_head`). Every target is in that set; what changes is the normaliser, which leaves
out ids the corpus never uses. On Gemma 3 (262,144 ids, ~30k of them in pydocs) the full output layer is two
thirds of a training step on a CPU. ``softmax="full"`` trains on the exact loss. Scoring is always exact.

Not here: loading the model (:mod:`polymem.models.registry`), scoring (:mod:`polymem.models.evaluate`), arms and
controls (:mod:`polymem.recipes.pretrained`), the CLI (``polymem train --model``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from polymem.errors import PolymemError


SOFTMAX = ("corpus", "full")


@dataclass(frozen=True, kw_only=True)
class FrozenTrainConfig:
    steps: int = 80
    batch_size: int = 4  # windows per step
    block_size: int = 256  # predicted tokens per window
    layers: tuple[int, ...] = (2,)  # a site before each of these blocks
    max_n: int = 3  # n-gram orders 1..max_n
    params: int = 20_000_000  # table scalars (rows × head_dim)
    heads: int = 8
    slots: int = 4
    head_dim: int = 32
    gate: str = "scalar"
    table_lr: float = 0.14  # SparseRowRMS on the table rows
    site_lr: float = 1e-3  # AdamW on the projection and gate
    warmup_frac: float = 0.05
    decay_frac: float = 0.2
    grad_clip: float = 1.0
    seed: int = 0  # data order (and the site's init: 1000 + seed)
    softmax: str = "corpus"  # training loss over the ids of the training stream ("corpus") or the whole vocabulary


    def __post_init__(self) -> None:
        for k in ("steps", "batch_size", "block_size", "max_n", "params", "heads", "slots", "head_dim"):
            if int(getattr(self, k)) < 1:
                raise PolymemError(f"{k}={getattr(self, k)} must be >= 1")
        if self.block_size < 2:
            raise PolymemError(f"block_size={self.block_size} must be >= 2 tokens")
        if self.softmax not in SOFTMAX:
            raise PolymemError(f"softmax={self.softmax!r} is unknown; accepted: {', '.join(SOFTMAX)}")
        if self.table_lr <= 0 or self.site_lr <= 0:
            raise PolymemError(f"learning rates must be > 0 (table_lr={self.table_lr}, site_lr={self.site_lr})")

    def layout(self):
        from polymem.hash.layout import Layout

        return Layout.for_params(self.params, heads=self.heads, slots=self.slots, head_dim=self.head_dim)

    def lr_factor(self, step: int) -> float:
        from polymem.recipes.train import wsd_factor

        return wsd_factor(step, self.steps, self.warmup_frac, self.decay_frac)

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.block_size


@dataclass
class Stream:
    """Documents of one corpus tokenized by one model: the training stream and the held-out texts."""

    train: np.ndarray  # int64, documents joined by EOS
    train_texts: list[str]
    heldout_texts: list[str]
    heldout_names: list[str]


def corpus_stream(lm: Any, corpus: Sequence[str | Path] | None = None, *, texts: Sequence[str] | None = None,
                  heldout_every: int = 10, max_heldout_docs: int | None = None) -> Stream:
    """Split a corpus (files, or ``texts``) and tokenize its training part with ``lm``'s tokenizer."""
    from polymem.recipes.data import read_documents, split_documents

    docs = list(texts) if texts is not None else read_documents(corpus or [])
    train, held = split_documents(docs, heldout_every)
    names = [f"doc{i}" for i in range(len(docs)) if heldout_every and i % heldout_every == heldout_every - 1]
    if max_heldout_docs is not None:
        held, names = held[:max_heldout_docs], names[:max_heldout_docs]
    sep = lm.eos_id
    parts: list[np.ndarray] = []
    for t in train:
        parts.append(np.asarray(lm.tokenizer.encode(t), dtype=np.int64))
        if sep is not None:
            parts.append(np.array([sep], dtype=np.int64))
    stream = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return Stream(stream, list(train), list(held), names)


def window_batch(stream: np.ndarray, starts: np.ndarray, T: int, bos: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) [B, T] for window starts ``starts`` [B] (see the module docstring)."""
    if bos is None:
        idx = starts[:, None] + np.arange(T + 1)[None, :]
        w = torch.from_numpy(stream[idx])
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()
    idx = starts[:, None] + np.arange(T)[None, :]
    y = torch.from_numpy(stream[idx])
    x = torch.cat([torch.full((len(starts), 1), int(bos), dtype=torch.long), y[:, :-1]], dim=1)
    return x.contiguous(), y.contiguous()


def stream_read(n_tokens: int, cfg: FrozenTrainConfig, bos: int | None) -> dict[str, Any]:
    """How much of a training stream of ``n_tokens`` a run of ``cfg`` reads (:func:`polymem.recipes.data.corpus_read`:
    share of its tokens predicted by at least one window, passes)."""
    from polymem.recipes.data import corpus_read

    return corpus_read(n_tokens, data_order(n_tokens, cfg), cfg.block_size, offset=0 if bos is not None else 1)


def data_order(n_tokens: int, cfg: FrozenTrainConfig) -> np.ndarray:
    """Window starts [steps, batch_size], a function of ``cfg.seed`` only."""
    hi = n_tokens - cfg.block_size - 1
    if hi <= 0:
        raise PolymemError(f"the training stream has {n_tokens} tokens, fewer than block_size+1="
                           f"{cfg.block_size + 1}; use more text or a smaller --block-size")
    return np.random.default_rng(cfg.seed).integers(0, hi, size=(cfg.steps, cfg.batch_size))


class restricted_head:
    """Context manager: ``model``'s output layer cut to the rows ``ids`` (sorted unique int64); yields the map
    from a vocabulary id to its row in the cut layer (-1 for ids left out). The cut layer is built once, when
    this object is made; each ``with`` swaps it in and the model's own layer back on exit (tied input embeddings
    are never touched), so one object serves every step of a training run."""

    def __init__(self, model: Any, ids: np.ndarray) -> None:
        head = model.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear):
            raise PolymemError(f"{type(model).__name__}'s output layer is a {type(head).__name__}, not a "
                               "Linear; train with softmax='full'")
        idx = torch.as_tensor(np.asarray(ids, dtype=np.int64))
        self.model = model
        self.cut = torch.nn.Linear(head.in_features, idx.numel(), bias=head.bias is not None,
                                   device=head.weight.device, dtype=head.weight.dtype)
        with torch.no_grad():
            self.cut.weight.copy_(head.weight.index_select(0, idx.to(head.weight.device)))
            if head.bias is not None:
                self.cut.bias.copy_(head.bias.index_select(0, idx.to(head.weight.device)))
        self.cut.requires_grad_(False)
        self.remap = torch.full((head.out_features,), -1, dtype=torch.long)
        self.remap[idx] = torch.arange(idx.numel())

    def __enter__(self) -> torch.Tensor:
        self.saved = self.model.get_output_embeddings()
        self.model.set_output_embeddings(self.cut)
        return self.remap

    def __exit__(self, *exc) -> None:
        self.model.set_output_embeddings(self.saved)


def site_optimizers(handle: Any, cfg: FrozenTrainConfig):
    """(AdamW over the sites' parameters, SparseRowRMS over the table or None, the sites' parameters)."""
    from polymem.torch.optim import SparseRowRMS

    site = [p for p in handle.sites.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in site if p.dim() >= 2], "weight_decay": 0.0},
                             {"params": [p for p in site if p.dim() < 2], "weight_decay": 0.0}],
                            lr=cfg.site_lr, betas=(0.9, 0.95))
    table = handle.table_parameters() if handle.train in ("table", "all") else []
    topt = SparseRowRMS(table, lr=cfg.table_lr) if table else None
    return opt, topt, site


def train_site(lm: Any, handle: Any, stream: np.ndarray, cfg: FrozenTrainConfig, *,
               on_step: Callable[[int, float], None] | None = None, eval_at: Sequence[int] = (),
               on_eval: Callable[[int, int], None] | None = None, checkpoint: Path | None = None,
               checkpoint_every: int = 0, checkpoint_key: str = "", distributed: bool = False,
               aux: Callable[[torch.Tensor, np.ndarray], torch.Tensor] | None = None,
               extra: Sequence[torch.nn.Parameter] = (), extra_lr: float | None = None) -> dict[str, Any]:
    """Train ``handle``'s sites (and table, when trainable) on ``stream`` with the model frozen.

    ``aux(nats, starts)``: a term added to each step's loss, given the per-token nats [B, T] of the batch and its
    window starts in ``stream`` [B] (the distill arm's chunk-likelihood loss, :mod:`polymem.recipes.teach`);
    ``extra``: parameters ``aux`` (or a hook on the model) trains too (AdamW at the site's rate, or ``extra_lr``,
    on the same schedule; not clipped with the site).
    ``on_eval(steps_done, tokens_seen)`` runs after each step in ``eval_at`` (not counted in tokens_per_s).
    ``checkpoint``: a folder the state is written to every ``checkpoint_every`` steps and continued from when it
    is there (:mod:`polymem.recipes.checkpoint`; ``checkpoint_key`` names the settings it belongs to).
    ``distributed``: one process of a torch.distributed group (its share of each global batch, the sites'
    gradients summed, the table a :class:`polymem.torch.sharded.ShardedTable`), as in ``train_loop``."""
    from polymem.models.evaluate import token_nats
    from polymem.recipes.loop import Schedule, run_steps
    from polymem.recipes.train import batch_share

    share = batch_share(cfg.batch_size) if distributed else slice(None)

    if any(p.requires_grad for p in lm.model.parameters()):
        raise PolymemError("the model has trainable weights; train_site trains only the memory (load the model "
                           "with polymem.models.load_model, which freezes it)")
    opt, topt, site = site_optimizers(handle, cfg)
    if extra:
        opt.add_param_group({"params": list(extra), "weight_decay": 0.0,
                             **({"peak_lr": float(extra_lr)} if extra_lr is not None else {})})
    starts = data_order(stream.size, cfg)
    dev = next(lm.model.parameters()).device
    cut = restricted_head(lm.model, np.unique(stream)) if cfg.softmax == "corpus" else None
    ck = None
    if checkpoint is not None:
        from polymem.recipes.checkpoint import Checkpoints

        ck = Checkpoints(checkpoint, every=checkpoint_every, key=checkpoint_key, modules={"sites": handle.sites},
                         opt=opt, table=handle.table, topt=topt, steps=cfg.steps)

    def step_loss(step: int) -> torch.Tensor:
        x, y = window_batch(stream, starts[step][share], cfg.block_size, lm.bos_id)
        if cut is None:
            nats = token_nats(lm.model, x.to(dev), y.to(dev))
        else:
            with cut as remap:
                nats = token_nats(lm.model, x.to(dev), remap[y].to(dev))
        loss = nats.mean()
        if aux is not None:
            loss = loss + aux(nats, starts[step][share])
        return loss * (x.shape[0] / cfg.batch_size) if distributed else loss  # this process's share of the mean

    sched = Schedule(steps=cfg.steps, lr=cfg.site_lr, table_lr=cfg.table_lr, grad_clip=cfg.grad_clip,
                     lr_factor=cfg.lr_factor, tokens_per_step=cfg.batch_size * cfg.block_size)
    # on_eval runs with the full output layer back (the cut one is swapped in for each step only)
    return run_steps(sched, step_loss, opt, topt, site, handle=handle,
                     on_step=on_step, eval_at=eval_at, on_eval=on_eval, ck=ck, distributed=distributed)


def train_table(
    lm: Any, corpus: Sequence[str | Path], out: str | Path, *, cfg: FrozenTrainConfig = FrozenTrainConfig(),
    site_dir: str | Path | None = None, heldout_every: int = 10, eval_tokens: int | None = 16384,
    window: int = 512, overwrite: bool = False, on_step: Callable[[int, float], None] | None = None,
    on_phase: Callable[[str], None] | None = None, texts: Sequence[str] | None = None, checkpoint_every: int = 0,
    heldout_texts: Sequence[str] | None = None, byte_head: int = 0, byte_weight: float = 1.0,
    byte_polish: int | None = None,
) -> dict[str, Any]:
    """Train a fresh table with the frozen pretrained ``lm`` and write it to ``out`` (an asset with provenance:
    the model, its tokenizer's fingerprint, the corpus, the tokens seen, how much of it was read) and its site to
    ``site_dir`` (default: ``out`` + ``.site``). Returns a summary with held-out bits per byte before and after
    (``eval_tokens`` bounds the held-out text scored; None scores all of it).

    ``heldout_every=0`` trains on every document; ``heldout_texts`` are then scored (documents that never train),
    and without them the run scores documents it trained on and says so (``scored_set``).

    ``byte_head=J``: a byte decoder trains with the rows (the bytes that follow each n-gram, loss times
    ``byte_weight``, :class:`polymem.torch.bytehead.DonorBytes`) and is saved beside the site, after
    ``byte_polish`` more steps of the decoder alone over the training stream (rows frozen, no model forward;
    :func:`polymem.torch.bytehead.polish_decoder`; None: its default, 0: none)."""
    from polymem.models.evaluate import Scorer
    from polymem.torch.attach import attach
    from polymem.torch.tablefile import save_table

    say = on_phase or (lambda s: None)
    out = Path(out)
    site_dir = Path(site_dir) if site_dir is not None else out.with_name(out.name + ".site")
    for p in (out, site_dir):
        if p.exists() and not overwrite:
            raise PolymemError(f"{str(p)!r} exists; pass --overwrite (overwrite=True) or another --out")
    t0 = time.perf_counter()
    if byte_head:
        from polymem.torch.bytehead import check_bytes

        check_bytes(byte_head)
    say("reading corpus")
    if heldout_texts is not None and heldout_every:
        raise PolymemError(f"held-out documents were given and heldout_every={heldout_every} holds out more; pass "
                           "heldout_every=0 (--heldout-every 0) to train on every corpus document and score the given ones")
    data = corpus_stream(lm, corpus, texts=texts, heldout_every=heldout_every)
    if heldout_texts is not None:
        scored_set, held_src = "held-out documents given", list(heldout_texts)
    elif data.heldout_texts:
        scored_set, held_src = f"every {heldout_every}th document, held out", data.heldout_texts
    else:
        scored_set, held_src = "training documents (nothing held out)", data.train_texts
    held = _bounded_texts(lm, held_src, eval_tokens)
    read = stream_read(int(data.train.size), cfg, lm.bos_id)
    say("scoring the model alone")
    scorer = Scorer(lm, held, window=window)
    before = scorer.score()
    layout = cfg.layout()
    from polymem.recipes.train import _distributed

    distributed = _distributed()
    from polymem.recipes.loop import refuse_sharded_count_gate

    refuse_sharded_count_gate(cfg.gate, distributed)
    table_in: Any = layout
    if distributed:  # rows sharded across the processes, each holding and updating its own
        from polymem.hash.spec import HashSpec
        from polymem.torch.sharded import ShardedTable

        table_in = ShardedTable(spec=HashSpec(), layout=layout, orders=tuple(range(1, cfg.max_n + 1)))
    handle = attach(lm.model, table_in, lm.tokenizer, layers=list(cfg.layers), train="table", max_n=cfg.max_n,
                    gate=cfg.gate, init_seed=1000 + cfg.seed)
    try:
        handle.table.orders = tuple(range(1, cfg.max_n + 1))
        ckpt = out.with_name(out.name + ".ckpt")
        key = _checkpoint_key(lm, cfg, data.train, heldout_every)
        if checkpoint_every > 0 and ckpt.exists():
            say("training (continuing from the checkpoint)")
        else:
            say("training")
        bh = None
        if byte_head:
            from polymem.torch.bytehead import DonorBytes

            if distributed or checkpoint_every > 0:
                raise PolymemError("--byte-head trains in one process without checkpoints; drop --checkpoint-every "
                                   "or run in one process")
            bh = DonorBytes(handle, data.train, lm.tokenizer.all_token_bytes(), byte_head, weight=byte_weight,
                            bos=lm.bos_id, seed=3000 + cfg.seed)
        res = train_site(lm, handle, data.train, cfg, on_step=on_step, checkpoint=ckpt if checkpoint_every > 0 else None,
                         checkpoint_every=checkpoint_every, checkpoint_key=key, distributed=distributed,
                         aux=bh.aux if bh is not None else None, extra=bh.params if bh is not None else ())
        say("scoring with the table")
        after = scorer.score()
        if distributed:  # no process ever holds the whole table
            table, touched = None, handle.table.rows_touched()
        else:
            table = handle.table.weight.detach().cpu().numpy()  # the rows themselves: held once
            touched = sum(int(np.count_nonzero(np.any(table[a:a + (1 << 20)] != 0, axis=1)))
                          for a in range(0, table.shape[0], 1 << 20))
        prov = {
            "created_by": "polymem train --model", "model": lm.describe(),
            "tokenizer": {"name": lm.tokenizer.name, "fingerprint": lm.tokenizer.fingerprint},
            "corpus": ", ".join(str(p) for p in corpus) if texts is None else "(texts)",
            "heldout_every": heldout_every, "tokens_seen": res["tokens"], "train_stream_tokens": int(data.train.size),
            "corpus_read": read, "train_documents": documents_digest(data.train_texts), "scored_set": scored_set,
            "loss": float(np.mean(res["losses"][-20:])), "heldout_bpb": after["bpb"],
            "heldout_bpb_memory_off": before["bpb"], "heldout_scored_bytes": after["bytes"], "rows_touched": touched,
            "frozen_train_config": asdict(cfg),
            "memory_config": {"layers": list(cfg.layers), "max_n": cfg.max_n, "gate": cfg.gate},
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if bh is not None:
            from polymem.torch.bytehead import POLISH_STEPS, polish_decoder

            head, brec = bh.head.cpu(), bh.record()  # polished on the CPU, where the table's rows are now
            steps = POLISH_STEPS if byte_polish is None else int(byte_polish)
            if steps > 0:
                say("training the byte decoder on (rows frozen)")
                head, polish = polish_decoder(head, torch.from_numpy(np.ascontiguousarray(table, dtype=np.float32)),
                                              handle.table.spec, layout, lm.tokenizer, data.train, steps=steps)
                brec["polish"] = polish
            prov["byte_head"] = brec
        say("writing asset")
        if distributed:  # each process writes the shards of its own rows; process 0 the site
            handle.table.write_asset(out, provenance=prov, overwrite=overwrite, row_counts=res.get("row_counts"))
            path = out
        else:
            assert table is not None
            path = save_table(out, table, handle.table.spec, layout, orders=tuple(range(1, cfg.max_n + 1)),
                              provenance=prov, overwrite=overwrite, row_counts=res.get("row_counts"))
        _save_site(handle, site_dir, overwrite, path)
        if bh is not None:
            from polymem.torch.bytehead import save_byte_head

            save_byte_head(head, site_dir, record=brec)
        if checkpoint_every > 0:  # the asset is whole: the run is done
            from polymem.recipes.checkpoint import remove_checkpoint

            remove_checkpoint(ckpt, distributed)
    finally:
        handle.detach()
    from polymem.recipes.train import process_memory

    return {"process_memory": process_memory(handle.table, res.get("table_state_bytes", 0), distributed),
            "path": str(path), "site": str(site_dir), "model": lm.name, "tokenizer": lm.tokenizer.name,
            "rows": layout.num_rows, "rows_touched": touched, "tokens_seen": res["tokens"], "corpus_read": read,
            "scored_set": scored_set,
            "heldout_bpb_before": before["bpb"], "heldout_bpb_after": after["bpb"],
            "heldout_bytes": after["bytes"], "heldout_tokens": after["tokens"], "heldout_documents": len(held),
            "final_loss": prov["loss"], "tokens_per_s": res["tokens_per_s"],
            "train_s": res["train_s"], "elapsed_s": time.perf_counter() - t0, "resumed_at_step": res["resumed_at"],
            "checkpoints": res["checkpoints"], **({"byte_head": prov["byte_head"]} if "byte_head" in prov else {})}




def documents_digest(texts: Sequence[str]) -> dict[str, Any]:
    """What a table read, checkable against a split of a corpus: the number of documents and the sha256 of their
    sorted sha256s (the same set of documents in any order gives the same digest)."""
    import hashlib

    h = hashlib.sha256()
    for d in sorted(hashlib.sha256(t.encode("utf-8")).digest() for t in texts):
        h.update(d)
    return {"documents": len(texts), "sha256": h.hexdigest()}


def _checkpoint_key(lm: Any, cfg: FrozenTrainConfig, stream: np.ndarray, heldout_every: int) -> str:
    """What a checkpoint of :func:`train_table` belongs to: the model, the whole config and the training stream."""
    import hashlib
    import json

    d = lm.describe()
    h = hashlib.sha256(json.dumps({"model": [d["name"], d["architecture"], d["params"]]
                                   + (["bf16"] if d.get("precision") == "bf16" else []), "cfg": asdict(cfg),
                                   "heldout_every": heldout_every}, sort_keys=True, default=str).encode())
    h.update(hashlib.sha256(np.ascontiguousarray(stream).tobytes()).digest())
    return h.hexdigest()[:24]


def _save_site(handle: Any, site_dir: Path, overwrite: bool, asset_path: Path) -> None:
    """The site (projection, gate) as a frozen-table site file naming the asset just written."""
    import shutil

    import torch.distributed as dist

    lead = not dist.is_initialized() or dist.get_rank() == 0
    if lead and site_dir.exists() and overwrite:
        shutil.rmtree(site_dir)
    handle.table.weight.requires_grad_(False)  # the site file names the table by fingerprint; the asset holds the rows
    handle.table.source = {"kind": "asset", "path": str(Path(asset_path).resolve()), "dtype": "float32"}
    handle.train = "projection"  # re-attached, the asset's table is read frozen
    if lead:
        handle.save(site_dir)
    if dist.is_initialized():
        dist.barrier()


def _bounded_texts(lm: Any, texts: Sequence[str], max_tokens: int | None, *, doc_tokens: int | None = None) -> list[str]:
    """The held-out text scored: :func:`polymem.models.evaluate.scoring_set` (the rule every command shares)."""
    from polymem.models.evaluate import scoring_set

    return [t for _, t in scoring_set(lm.tokenizer, texts, max_tokens, doc_tokens=doc_tokens)]
