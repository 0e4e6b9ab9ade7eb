"""What a path names, asked by modules at every level: a URL or a local path, a corpus file's kind, and where
polymem keeps its cache. No I/O beyond reading one environment variable; imports nothing from polymem, so the
writers (:mod:`polymem._io`), the corpus readers (:mod:`polymem.sources`), the tokenizers and the hash cache can
all use it without importing each other.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def is_url(path: Any, *, remote: bool = False) -> bool:
    """Whether ``path`` is a URL (``scheme://…``: s3://, https://, memory://, file://). ``remote=True``: a URL
    that does not name a local file, i.e. not ``file://PATH`` (which is read and written as the local PATH).
    The one place that tells a URL from a local path; every other module asks this."""
    return (isinstance(path, str) and _URL.match(path) is not None
            and not (remote and path.startswith("file://")))


def kind_of(name: str) -> tuple[str | None, str | None]:
    """(kind: "text" | "jsonl" | "parquet" | None, compression: "gzip" | "zstd" | None) from a file name."""
    low = name.lower()
    comp = None
    for suffix, c in COMPRESSIONS.items():
        if low.endswith(suffix):
            low, comp = low[: -len(suffix)], c
            break
    if low.endswith((".txt", ".md")):
        return "text", comp
    if low.endswith(".jsonl"):
        return "jsonl", comp
    if low.endswith(".parquet") and comp is None:
        return "parquet", None
    return None, comp


def cache_root() -> Path:
    """polymem's cache directory: ``$POLYMEM_CACHE_DIR``, else the user cache dir (``~/.cache/polymem``)."""
    import platformdirs

    return Path(os.environ.get("POLYMEM_CACHE_DIR") or platformdirs.user_cache_dir("polymem"))
