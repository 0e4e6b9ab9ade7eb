"""What the asset operations share (:mod:`polymem.asset.ops`; :mod:`polymem.engines.convert`, which ops.convert
calls for engine tables): the progress callback, the output check, the corpus as a list of texts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

from polymem.errors import PolymemError

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def _noop(phase: str, done: int, total: int) -> None:
    return None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _documents(corpus: Any) -> list[str]:
    from polymem.corpus import Corpus

    if isinstance(corpus, (str, os.PathLike)):
        corpus = [corpus]
    texts = [d.text for d in Corpus([str(c) for c in corpus])]
    if not texts:
        raise PolymemError(f"no documents found in {[str(c) for c in corpus]}; pass .txt/.md/.jsonl(.gz) files or folders")
    return texts


def _check_out(out: Any, overwrite: bool) -> Path:
    dest = Path(os.fspath(out))
    if dest.exists() and not overwrite:
        raise PolymemError(f"{str(dest)!r} already exists; pass overwrite=True (CLI: --overwrite) or pick another path")
    return dest
