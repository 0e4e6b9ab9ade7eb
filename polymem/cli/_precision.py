"""``--precision auto|fp32|bf16`` and the deprecated ``--bf16/--no-bf16`` of `polymem train` and `polymem transfer`."""

from __future__ import annotations

import sys

from polymem.errors import PolymemError


def precision_option(precision: str, bf16: bool | None) -> str:
    """The precision request from the two options; the deprecated flag maps onto --precision with a warning."""
    from polymem.torch.precision import PRECISIONS

    if precision not in PRECISIONS:
        raise PolymemError(f"--precision {precision!r} is unknown; accepted: {', '.join(PRECISIONS)} (e.g. --precision auto)")
    if bf16 is None:
        return precision
    mapped = "bf16" if bf16 else "fp32"
    if precision not in ("auto", mapped):
        raise PolymemError(f"--{'' if bf16 else 'no-'}bf16 contradicts --precision {precision}; drop the deprecated "
                           f"--bf16/--no-bf16 and pass --precision only")
    print(f"warning: --{'' if bf16 else 'no-'}bf16 is deprecated; use --precision {mapped}", file=sys.stderr)
    return mapped


def say_precision(cfg) -> tuple[str, str]:
    """Print which training precision was chosen and why (one line); returns (precision, reason)."""
    from rich.console import Console
    from polymem.cli._display import escape

    name, why = cfg.precision_choice()
    Console().print(f"precision: [bold]{name}[/] — {escape(why)}", highlight=False, soft_wrap=True)
    return name, why


def backbone_precision(requested: str, device) -> str:
    """The precision a frozen pretrained model computes in (``--precision`` of the real-model commands), chosen by
    :func:`polymem.torch.precision.resolve_precision` for the backbone workload; one line says which and why, and
    a bf16 forced where the device does not do it natively is a warning on stderr. Returns "bf16" or "fp32"."""
    from rich.console import Console

    from polymem.cli._display import escape
    from polymem.torch.precision import PRECISIONS, resolve_precision

    if requested not in PRECISIONS:
        raise PolymemError(f"--precision {requested!r} is unknown; accepted: {', '.join(PRECISIONS)} (e.g. --precision auto)")
    name, why = resolve_precision(requested, device, workload="backbone")
    if requested == "bf16" and "although" in why:
        print(f"warning: --precision bf16: {why}; --precision fp32 (or auto) is faster here", file=sys.stderr)
    Console().print(f"precision: [bold]{name}[/] — {escape(why)}", highlight=False, soft_wrap=True)
    return name
