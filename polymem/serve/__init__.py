"""The page service: a bounded RAM cache of an asset's stored chunks, filled by reads that overlap compute
(:mod:`polymem.serve.service`). Serves tables larger than RAM to :mod:`polymem.torch.pages`.

Public: :class:`PageService`, :func:`service_for` (imported on first use: ``import polymem.serve`` loads nothing).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PageService", "service_for"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from polymem.serve import service

        return getattr(service, name)
    raise AttributeError(f"module 'polymem.serve' has no attribute {name!r}")
