"""The released engines' n-gram tables: their addressing as data (``addressing(name, ...)``).

    >>> a = addressing("qwen3.8-ple", eos_id=0)
    >>> a.num_rows, a.rows([5, 6, 7]).shape
    ((320001536,), (3, 1, 16))

Registered: ``"deepseek-v4.1"`` (DeepSeek-V4.1-Flash's Engram, two layers; needs the DeepSeek tokenizer) and
``"qwen3.8-ple"`` (Qwen3.8-Flash-Next's PLE table; needs the EOS id). A spec is recorded as plain JSON with
``to_json()`` and read back with ``EngineAddressing.from_json``. docs/engines.md describes both engines.
FP8 row helpers (E4M3 with E8M0 scales) are in :mod:`polymem.asset.fp8`; an engine's table inside an asset
is :mod:`polymem.asset.engine_table`, import and export of the released layouts :mod:`polymem.engines.io`.
"""

from __future__ import annotations

from typing import Any, Callable

from polymem.asset.engine_table import EngineTableSpec
from polymem.engines import deepseek, qwen
from polymem.engines.addressing import ADDRESSING_FORMAT, EngineAddressing, LayerTable
from polymem.errors import PolymemError

ENGINES: dict[str, Callable[..., EngineAddressing]] = {
    deepseek.NAME: deepseek.addressing,
    qwen.NAME: qwen.addressing,
}


def addressing(name: str, *, tokenizer: Any = None, **options: Any) -> EngineAddressing:
    """The addressing of engine ``name``; ``options`` go to its constructor (``eos_id=`` for qwen3.8-ple)."""
    if name not in ENGINES:
        raise PolymemError(f"unknown engine {name!r}; registered: {', '.join(sorted(ENGINES))}")
    try:
        return ENGINES[name](tokenizer, **options)
    except TypeError as e:
        raise PolymemError(f"engine {name!r} does not take these options: {e}") from None


__all__ = ["ADDRESSING_FORMAT", "ENGINES", "EngineAddressing", "EngineTableSpec", "LayerTable", "addressing"]
