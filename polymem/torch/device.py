"""``--device``: one spelling for every command, and one line (not a traceback) for a device this machine lacks."""

from __future__ import annotations

import torch

from polymem.errors import PolymemError

ACCEPTED = "auto (CUDA when present, else CPU), cpu, cuda, cuda:N"


def resolve_device(text: str | torch.device) -> torch.device:
    """``"auto"`` -> CUDA when torch sees a CUDA device, else the CPU; ``"cpu"``, ``"cuda"``, ``"cuda:N"`` as given,
    once checked: a CUDA device on a machine (or a torch build) without one is a PolymemError naming the fix."""
    if isinstance(text, torch.device):
        text = str(text)
    spec = str(text).strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except (RuntimeError, ValueError):
        raise PolymemError(f"--device {text!r} is not a device; accepted: {ACCEPTED}") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise PolymemError(f"--device {text!r}: polymem runs on cpu or cuda; accepted: {ACCEPTED}")
    if not torch.cuda.is_available():
        build = "a CPU-only torch build" if torch.version.cuda is None else "no CUDA device visible"
        raise PolymemError(f"--device {text!r}: this machine has no CUDA device ({build}, torch {torch.__version__}); "
                           "pass --device cpu (or auto, which picks CUDA where there is one)")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise PolymemError(f"--device {text!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                           f"cuda:0..cuda:{torch.cuda.device_count() - 1}")
    return dev
