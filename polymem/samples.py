"""Files polymem ships inside the package (``polymem/_samples/``): the embedded multilingual sample text."""

from __future__ import annotations

from pathlib import Path

from polymem.errors import PolymemError

_ROOT = Path(__file__).resolve().parent / "_samples"


def sample_path(name: str = "sample_multilingual.txt") -> Path:
    """Path of a shipped sample file."""
    path = _ROOT / name
    if not path.is_file():
        raise PolymemError(f"shipped file {name!r} not found under {_ROOT}; reinstall polymem")
    return path


def sample_text() -> str:
    """The embedded multilingual sample (English, German, Chinese, Japanese, Russian, code, emoji)."""
    return sample_path().read_text(encoding="utf-8")
