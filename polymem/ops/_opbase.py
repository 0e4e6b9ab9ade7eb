"""What the asset operations share (:mod:`polymem.ops`, and :mod:`polymem.engines.convert` above them): the
progress callback, the output check, the corpus as a list of texts, a conversion's target layout.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

from polymem.errors import PolymemError, SpecMismatchError
from polymem.hash.layout import Layout

if TYPE_CHECKING:
    from polymem.asset.core import MemoryAsset

Progress = Callable[[str, int, int], None]  # (phase, done, total)
AssetLike = Union["MemoryAsset", str, "os.PathLike[str]"]  # an opened asset, or where to open one


def _noop(phase: str, done: int, total: int) -> None:
    return None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _documents(corpus: Any) -> list[str]:
    from polymem.corpus import Corpus

    if isinstance(corpus, (str, os.PathLike)):
        corpus = [corpus]
    reader = Corpus([str(c) for c in corpus])
    texts = [d.text for d in reader]
    if not texts:
        raise reader.nothing_read()
    return texts


def _check_out(out: str | os.PathLike[str], overwrite: bool) -> Path:
    dest = Path(os.fspath(out))
    if dest.exists() and not overwrite:
        raise PolymemError(f"{str(dest)!r} already exists; pass overwrite=True (CLI: --overwrite) or pick another path")
    return dest


def target_layout(layout: Layout | None, *, heads: int, head_dim: int, source_rows: int, source: str) -> Layout:
    """The target layout of a conversion (``convert``, ``convert_engine``): ``layout`` checked against the source
    (``heads`` per order of width ``head_dim``: head k of order n goes to head k of order n), or by default
    page-local with those heads and width and about ``source_rows`` rows. ``source`` names it in the error."""
    if layout is None:
        layout = Layout.for_params(max(source_rows, heads * 4) * head_dim, heads=heads, slots=4, head_dim=head_dim)
    if layout.heads != heads or layout.head_dim != head_dim:
        raise SpecMismatchError(
            f"target layout has K={layout.heads} heads of r={layout.head_dim}; {source} has K={heads} heads of "
            f"r={head_dim} per order: head k of order n goes to head k of order n, so K and r must match")
    return layout
