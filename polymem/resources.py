"""Files polymem ships: the embedded sample text and friends (``assets/`` in the repo, ``polymem/_assets``
in a wheel)."""

from __future__ import annotations

from pathlib import Path

from polymem.errors import PolymemError


def asset_path(name: str) -> Path:
    """Path of a shipped file, whether polymem runs from a wheel or from a source checkout."""
    here = Path(__file__).resolve().parent
    for root in (here / "_assets", here.parent / "assets"):
        if (root / name).is_file():
            return root / name
    raise PolymemError(f"shipped file {name!r} not found under polymem/_assets or assets/; reinstall polymem")


def sample_text() -> str:
    """The embedded multilingual sample (English, German, Chinese, Japanese, Russian, code, emoji)."""
    return asset_path("sample_multilingual.txt").read_text(encoding="utf-8")
