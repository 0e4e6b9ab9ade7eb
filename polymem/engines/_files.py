"""The files of a checkpoint, opened safely: regular files only, and only those inside the checkpoint's folder.

    fd = open_regular(Path("ds/model-00001.safetensors"), "safetensors file")   # a descriptor, or one error line
    path = in_folder(Path("ds"), "model-00001.safetensors", "ds/model.safetensors.index.json")
    doc = read_json(Path("spec.json"), "addressing spec (--spec)")

A FIFO, socket, device or directory is refused from ``os.stat`` before it is opened (opening a FIFO waits for a
writer, forever); the file is opened with ``O_NONBLOCK`` and checked again with ``fstat``, so what is read is what
was checked (:func:`polymem._io.open_regular`, the one opener for files polymem reads). A file name read from a checkpoint (its index) is one plain name in the folder, and after links are
resolved the file lies in the folder; the one link layout followed out of it is the Hugging Face hub cache's
(``snapshots/REV/NAME -> ../../blobs/HASH``). Not here: what the files hold (``_safetensors``, ``_gguf``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from polymem.errors import FormatError, MissingError

MAX_JSON_BYTES = 64 << 20  # an index or an addressing spec: a few MB at most (DeepSeek-V3's index is 9 MB)
_FIX = "pass the checkpoint, index or spec file itself"


def open_regular(path: Path, what: str) -> int:
    """A read-only descriptor of ``path``, which must be a regular file (:func:`polymem._io.open_regular`, the one
    opener for files polymem reads); ``what`` names it in the error."""
    from polymem._io import open_regular as open_checked

    try:
        with open_checked(path, what=what, max_bytes=1 << 62, fix=_FIX) as f:
            return os.dup(f.fileno())
    except FileNotFoundError:
        raise MissingError(f"{what} {str(path)!r} does not exist; check the path (a checkpoint needs every file "
                           "its index names)", path) from None
    except FormatError:
        raise
    except (OSError, ValueError, UnicodeEncodeError) as e:  # a name too long, or not encodable
        raise FormatError(f"{what} {str(path)[:120]!r} cannot be a file here ({type(e).__name__}: {e}); pass a "
                          "path that exists") from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise FormatError(f"key {key!r} appears twice")
        out[key] = value
    return out


def parse_json(data: bytes, where: str) -> Any:
    """JSON values of ``data``; a repeated key in an object (JSON readers differ on which one wins) or text that is
    not JSON is one FormatError naming ``where``."""
    try:
        return json.loads(data, object_pairs_hook=_unique)
    except FormatError as e:
        raise FormatError(f"{where}: {e}; each key is given once. The file was edited or is damaged") from None
    except (ValueError, RecursionError) as e:
        raise FormatError(f"{where} is not JSON ({type(e).__name__}: {e}); pass the file as written") from None


def read_json(path: Path, what: str, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON document of the regular file ``path`` of at most ``limit`` bytes (FormatError otherwise)."""
    with os.fdopen(open_regular(path, what), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FormatError(f"{what} {str(path)!r} is more than {limit:,} bytes; such a file is a few MB at most, so "
                          "this is not one. Pass the right file")
    return parse_json(data, f"{what} {str(path)!r}")


def _roots(folder: Path) -> list[Path]:
    """Where the files of ``folder`` may lie once links are resolved: the folder, and for a hub-cache snapshot
    (``…/snapshots/REV``) the repository's ``blobs`` beside it."""
    real = Path(os.path.realpath(folder))
    roots = [real]
    if real.parent.name == "snapshots":
        roots.append(real.parent.parent / "blobs")
    return roots


def in_folder(folder: Path, name: str, where: str) -> Path:
    """``folder / name`` for a file of a checkpoint folder (``name`` read from ``where``: its index, or the folder
    listing): one plain file name, which after links are resolved lies inside the folder."""
    try:
        ok = len(name.encode("utf-8")) <= 255
    except UnicodeEncodeError:  # a lone surrogate (JSON's \ud800 escape): no file is named that
        ok = False
    if not ok:
        raise FormatError(f"{where} names the file {name[:40]!r}…, which no file system holds (over 255 bytes, or not "
                          "UTF-8); a checkpoint's index names its own files. The index was edited or is damaged")
    if not name or "/" in name or "\\" in name or "\x00" in name or name in (".", ".."):
        raise FormatError(f"{where} names the file {name!r}; a checkpoint's files are plain names in its folder "
                          f"{str(folder)!r} (no '/', '..' or absolute path), so it is refused, not followed. Pass a "
                          "checkpoint whose index names only its own files")
    path = folder / name
    target = Path(os.path.realpath(path))
    if not any(target.is_relative_to(root) for root in _roots(folder)):
        raise FormatError(f"{where} names {name!r}, a link to {str(target)!r} outside the checkpoint folder "
                          f"{str(folder)!r}; polymem reads only the folder's own files and does not follow it. Copy "
                          "the file into the folder (or pass the file itself)")
    return path


def check_disjoint(path: Path, spans: list[tuple[int, int, str]], what: str) -> None:
    """No two tensors of one file share a byte (``spans``: (start, end, name)); ``what`` names the format in the
    message. Two names over one range would read as two tensors with one content."""
    end, last = 0, ""
    for a, b, name in sorted(spans):
        if a == b:
            continue
        if a < end:
            raise FormatError(f"{str(path)!r}: tensors {last!r} and {name!r} overlap (the first ends at byte {end}, "
                              f"the second starts at {a}); each tensor of a {what} file has bytes of its own. The "
                              "file is damaged or crafted: fetch it again")
        end, last = b, name


__all__ = ["MAX_JSON_BYTES", "check_disjoint", "in_folder", "open_regular", "parse_json", "read_json"]
