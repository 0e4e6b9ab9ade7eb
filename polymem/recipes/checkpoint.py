"""Resumable training: the state of a training run every few steps, in one process or across the processes of a
torch.distributed group (:class:`Checkpoints`).

A checkpoint is a folder (``<out>.ckpt`` beside the asset ``polymem train`` writes):

* ``table/``: the table's rows as an ordinary float32 asset (when the table trains). Across processes each process
  writes the shards of its own rows into it (:meth:`polymem.torch.sharded.ShardedTable.write_asset`: no process
  ever holds another's rows); one process can open it like any asset.
* ``rows-<lo>-<hi>.safetensors``: the row-wise optimizer's state (``v``, ``n``) of rows [lo, hi), one file per
  process that wrote it.
* ``dense.safetensors``: the dense weights (the model's when it trains, the sites') and AdamW's moments: the
  same in every process (data parallel), written by process 0.
* ``state.json``, written last: format, the step reached, the losses so far, the training seconds, how many
  processes wrote it, and a key of everything that determines the run (not the number of processes).

Reading one back checks everything before it is used: ``state.json`` is a regular file of at most 16 MiB that
fits :func:`state_schema` (the step in range, one loss per step); the dense file holds exactly this run's weights
and moments shaped like their parameters; each row file holds ``v`` and ``n`` for exactly its rows. Anything else
is one error saying to remove the checkpoint. A checkpoint path that is a link is refused before the run starts.

It is built in a temporary folder and renamed over the previous one, so a run killed at any moment (a process
of several included) leaves the last whole checkpoint. A run started again with the same settings continues from
it — with any number of processes: each reads its rows from the asset and the row files that overlap them —
and, with the same number of processes, ends with the same table, bit for bit, as one that never stopped (the
data order is a function of the seed and the step). A checkpoint of other settings is refused. Nothing is
unpickled. Across machines, the folder must be on a file system every process sees.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from polymem.errors import FormatError, PolymemError

FORMAT = "polymem.training-checkpoint"
VERSION = 2
_ROWS = re.compile(r"rows-(\d{12})-(\d{12})\.safetensors")


class Checkpoints:
    """The checkpoints of one run at ``path``: :meth:`resume` before the first step, :meth:`after` every step.

    ``modules``: name -> module whose ``state_dict`` is the dense state (identical in every process); ``opt``:
    their AdamW; ``table``: the trained table (a :class:`~polymem.torch.sharded.ShardedTable` across processes:
    then every call is collective); ``topt``: its row-wise optimizer or None."""

    def __init__(self, path: Path, *, every: int, key: str, modules: Mapping[str, torch.nn.Module],
                 opt: torch.optim.Optimizer, table: Any, topt: Any, steps: int | None = None) -> None:
        from polymem.torch.sharded import ShardedTable

        check_checkpoint_path(path)
        self.path, self.every, self.key, self.steps = Path(path), int(every), key, steps
        self.modules, self.opt, self.table, self.topt = dict(modules), opt, table, topt
        self.sharded = isinstance(table, ShardedTable)
        self.rank = table.rank if self.sharded else 0
        self.world = table.world if self.sharded else 1
        self.written, self.write_s = 0, 0.0  # checkpoints written by this run, and their seconds
        self.lo: int = int(table.lo) if self.sharded else 0
        self.hi: int = int(table.hi) if self.sharded else int(table.weight.shape[0])

    # -------------------------------------------------------------------------------------------- writing
    def after(self, done: int, steps: int, losses: list[float], train_s: float) -> bool:
        """Write a checkpoint when ``done`` steps (of ``steps``) call for one; True when it was written."""
        if self.every <= 0 or done % self.every or done >= steps:
            return False
        import time

        t = time.perf_counter()
        self.save(done, losses, train_s)
        self.written, self.write_s = self.written + 1, self.write_s + time.perf_counter() - t
        return True

    def save(self, step: int, losses: list[float], train_s: float) -> None:
        """Write the state after ``step`` steps; the previous checkpoint is replaced whole (collective)."""
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        from polymem._io import _fsync_file, atomic_write_json
        from polymem.asset._fs import fsync_dir

        lead, tmp = self.rank == 0, self._aside(".tmp")
        problem = None
        if lead:
            try:
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir(parents=True)
            except OSError as e:
                problem = f"cannot write the checkpoint {str(tmp)!r}: {e}"
        self._agree(problem)
        if self.table.trainable:
            self._write_rows(tmp / "table")
        try:
            st = self._row_state()
            if st:  # every process, even one whose rows have had no update yet: the files tile the rows
                f = tmp / f"rows-{self.lo:012d}-{self.hi:012d}.safetensors"
                save_file({k: v.detach().cpu().contiguous() for k, v in st.items()}, str(f))
                _fsync_file(f)
            if lead:
                save_file(self._dense(), str(tmp / "dense.safetensors"))
                _fsync_file(tmp / "dense.safetensors")
        except (OSError, SafetensorError) as e:  # safetensors reports a full disk as SafetensorError
            problem = f"rank {self.rank}: cannot write the checkpoint {str(tmp)!r}: {e}"
        self._agree(problem)
        if lead:
            try:
                atomic_write_json(tmp / "state.json", {
                    "format": FORMAT, "version": VERSION, "key": self.key, "step": int(step), "world": self.world,
                    "losses": [float(x) for x in losses], "train_s": float(train_s)}, fsync=True)
                fsync_dir(tmp)
                old = self._aside(".old")
                if self.path.exists():
                    if old.exists():
                        shutil.rmtree(old)
                    self.path.rename(old)
                tmp.rename(self.path)
                fsync_dir(self.path.parent)  # the rename itself survives a power cut
                if old.exists():
                    shutil.rmtree(old)
            except OSError as e:
                problem = f"cannot install the checkpoint {str(self.path)!r}: {e}"
        self._agree(problem)

    def _write_rows(self, dest: Path) -> None:
        if self.sharded:
            self.table.write_asset(dest, provenance={"created_by": "polymem train (checkpoint)"}, fingerprint=False)
            return
        from polymem.asset import MemoryAsset

        t = self.table
        MemoryAsset.from_array(dest, t.weight.detach().cpu().numpy(), t.spec, t.layout, orders=tuple(t.orders) or (1,),
                               dtype="float32", provenance={"created_by": "polymem train (checkpoint)"})

    def _row_state(self) -> dict[str, torch.Tensor]:
        """The row-wise optimizer's state of this process's rows (zeros, as the optimizer starts them, for rows
        that have had no update yet)."""
        if self.topt is None:
            return {}
        st = self.topt.state.get(self.table.weight, {})
        n = self.hi - self.lo
        return {"v": st.get("v", torch.zeros(n, dtype=torch.float32)), "n": st.get("n", torch.zeros(n, dtype=torch.int32))}

    def _dense(self) -> dict[str, torch.Tensor]:
        out = {f"{name}.{k}": v.detach().cpu().contiguous().clone()
               for name, m in self.modules.items() for k, v in m.state_dict().items()}
        for i, st in self.opt.state_dict()["state"].items():
            for k, v in st.items():
                out[f"adam.{i}.{k}"] = torch.as_tensor(v).detach().cpu().contiguous().clone()
        return out

    # -------------------------------------------------------------------------------------------- reading
    def resume(self) -> dict[str, Any] | None:
        """Restore the last checkpoint into the modules, optimizers and this process's rows; returns
        ``{"step", "losses", "train_s", "world"}``, or None when there is none. A checkpoint of other settings,
        or a damaged one, is refused with the way out (collective)."""
        problem = None
        if self.rank == 0 and not self.path.exists() and self._aside(".old").exists():
            try:  # a writer stopped between its two renames
                self._aside(".old").rename(self.path)
            except OSError as e:
                problem = f"cannot restore the checkpoint {str(self.path)!r}: {e}"
        self._agree(problem)
        here = self.path.exists()
        if self.sharded:
            import torch.distributed as dist

            seen: list[Any] = [None] * self.world
            dist.all_gather_object(seen, here, group=self.table.group)
            if len(set(seen)) > 1:
                self._agree(f"the checkpoint {str(self.path)!r} is there for processes {[k for k, s in enumerate(seen) if s]} "
                            f"and not for {[k for k, s in enumerate(seen) if not s]}: put --out on a file system every "
                            "process sees (on several machines, a shared one)")
        if not here:
            return None
        head: Any = None
        try:
            head = self._head()
            self._restore()
        except PolymemError as e:
            if not self.sharded:
                raise
            problem = str(e)
        self._agree(problem)
        return {"step": int(head["step"]), "losses": list(head["losses"]), "train_s": float(head["train_s"]),
                "world": int(head.get("world", 1))}

    def _head(self) -> dict[str, Any]:
        from polymem._io import read_json
        from polymem._schema import validate

        p = self.path
        try:
            head = read_json(p / "state.json", what="checkpoint state", fix="remove the checkpoint to start over")
        except OSError as e:
            raise FormatError(f"{str(p)!r} is not a readable checkpoint ({e}); remove it to start over") from None
        if not isinstance(head, dict) or head.get("format") != FORMAT or head.get("version") != VERSION:
            found = (f"format {head.get('format')!r} version {head.get('version')!r}" if isinstance(head, dict)
                     else "no format")
            raise FormatError(f"{str(p)!r} is not a polymem training checkpoint this version reads ({found}; this "
                              f"polymem reads {FORMAT!r} version {VERSION}: an older or newer polymem wrote it); "
                              "remove it to start over, or resume with the polymem that wrote it")
        validate(head, state_schema(self.steps), where=str(p / "state.json"),
                 fix="the checkpoint was edited or is damaged; remove it to start over")
        if head["key"] != self.key:
            raise PolymemError(f"{str(p)!r} is a checkpoint of other settings (model, corpus, table or budget); remove "
                               "it to start over, or run with the settings it was made with")
        if len(head["losses"]) != head["step"]:
            raise FormatError(f"{str(p / 'state.json')!r}: it records {len(head['losses'])} losses for step "
                              f"{head['step']} (one per step); the checkpoint was edited or is damaged: remove it to "
                              "start over")
        return head

    def _restore(self) -> None:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        from polymem._io import load_regular_safetensors

        p = self.path
        try:
            dense = load_regular_safetensors(p / "dense.safetensors", what="checkpoint dense state", load=load_file,
                                             fix="remove the checkpoint to start over")
            self._check_dense(dense)
            for name, m in self.modules.items():
                m.load_state_dict({k[len(name) + 1:]: v for k, v in dense.items() if k.startswith(name + ".")})
            sd = self.opt.state_dict()
            for i in sd["state"].keys() | {int(k.split(".")[1]) for k in dense if k.startswith("adam.")}:
                sd["state"][i] = {k.split(".", 2)[2]: v for k, v in dense.items() if k.startswith(f"adam.{i}.")}
            self.opt.load_state_dict(sd)
            if self.table.trainable:
                self._read_rows(p / "table")
            if self.topt is not None:
                dev = self.table.weight.device
                self.topt.state[self.table.weight] = {k: v.to(dev) for k, v in self._read_row_state().items()}
        except (OSError, KeyError, RuntimeError, ValueError, SafetensorError) as e:
            raise FormatError(f"{str(p)!r} does not fit this run ({type(e).__name__}: {e}); remove it to start "
                              "over") from None

    def _check_dense(self, dense: Mapping[str, torch.Tensor]) -> None:
        """The dense file holds exactly this run's dense weights (names, shapes, dtypes) and AdamW moments shaped
        like their parameters; ValueError naming the first tensor that does not fit."""
        want = {f"{name}.{k}": v for name, m in self.modules.items() for k, v in m.state_dict().items()}
        got = {k: v for k, v in dense.items() if not k.startswith("adam.")}
        if sorted(got) != sorted(want):
            extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            raise ValueError(f"its dense state lacks {missing[:3]} and holds {extra[:3]} (of this run's {len(want)} weights)")
        for k, v in want.items():
            if got[k].shape != v.shape or got[k].dtype != v.dtype:
                raise ValueError(f"its weight {k!r} is {got[k].dtype} {tuple(got[k].shape)}; this run's is "
                                 f"{v.dtype} {tuple(v.shape)}")
        params = [q for g in self.opt.param_groups for q in g["params"]]
        for k, v in dense.items():
            if not k.startswith("adam."):
                continue
            parts = k.split(".", 2)
            i = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else -1
            if not 0 <= i < len(params):
                raise ValueError(f"its optimizer state {k!r} names no parameter of this run's {len(params)}")
            if parts[2] == "step":
                if v.numel() != 1 or not torch.isfinite(v).all() or float(v) < 0:
                    raise ValueError(f"its optimizer state {k!r} is not one step count")
            elif v.shape != params[i].shape or not v.is_floating_point():
                raise ValueError(f"its optimizer moment {k!r} is {v.dtype} {tuple(v.shape)}; its parameter is "
                                 f"{tuple(params[i].shape)}")

    def _read_rows(self, src: Path) -> None:
        """This process's rows [lo, hi) from the checkpoint's asset, a block of pages at a time."""
        from polymem.asset import MemoryAsset

        a = MemoryAsset.open(src)
        t = self.table
        if a.layout.to_dict() != t.layout.to_dict() or a.spec.to_dict() != t.spec.to_dict():
            raise ValueError(f"its table has layout {a.layout.to_dict()}, this run's {t.layout.to_dict()}")
        rpp, block = t.layout.rows_per_page, 4096
        w = t.weight
        with torch.no_grad():
            for pa in range(self.lo // rpp, self.hi // rpp, block):
                pb = min(self.hi // rpp, pa + block)
                rows = np.asarray(a.read_pages(np.arange(pa, pb)), np.float32).reshape(-1, t.layout.head_dim)
                w[pa * rpp - self.lo:pb * rpp - self.lo].copy_(torch.from_numpy(rows))

    def _read_row_state(self) -> dict[str, torch.Tensor]:
        """The row-wise state of rows [lo, hi) from the row files that overlap them (written by any number of
        processes)."""
        from safetensors import safe_open

        from polymem._io import regular_path

        files = sorted((int(m[1]), int(m[2]), f) for f in self.path.iterdir() if (m := _ROWS.fullmatch(f.name)))
        edges = [files[0][0] if files else -1] + [b for _, b, _ in files]
        if edges[0] != 0 or any(a != e for (a, _, _), e in zip(files, edges)) or edges[-1] != self.table.layout.num_rows:
            raise ValueError(f"its row files cover {[(a, b) for a, b, _ in files]}, not rows [0, {self.table.layout.num_rows})")
        out: dict[str, list[torch.Tensor]] = {}
        for a, b, f in files:
            lo, hi = max(a, self.lo), min(b, self.hi)
            if lo >= hi:
                continue
            with regular_path(f, what="checkpoint row file", fix="remove the checkpoint to start over") as fp, \
                    safe_open(fp, framework="pt") as g:
                if sorted(g.keys()) != ["n", "v"]:
                    raise ValueError(f"its row file {f.name!r} holds {sorted(g.keys())[:4]}, not the tensors ['n', 'v']")
                for k in g.keys():
                    sl = g.get_slice(k)
                    shape, dtype = list(sl.get_shape()), sl.get_dtype()
                    if shape != [b - a] or dtype != {"v": "F32", "n": "I32"}[k]:
                        raise ValueError(f"its row file {f.name!r} holds {k!r} as {dtype} {shape}; rows [{a}, {b}) "
                                         f"need {{'v': 'F32', 'n': 'I32'}}[{k!r}] [{b - a}]")
                    out.setdefault(k, []).append(sl[lo - a:hi - a])
        return {k: torch.cat(v) for k, v in out.items()}

    # -------------------------------------------------------------------------------------------- helpers
    def _aside(self, suffix: str) -> Path:
        return self.path.with_name(self.path.name + suffix)

    def _agree(self, problem: str | None) -> None:
        """Raise in every process when any has a problem (the first one's words); across processes, a barrier."""
        if self.sharded:
            import torch.distributed as dist

            got: list[Any] = [None] * self.world
            dist.all_gather_object(got, problem, group=self.table.group)
            problem = next((g for g in got if g), None)
        if problem:
            raise PolymemError(problem)


def state_schema(steps: int | None = None) -> Any:
    """The declared schema of ``state.json``: a checkpoint is written after step 1..steps-1 (never after the last:
    then the asset is written), with one loss per step (a diverged run's may be inf or NaN), non-negative seconds
    and at least one process."""
    from polymem._schema import Const, Int, ListOf, Num, Obj, Str

    last = steps - 1 if steps is not None else 10**12
    return Obj({"format": Const((FORMAT,)), "version": Const((VERSION,)), "key": Str(256), "step": Int(1, last),
                "world": Int(1, 1 << 20), "losses": ListOf(Num(finite=False), max_len=max(last, 0)),
                "train_s": Num(0)})


def check_checkpoint_path(path: str | Path) -> None:
    """Refuse, before a run starts, a checkpoint path (``OUT.ckpt``, or its ``.tmp``/``.old`` sibling) that is a
    symbolic link: a checkpoint is replaced and removed whole, and polymem never does that through a link."""
    p = Path(path)
    for q in (p, p.with_name(p.name + ".tmp"), p.with_name(p.name + ".old")):
        if q.is_symlink():
            raise PolymemError(f"the checkpoint path {str(q)!r} is a symbolic link (to {os.readlink(q)!r}); polymem "
                               "replaces and removes a checkpoint whole, never through a link. Remove the link "
                               f"(rm {str(q)!r}) or choose another --out")


def remove_checkpoint(path: Path, distributed: bool = False) -> None:
    """Remove a run's checkpoint once its asset is written (across processes: process 0, after every process)."""
    if distributed:
        import torch.distributed as dist

        dist.barrier()
        if dist.get_rank() != 0:
            return
    check_checkpoint_path(path)
    for p in (path, path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")):
        if p.exists():
            shutil.rmtree(p)
