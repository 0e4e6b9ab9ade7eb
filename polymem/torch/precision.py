"""Training precision from what the device does natively.

bf16 autocast pays only where the hardware does bf16 matrix arithmetic fast: on a CPU without bf16 instructions
PyTorch emulates bf16 with conversions around fp32 kernels, which measured 17x *slower* than fp32 on a 2-core
AVX2-only AMD EPYC (~110 s per step with bf16 against ~6.5 s in fp32). Having ``avx512_bf16`` (a bf16 dot
product instruction, no matrix unit) is not enough either: on the development machine's Xeon (avx512_bf16, no AMX)
bf16 autocast trained at 0.72x the fp32 speed (``benchmarks/bench_precision.py``, docs/results/bench_precision.json).
So ``auto`` picks bf16 only on

* a CPU with a bf16 matrix unit: ``amx_bf16`` (x86, from ``/proc/cpuinfo``);
* a CUDA device for which ``torch.cuda.is_bf16_supported()`` holds (Ampere and later);

and fp32 everywhere else (``avx512_bf16`` alone, aarch64 ``bf16``, AVX2, unknown), and says why. ``fp32``/``bf16`` override it (a forced bf16 on a CPU without native bf16
runs, with a warning in the reason). The table and its row-wise updates stay fp32 in every case.

A frozen pretrained backbone (``workload="backbone"``: ``eval``, ``generate``, ``train --model``, ``attach``,
``transfer --model``) is another workload: large matrix products and no weight gradients. There the bf16 dot
product instruction alone pays: on a 2-core AMD EPYC with ``avx512_bf16`` and no AMX, SmolLM2-135M's forward
over 512 tokens ran 1.5-1.7x faster in bf16 than in fp32, and forward + backward to a site 1.5-2x
(``benchmarks/bench_backbone.py``). So for the backbone ``auto`` picks bf16 on x86 with ``avx512_bf16`` or
``amx_bf16`` (and CUDA with bf16), fp32 elsewhere (AVX2-only: emulated, 17x slower; aarch64 ``bf16``: not
measured). :func:`bf16_backbone` makes a loaded model compute that way.

Not here: the autocast context of the from-scratch loop (:func:`polymem.recipes.train._autocast`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from polymem.errors import PolymemError

if TYPE_CHECKING:
    import torch

PRECISIONS = ("auto", "fp32", "bf16")
# CPU flags (as /proc/cpuinfo spells them) that mean bf16 arithmetic in hardware; only the matrix unit makes
# bf16 autocast faster than fp32 for training (measured: avx512_bf16 alone 0.72x fp32)
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
FAST_BF16_CPU_FLAGS = ("amx_bf16",)
# for a frozen backbone (big matrix products, no weight gradients) the x86 bf16 dot product pays too (measured)
BACKBONE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
WORKLOADS = ("train", "backbone")


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The CPU flag set from ``/proc/cpuinfo`` text: the ``flags`` lines (x86) or ``Features`` lines (ARM), first
    processor's block is enough (all cores of a Linux VM report the same set; the union is taken anyway)."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, val = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            flags.update(val.split())
    return frozenset(flags)


@functools.lru_cache(maxsize=1)
def host_cpu_flags() -> frozenset[str] | None:
    """This machine's CPU flags from /proc/cpuinfo, or None where that file does not exist (macOS, Windows)."""
    p = Path("/proc/cpuinfo")
    try:
        return parse_cpu_flags(p.read_text(errors="replace"))
    except OSError:
        return None


def choose_precision(requested: str, device_type: str, *, cpu_flags: Iterable[str] | None = None,
                     cuda_bf16: bool | None = None, workload: str = "train") -> tuple[str, str]:
    """("bf16" | "fp32", reason) for ``requested`` ("auto", "fp32", "bf16") on a ``device_type`` ("cpu", "cuda", …).

    ``cpu_flags``: the CPU's flag set (None: unknown); ``cuda_bf16``: whether the CUDA device supports bf16
    (None: unknown); ``workload``: "train" (a model trained from scratch) or "backbone" (a frozen pretrained
    model; see the module docstring). A pure function of its arguments: :func:`resolve_precision` fills them in
    from this machine.
    """
    if requested not in PRECISIONS:
        raise PolymemError(f"precision {requested!r} is unknown; accepted: {', '.join(PRECISIONS)} (e.g. --precision auto)")
    if workload not in WORKLOADS:
        raise PolymemError(f"workload {workload!r} is unknown; accepted: {', '.join(WORKLOADS)}")
    if device_type == "cuda":
        native = bool(cuda_bf16)
        what = "the CUDA device supports bf16" if native else "the CUDA device has no bf16 support (pre-Ampere)"
    elif device_type == "cpu":
        if cpu_flags is None:
            native, what = False, "the CPU's flags are unknown (no /proc/cpuinfo)"
        else:
            flags = set(cpu_flags)
            fast = sorted(flags & set(FAST_BF16_CPU_FLAGS if workload == "train" else BACKBONE_BF16_CPU_FLAGS))
            some = sorted(flags & set(NATIVE_BF16_CPU_FLAGS))
            native = bool(fast)
            if fast and workload == "backbone":
                what = (f"the CPU does bf16 natively ({', '.join(fast)}): a frozen model's forward measured 1.5x "
                        f"fp32 or more with avx512_bf16 alone")
            elif fast:
                what = f"the CPU has a bf16 matrix unit ({', '.join(fast)})"
            elif some:
                what = (f"the CPU has bf16 instructions ({', '.join(some)}) but no AMX matrix unit: bf16 autocast "
                        f"measured 0.72x the fp32 training speed on such a CPU")
            else:
                what = ("the CPU has no native bf16 (no avx512_bf16/amx_bf16 flag): bf16 autocast would be emulated, "
                        "measured 17x slower than fp32 on an AVX2-only CPU")
    else:
        native, what = False, f"device type {device_type!r} is not known to this check"
    if requested == "auto":
        return ("bf16" if native else "fp32"), f"auto: {what}"
    if requested == "bf16" and not native:
        return "bf16", f"bf16 requested although {what}"
    return requested, f"{requested} requested ({what})"


def resolve_precision(requested: str, device: "str | torch.device", *, workload: str = "train") -> tuple[str, str]:
    """:func:`choose_precision` for a torch device (or its name) on this machine."""
    import torch

    dev = torch.device(device) if isinstance(device, str) else device
    cuda_bf16 = None
    if dev.type == "cuda" and torch.cuda.is_available():
        cuda_bf16 = bool(torch.cuda.is_bf16_supported())
    return choose_precision(requested, dev.type, cpu_flags=host_cpu_flags() if dev.type == "cpu" else None,
                            cuda_bf16=cuda_bf16, workload=workload)


def bf16_backbone(model: Any) -> None:
    """Make a loaded (frozen) model compute in bf16 where it counts, in place.

    Every ``nn.Linear`` weight (and bias) of ``model`` is stored in bf16 once (no cast per forward, half the
    memory) and ``model.forward`` runs under ``torch.autocast(bf16)``: matrix products take bf16 inputs, while
    what autocast keeps in fp32 stays fp32 — the embeddings, the norms, the residual stream (a bf16 block
    output added to the fp32 stream gives fp32), softmax and the loss. An output layer tied to the input
    embedding is untied first (the embedding keeps its fp32 weight). Modules attached later (memory sites) keep
    fp32 weights; under the autocast they compute in bf16 and add their output in the stream's dtype.

    A forward outside ``model.forward``'s autocast (a Linear called on its own with fp32 input) fails loudly
    ("expected … BFloat16") rather than computing something else."""
    import functools

    import torch

    dev = next(model.parameters()).device.type
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    in_emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if out_emb is not None and in_emb is not None and out_emb.weight is in_emb.weight:
        out_emb.weight = torch.nn.Parameter(in_emb.weight.detach().clone(), requires_grad=False)
        if getattr(model.config, "tie_word_embeddings", None):
            model.config.tie_word_embeddings = False  # so that nothing ties them again
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight.data = m.weight.data.to(torch.bfloat16)
            if m.bias is not None:
                m.bias.data = m.bias.data.to(torch.bfloat16)
    forward = model.forward

    @functools.wraps(forward)
    def bf16_forward(*args, **kwargs):
        with torch.autocast(dev, dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    model.forward = bf16_forward
    model.polymem_precision = "bf16"  # what load_model made of it (read by reports)
