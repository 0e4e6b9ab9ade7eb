"""Optional dependencies: import one, or fail with an error that names the extra to install.

``pip install polymem`` brings the core (hashing, tokenizers, assets, torch sites, the CLI). Features that need
more live behind named extras in pyproject.toml (EXTRAS below); every place that needs one imports it through
:func:`optional_import` (or :func:`missing_extra` when it only looks for package data), so the message is the
same everywhere: ``... needs matplotlib, which is not installed. Fix: pip install 'polymem[plot]'``.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

from polymem.errors import PolymemError

#: extra -> what it is for (the packages themselves are listed in pyproject.toml)
EXTRAS = {
    "hf": "Hugging Face models and Hub tokenizers (transformers, huggingface_hub)",
    "models": "pretrained models by name or .gguf file: eval, train and transfer on them (transformers, gguf, accelerate)",
    "plot": "PNG plots of coverage, iosim and transfer results (matplotlib)",
    "mistral": "the builtin Mistral SentencePiece tokenizers mistral-v1/-v3 (files shipped by mistral-common)",
    "fast": "the tensorstore asset backend (also as [tensorstore])",
    "dask": "coverage on a Dask cluster",
    "s3": "assets and corpora on S3 (s3fs)",
    "corpus": ".zst and Parquet corpora (zstandard, pyarrow)",
    "all": "every extra above",
}


class MissingExtraError(PolymemError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def missing_extra(package: str, extra: str, purpose: str) -> MissingExtraError:
    """The error for ``purpose`` needing ``package`` (from ``polymem[extra]``)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")  # a bug in polymem, not user input
    return MissingExtraError(
        f"{purpose} needs {package}, which is not installed. Fix: pip install 'polymem[{extra}]'"
    )


def optional_import(module: str, *, extra: str, purpose: str) -> ModuleType:
    """``importlib.import_module(module)``, or a :class:`MissingExtraError` naming ``polymem[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and not module.startswith(exc.name) and not exc.name.startswith(module.split(".")[0]):
            raise  # the package is there but one of *its* imports failed: show the real error
        raise missing_extra(module.split(".")[0], extra, purpose) from exc


def save_figure(fig: object, path: str | os.PathLike[str], *, dpi: int = 120) -> Path:
    """Write a matplotlib figure as PNG to ``path`` atomically (:func:`polymem._io.atomic_path`) and close it."""
    from polymem._io import atomic_path

    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")  # type: ignore[attr-defined]
    importlib.import_module("matplotlib.pyplot").close(fig)
    return path


def pyplot(purpose: str) -> ModuleType:
    """matplotlib.pyplot on the non-interactive Agg backend (files only, no display needed)."""
    matplotlib = optional_import("matplotlib", extra="plot", purpose=purpose)
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")
