"""What polymem keeps on disk for pretrained models, listed and cleared (``polymem models``).

One layout under ``<cache dir>/models/`` (the cache dir is ``$POLYMEM_CACHE_DIR``, else ``~/.cache/polymem``):

* ``<name>.gguf`` — a builtin model's GGUF assembled from its packages (Gemma 3 270M), checked by the package;
* ``tokenizers/<gguf sha256>-transformers-<v>-tokenizers-<v>/`` — the tokenizer transformers converts from a GGUF
  (:mod:`polymem.models._tokcache`);
* ``weights/<gguf sha256>-<dtype>-transformers-<v>/`` — a GGUF's de-quantised weights as safetensors
  (:mod:`polymem.models._weightcache`);
* ``by-name/<model>/tokenizer.json`` — a builtin model's tokenizer under its name, for tokenizer options
  (``coverage -t smollm2-135m``; :func:`model_tokenizer_file`), copied from its ``tokenizers/`` entry.

Each entry folder holds a manifest (``polymem-*-cache.json``) naming its source file and every file's size and
crc32c; it is checked on every read, and a damaged entry is rebuilt from the source. Hidden ``.KEY.tmp-PID-…``
folders are entries being written; one whose process is gone is a leftover that ``clear`` removes.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polymem._paths import cache_root
from polymem.errors import PolymemError
from polymem.models import _tokcache, _weightcache
from polymem.models._entry import entries, leftovers, tree_bytes

KINDS = {"weights": _weightcache.MANIFEST, "tokenizers": _tokcache.MANIFEST}


@dataclass(frozen=True)
class CacheEntry:
    """One thing in the model cache: ``kind`` is "weights", "tokenizers", "by-name", "gguf" or "leftover"."""

    kind: str
    path: Path
    bytes: int
    source: str  # the model file it was made from ("" when unknown)
    detail: str  # dtype and versions, or why it is a leftover

    @property
    def key(self) -> str:
        return self.path.name


def models_dir() -> Path:
    """``<cache dir>/models``."""
    return cache_root() / "models"


# the names the cache gives its entries; a folder named otherwise under models/ is not the cache's and is never
# listed or removed
NAMES = {"weights": re.compile(r"[0-9a-f]{64}-[A-Za-z0-9_]+-transformers-[^/]+"),
         "tokenizers": re.compile(r"[0-9a-f]{64}-transformers-[^/]+-tokenizers-[^/]+"),
         "by-name": re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")}


def _manifest(path: Path, name: str) -> dict[str, Any]:
    """What a listing shows of an entry's manifest (read bounded, never waiting on a FIFO; {} when unreadable)."""
    from polymem._io import read_json
    from polymem.models._entry import MAX_MANIFEST_BYTES

    try:
        meta = read_json(path / name, what="manifest", max_bytes=MAX_MANIFEST_BYTES)
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _check_not_linked(root: Path) -> None:
    """Refuse a cache whose ``models/<kind>`` folder is a symbolic link: what is under it is not the cache's own, and
    ``clear`` must never remove a folder elsewhere."""
    for kind in (*KINDS, "by-name"):
        p = root / kind
        if p.is_symlink():
            raise PolymemError(f"the model cache folder {str(p)!r} is a symbolic link (to {os.readlink(p)!r}); polymem "
                               "lists and removes only the cache's own folders, never through a link. Remove the link "
                               f"(rm {str(p)!r}); to keep models on another disk, point POLYMEM_CACHE_DIR there")


def list_entries() -> list[CacheEntry]:
    """Every entry of the model cache with its size on disk (damaged entries too: their manifest may be gone)."""
    root = models_dir()
    _check_not_linked(root)
    out: list[CacheEntry] = []
    if root.is_dir():
        out += [CacheEntry("gguf", p, p.stat().st_size, p.name, "assembled from its packages")
                for p in sorted(root.glob("*.gguf")) if p.is_file()]
    for kind, manifest in KINDS.items():
        for p in entries(root / kind, NAMES[kind]):
            meta = _manifest(p, manifest)
            what = " ".join(str(meta[k]) for k in ("dtype",) if k in meta)
            versions = f"transformers {meta['transformers']}" if "transformers" in meta else "no manifest (damaged)"
            out.append(CacheEntry(kind, p, tree_bytes(p), str(meta.get("source", "")),
                                  f"{what}, {versions}" if what else versions))
        out += [CacheEntry("leftover", p, tree_bytes(p), "", "an interrupted write")
                for p in leftovers(root / kind)]
    out += [CacheEntry("by-name", p, tree_bytes(p), p.name, "a builtin model's tokenizer.json, for tokenizer options")
            for p in entries(root / "by-name", NAMES["by-name"])]
    return out


def clear(selectors: list[str] | None = None, *, include_gguf: bool = False) -> list[CacheEntry]:
    """Remove cache entries and return them. ``selectors``: entry keys (or their first ≥ 8 characters) or source
    file names; none: every weights and tokenizers entry and every leftover. Assembled GGUFs go only with
    ``include_gguf`` (or when named). A selector that matches nothing is an error and removes nothing."""
    found = list_entries()
    if selectors:
        chosen: list[CacheEntry] = []
        for sel in selectors:
            hit = [e for e in found if e.source == sel or e.key == sel or (len(sel) >= 8 and e.key.startswith(sel))]
            if not hit:
                names = sorted({e.source for e in found if e.source})
                raise PolymemError(f"no model cache entry matches {sel!r}; pass a key (or its first 8+ characters) "
                                   f"or a source file ({', '.join(names) or 'the cache is empty'}); "
                                   "`polymem models` lists them")
            chosen += [e for e in hit if e not in chosen]
    else:
        chosen = [e for e in found if e.kind != "gguf" or include_gguf]
    for e in chosen:
        if e.path.is_symlink():  # listed as the cache's own a moment ago: never followed now
            continue
        if e.path.is_dir():
            shutil.rmtree(e.path)
        else:
            e.path.unlink()
    return chosen


def model_tokenizer_file(name: str) -> Path:
    """The tokenizer.json of a builtin model, for every place that takes a tokenizer spec
    (``coverage -t smollm2-135m -r gemma3-270m``): the GGUF's converted tokenizer (from its cache entry, converted
    on first use), copied to ``models/by-name/<name>/tokenizer.json`` so that it loads under the model's name and
    with the model's fingerprint (the weights are not loaded)."""
    import transformers

    from polymem._io import atomic_path
    from polymem.models.registry import BUILTIN_MODELS, _check_gguf_deps, _gguf_loading, _sha256, resolve_builtin
    from polymem.models._entry import file_crc32c
    from polymem.models._tokcache import cache_dir, gguf_tokenizer

    if name not in BUILTIN_MODELS:
        raise PolymemError(f"{name!r} is not a builtin model; accepted: {', '.join(BUILTIN_MODELS)}")
    _check_gguf_deps(f"the tokenizer of the builtin model {name!r}")
    gguf = resolve_builtin(name)
    sha = _sha256(gguf)
    with _gguf_loading(transformers):
        got = gguf_tokenizer(transformers, str(gguf.parent), gguf.name, sha)  # the entry (converted once)
    src = cache_dir(sha) / "tokenizer.json"
    target = models_dir() / "by-name" / name / "tokenizer.json"
    if not src.is_file():  # the cache could not take the entry: write the tokenizer just converted
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(target) as tmp:
            tmp.write_text(got.hf().backend_tokenizer.to_str(), encoding="utf-8")
        return target
    if not target.is_file() or file_crc32c(target) != file_crc32c(src):
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(target) as tmp:
            shutil.copyfile(src, tmp)
    return target
