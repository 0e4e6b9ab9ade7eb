"""Training small causal LMs with memory sites: data preparation, the training loop, bits-per-byte evaluation,
and ``train_donor`` (train a table from scratch and write it as an asset with provenance).

Recipe (the PageGram report's): nanoGPT-style model (:mod:`polymem.recipes.model`), one memory site before block 1,
rows start at zero, fp32 table updated sparsely by a row-wise RMS rule at ``table_lr_mult`` × the dense learning
rate, AdamW for dense weights (β = 0.9, 0.95; weight decay 0.1 on matrices), warmup-stable-decay schedule
(5 % warmup, linear decay over the last 20 %), gradient clipping 1.0 on dense weights, bf16 autocast where the
device has native bf16, else fp32 (:mod:`polymem.torch.precision`).

Held-out split: every ``heldout_every``-th document (index i with i % heldout_every == heldout_every - 1) is
held out, never trained on. Bits per byte = Σ cross-entropy (nats) / ln 2 / Σ bytes of the predicted tokens,
over held-out tokens with bytes (document separators are not scored).

Not here: reading and splitting documents (:mod:`polymem.recipes.data`), the transfer arms
(:mod:`polymem.recipes.transfer`), the CLI (:mod:`polymem.cli.cmd_train`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from polymem.errors import PolymemError
from polymem.hash.spec import HashSpec
from polymem.hash.layout import Layout
from polymem.recipes.data import read_documents, split_documents

HASHES = ("bytes", "xor")  # the byte hash (tokenizer-agnostic) or Engram's token-id XOR hash (tokenizer-bound)

# ------------------------------------------------------------------------------------------------ config
def wsd_factor(step: int, steps: int, warmup_frac: float, decay_frac: float) -> float:
    """Warmup-stable-decay: linear warmup over ``warmup_frac`` of the steps, then 1, then linear decay to 0 over
    the last ``decay_frac`` (each at least one step)."""
    w = max(1, int(warmup_frac * steps))
    d = max(1, int(decay_frac * steps))
    if step < w:
        return (step + 1) / w
    if step >= steps - d:
        return max(0.0, (steps - step) / d)
    return 1.0


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    steps: int = 600  # optimizer steps
    batch_size: int = 8  # sequences per step
    block_size: int = 256  # tokens per sequence
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    lr: float = 2e-3  # dense AdamW peak learning rate
    table_lr_mult: float = 70.0  # table lr = lr × this (PageGram's best; row-wise RMS rule)
    weight_decay: float = 0.1  # on dense matrices only; never on the table
    warmup_frac: float = 0.05
    decay_frac: float = 0.2  # linear decay to 0 over the last 20 % of steps
    grad_clip: float = 1.0
    seed: int = 0  # model init and data order
    precision: str = "auto"  # "auto" (bf16 autocast only where the device has native bf16), "fp32" or "bf16"
    bf16: bool | None = None  # deprecated alias: True = precision "bf16", False = "fp32" (wins over precision)
    eval_batch: int = 16
    device: str = "auto"  # "auto": CUDA when present, else CPU

    def __post_init__(self) -> None:
        from polymem.torch.precision import PRECISIONS

        if self.precision not in PRECISIONS:
            raise PolymemError(f"precision {self.precision!r} is unknown; accepted: {', '.join(PRECISIONS)} (e.g. --precision auto)")

    def torch_device(self) -> torch.device:
        from polymem.torch.device import resolve_device

        return resolve_device(self.device)

    def precision_choice(self) -> tuple[str, str]:
        """("bf16" | "fp32", why): see :mod:`polymem.torch.precision`. The table stays fp32 either way."""
        from polymem.torch.precision import resolve_precision

        req = self.precision if self.bf16 is None else ("bf16" if self.bf16 else "fp32")
        name, why = resolve_precision(req, self.torch_device())
        if self.bf16 is not None:
            why += f" (from the deprecated bf16={self.bf16})"
        return name, why

    def lr_factor(self, step: int) -> float:
        return wsd_factor(step, self.steps, self.warmup_frac, self.decay_frac)


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    layers: tuple[int, ...] = (1,)  # memory sites before these blocks
    max_n: int = 3  # orders 1..max_n
    params: int = 12_000_000  # table size in scalars (rows × head_dim)
    heads: int = 8  # K
    slots: int = 4  # S
    head_dim: int = 32  # r
    gate: str = "scalar"
    conv: bool = False

    def layout(self) -> Layout:
        return Layout.for_params(self.params, heads=self.heads, slots=self.slots, head_dim=self.head_dim)


# ------------------------------------------------------------------------------------------------ data
@dataclass
class TokenData:
    """A corpus tokenized with one tokenizer: train and held-out streams joined by a separator id."""

    tokenizer: Any  # polymem Tokenizer
    cache: Any  # polymem TokenHashes (HashSpec())
    train: np.ndarray  # int64 [N_train]
    heldout: np.ndarray  # int64 [N_held]
    used_ids: np.ndarray  # int64 sorted ids present in train ∪ held-out (the compact vocabulary)
    sep: int | None  # separator id between documents (a special id: n-grams never cross documents)
    train_bytes: int = 0
    heldout_bytes: int = 0
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.tokenizer.name

    @classmethod
    def build(cls, tokenizer: Any, train_texts: Sequence[str], heldout_texts: Sequence[str], *,
              spec: HashSpec | None = None, cache: Any = None) -> "TokenData":
        from polymem.hash.token_hashes import TokenHashes
        from polymem.tokenizers import load_tokenizer

        tok = load_tokenizer(tokenizer)
        cache = cache or TokenHashes.build(tok, spec or HashSpec())
        specials = np.flatnonzero(cache.special)
        sep = int(specials[0]) if specials.size else None

        def stream(texts: Sequence[str]) -> np.ndarray:
            parts: list[np.ndarray] = []
            for t in texts:
                parts.append(np.asarray(tok.encode(t), dtype=np.int64))
                if sep is not None:
                    parts.append(np.array([sep], dtype=np.int64))
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)

        tr, he = stream(train_texts), stream(heldout_texts)
        used = np.unique(np.concatenate([tr, he]))
        return cls(
            tokenizer=tok, cache=cache, train=tr, heldout=he, used_ids=used, sep=sep,
            train_bytes=sum(len(t.encode()) for t in train_texts),
            heldout_bytes=sum(len(t.encode()) for t in heldout_texts),
        )


def batch_starts(n_tokens: int, *, block_size: int, batch_size: int, steps: int, seed: int) -> np.ndarray:
    """Random window starts [steps, batch_size]: the data order, a function of the seed only."""
    hi = n_tokens - block_size - 1
    if hi <= 0:
        raise PolymemError(f"the training stream has {n_tokens} tokens, fewer than block_size+1={block_size + 1}; use more text or a smaller block")
    return np.random.default_rng(seed).integers(0, hi, size=(steps, batch_size))


def get_batch(stream: np.ndarray, starts: np.ndarray, block_size: int, device: torch.device | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + np.arange(block_size + 1)[None, :]  # [B, T+1]
    w = torch.from_numpy(stream[idx]).to(device or "cpu")
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()  # x, y [B, T]


# ------------------------------------------------------------------------------------------------ model
def build_model(data: TokenData, cfg: TrainConfig, *, seed: int | None = None):
    """The nanoGPT-style backbone for ``data``'s tokenizer, initialised from ``seed`` (default cfg.seed)."""
    from polymem.recipes.model import GPT, GPTConfig

    torch.manual_seed(cfg.seed if seed is None else seed)
    gcfg = GPTConfig(vocab_size=data.cache.vocab_size, n_used=int(data.used_ids.size), block_size=cfg.block_size,
                     n_layer=cfg.n_layer, n_head=cfg.n_head, d_model=cfg.d_model)
    return GPT(gcfg, torch.from_numpy(data.used_ids)).to(cfg.torch_device())


def _autocast(cfg: TrainConfig):
    return torch.autocast(cfg.torch_device().type, dtype=torch.bfloat16, enabled=cfg.precision_choice()[0] == "bf16")


def _optimizers(model, handle, cfg: TrainConfig):
    from polymem.torch.optim import SparseRowRMS

    dense = [p for p in model.parameters() if p.requires_grad]
    if handle is not None:
        dense += [p for p in handle.sites.parameters() if p.requires_grad]
    groups = [{"params": [p for p in dense if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in dense if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=False)
    table = handle.table_parameters() if handle is not None and handle.train in ("table", "all") else []
    topt = SparseRowRMS(table, lr=cfg.lr * cfg.table_lr_mult) if table else None
    return opt, topt, dense






def batch_share(batch_size: int) -> slice:
    """This process's sequences of a global batch (torch.distributed: rank k of N takes [B·k/N, B·(k+1)/N))."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    if batch_size < world:
        raise PolymemError(f"--batch-size {batch_size} is the global batch and must be at least the number of "
                           f"processes ({world}): each process needs a sequence")
    return slice(batch_size * rank // world, batch_size * (rank + 1) // world)




def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def process_memory(table: Any, optimizer_bytes: int, distributed: bool) -> list[dict[str, int]]:
    """Per process (rank order): the bytes of table rows it holds, of their optimizer state, its peak RSS and its
    peak address space (VmPeak)."""
    import resource

    w = getattr(table, "weight", None)
    mine = {"table_bytes": int(w.numel() * w.element_size()) if isinstance(w, torch.Tensor) else 0,
            "optimizer_bytes": int(optimizer_bytes),
            "peak_rss_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
    from polymem.torch.tables import _proc_field

    mine["peak_vm_bytes"] = _proc_field("/proc/self/status", "VmPeak") or 0  # what an address-space limit counts
    if not distributed:
        return [mine]
    import torch.distributed as dist

    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, mine)
    return got


def train_loop(
    model, handle, data: TokenData, cfg: TrainConfig, *, on_step: Callable[[int, float], None] | None = None,
    rows_in_loader: bool = False, eval_every: int | None = None, on_eval: Callable[[int, int], None] | None = None,
    distributed: bool = False, checkpoint: Path | None = None, checkpoint_every: int = 0, checkpoint_key: str = "",
) -> dict[str, Any]:
    """Train ``model`` (with ``handle``'s sites, if any) for cfg.steps on data.train. Returns losses and speed.

    ``checkpoint``: a folder the state is written to every ``checkpoint_every`` steps and continued from when it
    is there, with any number of processes (:mod:`polymem.recipes.checkpoint`; ``checkpoint_key`` names the
    settings it belongs to).

    ``distributed``: one process of a torch.distributed group (data parallel: each takes its share of every global
    batch of cfg.batch_size sequences, dense gradients summed; the table a :class:`polymem.torch.sharded.ShardedTable`
    whose rows each process updates alone). Every process gets the same losses (the global batch's).

    With ``eval_every`` and ``on_eval``: ``on_eval(steps_done, tokens_seen)`` after every ``eval_every`` steps
    and after the last step (a learning curve); its time is not counted in ``tokens_per_s``."""
    from polymem.recipes.loop import Schedule, run_steps

    opt, topt, dense = _optimizers(model, handle, cfg)
    share = batch_share(cfg.batch_size) if distributed else slice(None)
    starts = batch_starts(data.train.size, block_size=cfg.block_size, batch_size=cfg.batch_size, steps=cfg.steps, seed=cfg.seed)
    dev = cfg.torch_device()
    model.train()
    ck = None
    if checkpoint is not None and handle is not None:
        from polymem.recipes.checkpoint import Checkpoints

        ck = Checkpoints(checkpoint, every=checkpoint_every, key=checkpoint_key,
                         modules={"model": model, "sites": handle.sites}, opt=opt, table=handle.table, topt=topt,
                         steps=cfg.steps)

    def step_loss(step: int) -> torch.Tensor:
        x, y = get_batch(data.train, starts[step][share], cfg.block_size, dev)
        if rows_in_loader and handle is not None:  # hashing in the data loader (numba) instead of on device
            rows = data.cache.ngram_rows(x.cpu().numpy(), handle.table.layout, handle.max_n)
            handle.set_rows(torch.from_numpy(np.ascontiguousarray(rows)).to(dev))
        with _autocast(cfg):
            loss = model(x, y).mean()
        return loss * (x.shape[0] / cfg.batch_size) if distributed else loss  # this process's share of the mean

    def eval_then_train(steps_done: int, tokens: int) -> None:
        assert on_eval is not None
        on_eval(steps_done, tokens)
        model.train()

    evals = [s for s in range(1, cfg.steps + 1) if s % eval_every == 0 or s == cfg.steps] if eval_every else []
    sched = Schedule(steps=cfg.steps, lr=cfg.lr, table_lr=cfg.lr * cfg.table_lr_mult, grad_clip=cfg.grad_clip,
                     lr_factor=cfg.lr_factor, tokens_per_step=cfg.batch_size * cfg.block_size)
    out = run_steps(sched, step_loss, opt, topt, dense, handle=handle,
                    on_step=on_step, eval_at=evals, on_eval=eval_then_train if on_eval is not None else None, ck=ck,
                    distributed=distributed)
    out["elapsed_s"] = out["train_s"]
    return out


@torch.no_grad()
def evaluate_bpb(model, data: TokenData, cfg: TrainConfig, *, stream: np.ndarray | None = None,
                 max_tokens: int | None = None) -> float:
    """Held-out bits per byte: non-overlapping windows of block_size+1 tokens (each token predicted once)."""
    s = data.heldout if stream is None else stream
    if max_tokens is not None:
        s = s[: max_tokens + 1]
    T = cfg.block_size
    n_win = (s.size - 1) // T
    if n_win == 0:
        raise PolymemError(f"held-out stream has {s.size} tokens, fewer than block_size+1={T + 1}")
    starts = np.arange(n_win) * T
    dev = cfg.torch_device()
    L = torch.from_numpy(data.cache.L.astype(np.int64)).to(dev)
    special = torch.from_numpy(data.cache.special).to(dev)
    model.eval()
    nats, nbytes = 0.0, 0
    for i in range(0, n_win, cfg.eval_batch):
        x, y = get_batch(s, starts[i:i + cfg.eval_batch], T, dev)
        with _autocast(cfg):
            ce = model(x, y)  # [B, T] nats
        scored = ~special[y]
        nats += float(ce[scored].double().sum())
        nbytes += int(L[y][scored].sum())
    model.train()
    return nats / math.log(2) / max(nbytes, 1)


# ------------------------------------------------------------------------------------------------ donor
def train_donor(
    tokenizer: Any, corpus: Sequence[str | Path], out: str | Path, *, cfg: TrainConfig = TrainConfig(),
    mem: MemoryConfig = MemoryConfig(), heldout_every: int = 10, max_eval_tokens: int | None = None,
    overwrite: bool = False, on_step: Callable[[int, float], None] | None = None,
    on_phase: Callable[[str], None] | None = None, hash: str = "bytes", return_model: bool = False,
    checkpoint_every: int = 0,
) -> dict[str, Any]:
    """Train a backbone with a fresh all-zero table from scratch and write the table to ``out`` (an asset,
    or a ``.safetensors`` table file). Returns a summary (held-out bpb with and without memory, speed).

    ``hash="xor"``: an Engram-style tokenizer-bound table (token-id XOR hash, a prime modulus per (order, head),
    independent heads; :mod:`polymem.torch.idrows`) instead of the byte hash. ``return_model``: the summary
    also holds ``model``, ``handle`` and ``data`` (for experiments). ``checkpoint_every``: write the training
    state to ``out`` + ``.ckpt`` every this many steps; a run started again with the same settings (and any
    number of processes) continues from it; it is removed once ``out`` is written."""
    if hash not in HASHES:
        raise PolymemError(f"hash {hash!r} is unknown; accepted: bytes (tokenizer-agnostic), xor (Engram, tokenizer-bound)")
    from polymem.torch.attach import attach
    from polymem.torch.tablefile import save_table

    say = on_phase or (lambda s: None)
    out = Path(out)
    if out.exists() and not overwrite:
        raise PolymemError(f"{str(out)!r} exists; pass --overwrite or another --out")
    t0 = time.perf_counter()
    say("reading corpus")
    train_texts, held_texts = split_documents(read_documents(corpus), heldout_every)
    if not held_texts:  # heldout_every=0: every document trains, and the scores are on what it read
        held_texts = train_texts
    say("tokenizing")
    data = TokenData.build(tokenizer, train_texts, held_texts)
    model = build_model(data, cfg)
    layout = mem.layout()
    table_in: Any = None
    if hash == "xor":
        from polymem.torch.idrows import xor_spec_for
        from polymem.torch.tables import TrainableTable

        xspec = xor_spec_for(mem.params, heads=mem.heads, head_dim=mem.head_dim, max_n=mem.max_n, seed=cfg.seed,
                             tokenizer={"name": data.name, "fingerprint": data.cache.fingerprint},
                             vocab_size=data.cache.vocab_size)
        layout = xspec.layout(mem.head_dim)
    distributed = _distributed()
    from polymem.recipes.loop import refuse_sharded_count_gate

    refuse_sharded_count_gate(mem.gate, distributed)
    if hash == "xor" and not distributed:
        table_in = TrainableTable(None, spec=xspec, layout=layout, orders=tuple(range(1, mem.max_n + 1)))
    if distributed:  # rows sharded across the processes, each holding and updating its own
        if out.suffix == ".safetensors":
            raise PolymemError(f"{str(out)!r}: a table trained across processes is written as an asset (each process "
                               "writing its own rows); give --out a name without .safetensors")
        from polymem.torch.sharded import ShardedTable

        table_in = ShardedTable(spec=xspec if hash == "xor" else HashSpec(), layout=layout,
                                orders=tuple(range(1, mem.max_n + 1)))
    handle = attach(model, table_in if table_in is not None else layout, data.cache, layers=list(mem.layers),
                    train="all", max_n=mem.max_n, gate=mem.gate, conv=mem.conv, init_seed=cfg.seed + 1000)
    handle.table.orders = tuple(range(1, mem.max_n + 1))
    precision, why = cfg.precision_choice()
    ckpt = out.with_name(out.name + ".ckpt")
    say("training (continuing from the checkpoint)" if checkpoint_every > 0 and ckpt.exists() else "training")
    res = train_loop(model, handle, data, cfg, on_step=on_step, distributed=distributed,
                     checkpoint=ckpt if checkpoint_every > 0 else None, checkpoint_every=checkpoint_every,
                     checkpoint_key=_checkpoint_key(cfg, mem, hash, data, heldout_every))
    from polymem.recipes.data import corpus_read

    read = corpus_read(int(data.train.size), batch_starts(data.train.size, block_size=cfg.block_size,
                                                          batch_size=cfg.batch_size, steps=cfg.steps, seed=cfg.seed),
                       cfg.block_size, offset=1)  # the window at s predicts stream[s + 1 : s + T + 1]
    scored_set = "training documents (nothing held out)" if heldout_every == 0 else f"every {heldout_every}th document, held out"
    say("evaluating")
    bpb = evaluate_bpb(model, data, cfg, max_tokens=max_eval_tokens)
    with handle.disabled():
        bpb_off = evaluate_bpb(model, data, cfg, max_tokens=max_eval_tokens)
    if distributed:  # no process ever holds the whole table
        table, touched = None, handle.table.rows_touched()
    else:
        table = handle.table.weight.detach().cpu().numpy()  # the rows themselves, not a copy: held once
        touched = sum(int(np.count_nonzero(np.any(table[a:a + (1 << 20)] != 0, axis=1)))  # in blocks: no copy
                      for a in range(0, table.shape[0], 1 << 20))
    prov = {
        "tokenizer": {"name": data.name, "fingerprint": data.cache.fingerprint},
        "corpus": ", ".join(str(p) for p in corpus), "heldout_every": heldout_every,
        "tokens_seen": res["tokens"], "train_stream_tokens": int(data.train.size), "corpus_read": read,
        "scored_set": scored_set, "loss": float(np.mean(res["losses"][-20:])),
        "heldout_bpb": bpb, "heldout_bpb_memory_off": bpb_off, "rows_touched": touched,
        "train_config": asdict(cfg), "precision": {"chosen": precision, "reason": why}, "memory_config": asdict(mem), "created_by": "polymem train",
        "hash": hash,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    say("writing asset")
    if distributed:  # each process writes the shards of its own rows into the one asset
        handle.table.write_asset(out, provenance=prov, overwrite=overwrite, row_counts=res.get("row_counts"))
        path = Path(out)
    else:
        assert table is not None
        path = save_table(out, table, handle.table.spec, layout, orders=tuple(range(1, mem.max_n + 1)),
                          provenance=prov, overwrite=overwrite, row_counts=res.get("row_counts"))
    if checkpoint_every > 0:  # the asset is whole: the run is done
        from polymem.recipes.checkpoint import remove_checkpoint

        remove_checkpoint(ckpt, distributed)
    memory = process_memory(handle.table, res.get("table_state_bytes", 0), distributed)
    extra = {"model": model, "handle": handle, "data": data} if return_model else {}
    if not return_model:
        handle.detach()
    return {"path": str(path), "tokenizer": data.name, "train_tokens_available": int(data.train.size),
            "corpus_read": read, "scored_set": scored_set, "heldout_every": heldout_every,
            "heldout_tokens": int(data.heldout.size), "n_used": int(data.used_ids.size),
            "params_backbone": sum(p.numel() for p in model.parameters()), "layout": layout.to_dict(),
            "heldout_bpb": bpb, "heldout_bpb_memory_off": bpb_off, "rows_touched": touched,
            "rows": layout.num_rows, "tokens_per_s": res["tokens_per_s"], "train_s": res["elapsed_s"],
            "final_loss": prov["loss"], "precision": precision, "precision_reason": why, "elapsed_s": time.perf_counter() - t0,
            "hash": hash, "process_memory": memory, "resumed_at_step": res["resumed_at"],
            "checkpoints": res["checkpoints"], **extra}


def _checkpoint_key(cfg: TrainConfig, mem: MemoryConfig, hash: str, data: TokenData, heldout_every: int) -> str:
    """What a checkpoint of :func:`train_donor` belongs to: the configs, the hash, the tokenizer and the training
    stream (not the device or the number of processes)."""
    import hashlib
    import json

    run = {k: v for k, v in asdict(cfg).items() if k not in ("device", "eval_batch")}
    h = hashlib.sha256(json.dumps({"cfg": run, "mem": asdict(mem), "hash": hash, "tokenizer": data.cache.fingerprint,
                                   "heldout_every": heldout_every}, sort_keys=True, default=str).encode())
    h.update(hashlib.sha256(np.ascontiguousarray(data.train).tobytes()).digest())
    return h.hexdigest()[:24]
