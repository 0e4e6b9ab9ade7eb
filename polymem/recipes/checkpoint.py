"""Resumable training on a frozen backbone: the state of :func:`polymem.recipes.frozen.train_site` every few steps.

A checkpoint is a folder (``<out>.ckpt`` beside the asset ``polymem train --model`` writes): ``state.safetensors``
(the table's rows when they train, the sites' weights, AdamW's moments, the row-wise optimizer's per-row state)
and ``state.json`` (format, the step reached, the losses so far, the training seconds, and a key of everything
that determines the run). It is written to a temporary folder and renamed over the previous one, so a run killed
at any moment leaves the last whole checkpoint. A run started again with the same settings continues from it and
ends with the same table, bit for bit, as one that never stopped (the data order is a function of the seed and
the step); a checkpoint of other settings is refused. Nothing is unpickled.

Not here: the training step (:mod:`polymem.recipes.frozen`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from polymem.errors import FormatError, PolymemError

FORMAT = "polymem.frozen-checkpoint"


def save_checkpoint(path: Path, *, key: str, step: int, losses: list[float], train_s: float, handle: Any,
                    opt: torch.optim.Optimizer, topt: Any) -> None:
    """Write the state after ``step`` steps (see the module docstring); the previous checkpoint is replaced whole."""
    from safetensors.torch import save_file

    from polymem._io import atomic_write_json

    tensors: dict[str, torch.Tensor] = {f"sites.{k}": v.detach().cpu().contiguous()
                                        for k, v in handle.sites.state_dict().items()}
    if handle.table.trainable:
        tensors["table"] = handle.table.weight.detach().cpu().contiguous()
    sd = opt.state_dict()
    for i, st in sd["state"].items():
        for k, v in st.items():
            tensors[f"adam.{i}.{k}"] = torch.as_tensor(v).detach().cpu().contiguous()
    if topt is not None:
        st = topt.state.get(handle.table.weight, {})
        for k, v in st.items():
            tensors[f"rows.{k}"] = v.detach().cpu().contiguous()
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "state.safetensors"))
    atomic_write_json(tmp / "state.json", {"format": FORMAT, "version": 1, "key": key, "step": int(step),
                                            "losses": [float(x) for x in losses], "train_s": float(train_s)}, fsync=True)
    old = path.with_name(path.name + ".old")
    if path.exists():
        if old.exists():
            shutil.rmtree(old)
        path.rename(old)
    tmp.rename(path)
    if old.exists():
        shutil.rmtree(old)


def load_checkpoint(path: Path, *, key: str, handle: Any, opt: torch.optim.Optimizer, topt: Any) -> dict[str, Any] | None:
    """Restore the state into ``handle`` and the optimizers; returns ``{"step", "losses", "train_s"}``, or None when
    there is no checkpoint. A checkpoint of other settings, or a damaged one, is refused with the way out."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.exists():
        old = path.with_name(path.name + ".old")  # a writer stopped between its two renames
        if not old.exists():
            return None
        old.rename(path)
    try:
        head = json.loads((path / "state.json").read_text())
        tensors = load_file(str(path / "state.safetensors"))
    except (OSError, ValueError, SafetensorError) as e:
        raise FormatError(f"{str(path)!r} is not a readable checkpoint ({e}); remove it to start over") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise FormatError(f"{str(path)!r} is not a polymem training checkpoint; remove it to start over")
    if head.get("key") != key:
        raise PolymemError(f"{str(path)!r} is a checkpoint of other settings (model, corpus, table or budget); remove "
                           "it to start over, or run with the settings it was made with")
    try:
        handle.sites.load_state_dict({k[len("sites."):]: v for k, v in tensors.items() if k.startswith("sites.")})
        if handle.table.trainable:
            with torch.no_grad():
                handle.table.weight.copy_(tensors["table"])
        sd = opt.state_dict()
        for i in sd["state"].keys() | {int(k.split(".")[1]) for k in tensors if k.startswith("adam.")}:
            sd["state"][i] = {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"adam.{i}.")}
        opt.load_state_dict(sd)
        if topt is not None and "rows.v" in tensors:
            dev = handle.table.weight.device
            topt.state[handle.table.weight] = {"v": tensors["rows.v"].to(dev), "n": tensors["rows.n"].to(dev)}
    except (KeyError, RuntimeError, ValueError) as e:
        raise FormatError(f"{str(path)!r} does not fit this run ({type(e).__name__}: {e}); remove it to start over") from None
    return {"step": int(head["step"]), "losses": list(head["losses"]), "train_s": float(head["train_s"])}
