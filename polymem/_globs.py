"""Recursive globs that never follow a linked folder: the one way polymem expands a local ``**`` pattern (the
corpus readers, and the check of every command's outputs against its inputs).

Python's ``glob.glob(..., recursive=True)`` descends into linked folders, so a link to an ancestor repeats the tree
until paths grow too long (40 times over, and far more with two such links: a folder holding ``loop -> .`` and
``sub/up -> ..`` kept a command busy past 60 s). Here ``**`` walks real folders only, in time proportional to the
files there. Base stage: imports nothing from polymem.
"""

from __future__ import annotations

import fnmatch
import glob as _glob
import os
from collections.abc import Iterator


def glob_no_links(pattern: str) -> list[str]:
    """``glob.glob(pattern, recursive=True)``, except that ``**`` does not descend into linked directories (glob
    does, so a link to an ancestor repeats the tree until the path grows too long: 40 times over, and more with
    two such links) and passes over hidden entries (as glob's wildcards and the directory walk do)."""
    parts = pattern.split(os.sep)
    if "**" not in parts:
        return _glob.glob(pattern)
    k = parts.index("**")
    head = os.sep.join(parts[:k])
    bases = _glob.glob(head) if _glob.has_magic(head) else [head]
    return [m for base in bases if os.path.isdir(base or ".") for m in _walk_matches(base, parts[k:])]


def _walk_matches(base: str, pats: list[str]) -> Iterator[str]:
    """The paths under directory ``base`` (itself included) whose segments below it match ``pats``."""
    top = base or "."
    if base and _segments_match([], pats):
        yield base
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel = [] if dirpath == top else os.path.relpath(dirpath, top).split(os.sep)
        for name in [*dirnames, *(f for f in filenames if not f.startswith("."))]:
            if _segments_match([*rel, name], pats):
                yield os.path.join(base, *rel, name)


def _segments_match(segs: list[str], pats: list[str]) -> bool:
    """Whether path segments match glob segments, ``**`` standing for any number of segments (none included)."""
    if not pats:
        return not segs
    if pats[0] == "**":
        return any(_segments_match(segs[i:], pats[1:]) for i in range(len(segs) + 1))
    return bool(segs) and fnmatch.fnmatchcase(segs[0], pats[0]) and _segments_match(segs[1:], pats[1:])
