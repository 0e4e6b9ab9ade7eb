"""The one training loop every mode runs: a model trained from scratch with its table (:func:`.train.train_loop`),
a table and its site on a frozen pretrained backbone (:func:`.frozen.train_site`), and the recipients of the
transfer arms (which train through :func:`.frozen.train_site`).

A mode is one small function, ``step_loss(step) -> loss``: the batch of that step and the loss on it (its share of
the global batch's mean under torch.distributed). :func:`run_steps` does the rest, the same way for every mode:
the learning-rate schedule of both optimizers (the dense or site one, and the table's row-wise rule), backward,
clipping and the optimizer steps (:func:`.train.apply_step`), the row counts a count gate reads while its table
trains (:class:`.train.LiveCounts`), the losses, the callbacks (``on_step``, and
``on_eval`` at the steps of a learning curve, not counted as training time), checkpoints written and resumed
(:class:`.checkpoint.Checkpoints`, not counted either), and the summary: losses, tokens, training seconds and
tokens/s, and the table's row-wise state (bytes, per-row update counts for the asset).

Not here: what a batch is (each mode's ``step_loss``), the optimizers' construction, scoring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Collection

import numpy as np
import torch

from polymem.errors import PolymemError


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """How many steps, at which learning rates, with which clipping: what a mode's config says to the loop."""

    steps: int
    lr: float  # the dense (or site) optimizer's peak learning rate
    table_lr: float  # the table's row-wise rule's peak learning rate
    grad_clip: float  # max gradient norm of the dense (or site) parameters; 0: no clipping
    lr_factor: Callable[[int], float]  # step -> multiplier of both peaks (warmup-stable-decay)
    tokens_per_step: int  # the global batch's predicted tokens


def run_steps(sched: Schedule, step_loss: Callable[[int], torch.Tensor], opt: Any, topt: Any, dense: list, *,
              handle: Any = None, on_step: Callable[[int, float], None] | None = None,
              eval_at: Collection[int] = (), on_eval: Callable[[int, int], None] | None = None, ck: Any = None,
              distributed: bool = False) -> dict[str, Any]:
    """Steps ``sched.steps`` of ``step_loss`` (see the module docstring), continuing from ``ck``'s checkpoint when
    it has one. ``on_eval(steps_done, tokens_seen)`` runs after each step in ``eval_at``. Returns {"losses",
    "tokens", "train_s", "tokens_per_s", "resumed_at", "checkpoints"} and, with a row-wise table optimizer,
    "table_state_bytes" and "row_counts" (this process's rows under torch.distributed, as a tensor; else uint32)."""
    losses: list[float] = []
    first, before_s = 0, 0.0
    if ck is not None:
        got = ck.resume()
        if got is not None:
            first, losses, before_s = got["step"], got["losses"], got["train_s"]
    live = LiveCounts(handle, topt)  # a count gate reads the counts as they grow (after a resume: the restored ones)
    evals = {int(s) for s in eval_at}
    t0, t_eval = time.perf_counter(), 0.0  # reading a checkpoint back is not training time
    for step in range(first, sched.steps):
        f = sched.lr_factor(step)
        for g in opt.param_groups:  # a group with its own peak ("peak_lr") follows the same schedule
            g["lr"] = g.get("peak_lr", sched.lr) * f
        if topt is not None:
            for g in topt.param_groups:
                g["lr"] = sched.table_lr * f
        live.reading()
        loss = step_loss(step)
        apply_step(loss, dense, sched.grad_clip, opt, topt, reduce=distributed)
        live.settle()
        losses.append(global_sum(loss) if distributed else float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
        if on_eval is not None and step + 1 in evals:
            te = time.perf_counter()
            on_eval(step + 1, (step + 1) * sched.tokens_per_step)
            t_eval += time.perf_counter() - te
        if ck is not None:
            tc = time.perf_counter()
            if ck.after(step + 1, sched.steps, losses, before_s + tc - t0 - t_eval):
                t_eval += time.perf_counter() - tc  # writing a checkpoint is not training
    el = before_s + time.perf_counter() - t0 - t_eval
    tokens = sched.steps * sched.tokens_per_step
    out: dict[str, Any] = {"losses": losses, "tokens": tokens, "train_s": el, "tokens_per_s": tokens / max(el, 1e-9),
                           "resumed_at": first,
                           "checkpoints": {"written": ck.written if ck else 0, "seconds": ck.write_s if ck else 0.0}}
    table = getattr(handle, "table", None)
    if topt is not None and table is not None:  # per-row update counts (SparseRowRMS state), for the asset
        st = topt.state.get(table.weight, {})
        out["table_state_bytes"] = sum(t.numel() * t.element_size() for t in st.values() if isinstance(t, torch.Tensor))
        n = st.get("n", torch.zeros(table.weight.shape[0], dtype=torch.int32))  # (this process's rows)
        out["row_counts"] = n.detach().cpu() if distributed else n.detach().cpu().numpy().astype(np.uint32)
    return out


def apply_step(loss: torch.Tensor, dense: list, grad_clip: float, opt: Any, topt: Any = None,
               reduce: bool = False) -> None:
    """Backward, clip the dense parameters' gradient norm (when grad_clip > 0), step both optimizers (the table's
    row-wise one may be None) and clear their gradients. ``reduce``: sum the dense gradients over the processes
    of torch.distributed first (each process's loss weighted by its share of the global batch)."""
    loss.backward()
    if reduce:
        from polymem.torch.sharded import all_reduce_grads

        all_reduce_grads(dense)
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(dense, grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if topt is not None:
        topt.step()
        topt.zero_grad(set_to_none=True)


def global_sum(x: torch.Tensor) -> float:
    import torch.distributed as dist

    x = x.detach().float().clone()
    dist.all_reduce(x)
    return float(x)


class LiveCounts:
    """What a gate="count" site reads while its table trains: the rows' training counts as they grow, so that
    training and serving read the same gate input (a site attached again reads the asset's counts, which are
    these counts at the end).

    During a training step's forward every row reads its updates so far plus one (the update this step makes
    counts; reading 0 would scale the row to nothing and no row would ever learn); after the step, and for
    scoring, the updates so far. A table that starts with counts (a donor's) adds its updates to them. Off for
    a frozen table (its counts do not change), a table without counts' room (sharded across processes) and
    sites of other gates."""

    def __init__(self, handle: Any, topt: Any) -> None:
        from polymem.torch.tables import TrainableTable

        self.on = (handle is not None and topt is not None and isinstance(handle.table, TrainableTable)
                   and any(getattr(getattr(s, "cfg", None), "gate", None) == "count" for s in handle.sites.values()))
        if not self.on:
            return
        self.table, self.topt = handle.table, topt
        w = handle.table.weight
        start = handle.table.counts
        self.start = (start.detach().clone() if start is not None
                      else torch.zeros(w.shape[0], dtype=torch.float32, device=w.device))  # [R]
        self.settle()

    def reading(self) -> None:
        """Before a training step's forward: each row's updates so far, this step's included."""
        if self.on:
            self.table.counts = self.now + 1

    def settle(self) -> None:
        """After a step (and before scoring): each row's updates so far."""
        if not self.on:
            return
        n = self.topt.state.get(self.table.weight, {}).get("n")
        self.now = self.start if n is None else self.start + n.to(self.start.device, torch.float32)
        self.table.counts = self.now


def refuse_sharded_count_gate(gate: str, distributed: bool) -> None:
    """A table sharded across processes does not track its rows' counts while it trains, so a count gate would read
    none in training and the asset's counts when served: refused."""
    if distributed and gate == "count":
        raise PolymemError("--gate count is not available when training across processes (the sharded table does not "
                           "track its rows' counts while it trains, so training and serving would read different gate "
                           "inputs); use --gate context or scalar, or train in one process")
