"""Files polymem ships inside the package (``polymem/_samples/``, origin and licence in its README.md): the
embedded multilingual sample text, and small corpora that every command taking a corpus accepts by name.

    resolve_sample("sample:pydocs")   # Path(".../polymem/_samples/pydocs.jsonl.gz")
    resolve_sample("docs/a.txt")      # "docs/a.txt": not a sample name, returned as given

What this module does not do: read the corpora (polymem.corpus does), or download anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from polymem.errors import PolymemError

_ROOT = Path(__file__).resolve().parent / "_samples"
PREFIX = "sample:"
#: name -> (file under _samples/, what it is)
SAMPLES = {
    "pydocs": ("pydocs.jsonl.gz", "43 Python 3.11 documentation pages (tutorial, FAQ, HOWTOs, glossary), 0.73 MB "
                                  "of English prose and code, PSF License"),
}


def resolve_sample(value: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``sample:NAME`` -> the path of the shipped corpus NAME; anything else is returned unchanged."""
    if not isinstance(value, str) or not value.startswith(PREFIX):
        return value
    name = value[len(PREFIX):]
    if name not in SAMPLES:
        known = ", ".join(f"{PREFIX}{n} ({desc})" for n, (_, desc) in SAMPLES.items())
        raise PolymemError(f"{value!r} is not a shipped sample corpus; known: {known}")
    return sample_path(SAMPLES[name][0])


def sample_path(name: str = "sample_multilingual.txt") -> Path:
    """Path of a shipped sample file."""
    path = _ROOT / name
    if not path.is_file():
        raise PolymemError(f"shipped file {name!r} not found under {_ROOT}; reinstall polymem")
    return path


def sample_text() -> str:
    """The embedded multilingual sample (English, German, Chinese, Japanese, Russian, code, emoji)."""
    return sample_path().read_text(encoding="utf-8")
