"""`load_tokenizer(spec)`: one resolver from a name, a path or an object to a polymem Tokenizer.

Accepted specs, tried in this order:
    a polymem Tokenizer                      returned as is
    a builtin name                           cl100k_base, o200k_base, p50k_base, r50k_base, gpt2 (tiktoken),
                                             mistral-v1, mistral-v3 (SentencePiece files shipped by mistral-common),
                                             bytes (raw UTF-8 bytes, 256 ids)
    "hf:NAME"                                tokenizer.json of a Hugging Face Hub repo (hf_hub_download; works
                                             offline from the local HF cache)
    a path (str or os.PathLike)              tokenizer.json (HF tokenizers), *.model / *.model.vN
                                             (SentencePiece), NAME.tiktoken (tiktoken BPE), or a directory
                                             holding tokenizer.json or tokenizer.model
    a tokenizers.Tokenizer                   wrapped (a copy: the caller's object is not changed)
    a transformers tokenizer                 fast: its backend_tokenizer; slow with sp_model: SentencePiece

What this module does not do: download anything itself (tiktoken and huggingface_hub do), or cache loaded
tokenizers (load once and pass the object around).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from polymem.errors import TokenizerError
from polymem.tokenizers.base import Tokenizer, check_pinned_sha256
from polymem.tokenizers.bytes_adapter import BytesTokenizer
from polymem.tokenizers.tiktoken_adapter import TIKTOKEN_ENCODINGS, load_tiktoken_name, load_tiktoken_path

# builtin name -> (file in mistral_common/data, sha256 of the file as shipped by mistral-common 1.x, description)
MISTRAL_FILES: dict[str, tuple[str, str, str]] = {
    "mistral-v1": (
        "tokenizer.model.v1",
        "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055",
        "SentencePiece, Mistral 7B v0.1 (32000); offline via mistral-common",
    ),
    "mistral-v3": (
        "mistral_instruct_tokenizer_240323.model.v3",
        "9addc8bdce5988448ae81b729336f43a81262160ae8da760674badab9d4c7d33",
        "SentencePiece, Mistral v3 (32768, control tokens); offline via mistral-common",
    ),
}
_SP_SUFFIX = re.compile(r"\.model(\.v\w+)?$")
_ACCEPTED = (
    "a builtin name ({names}); 'hf:ORG/NAME' (a Hub repo's tokenizer.json); a path to tokenizer.json, "
    "a SentencePiece .model, a NAME.tiktoken file, or a directory holding tokenizer.json/tokenizer.model; "
    "a polymem Tokenizer, a tokenizers.Tokenizer or a transformers tokenizer object"
)


def known_tokenizers() -> list[tuple[str, str]]:
    """(name, description) of every builtin name that load_tokenizer accepts."""
    out = [(name, desc) for name, (_, _, desc) in TIKTOKEN_ENCODINGS.items()]
    out += [(name, desc) for name, (_, _, desc) in MISTRAL_FILES.items()]
    out.append(("bytes", "raw UTF-8 bytes, 256 ids (id = byte value); always byte-faithful"))
    return out


def _accepted() -> str:
    return _ACCEPTED.format(names=", ".join(name for name, _ in known_tokenizers()))


def load_tokenizer(spec: Any) -> Tokenizer:
    """Resolve `spec` (see the module docstring) to a Tokenizer; TokenizerError says what was wrong and the fix."""
    if isinstance(spec, Tokenizer):
        return spec
    if isinstance(spec, os.PathLike):
        return _load_path(Path(os.fspath(spec)))
    if isinstance(spec, str):
        return _load_str(spec)
    module = type(spec).__module__ or ""
    if module.split(".")[0] == "tokenizers" and hasattr(spec, "to_str"):
        return _from_backend(spec, name="tokenizers")
    if module.split(".")[0] == "transformers" or hasattr(spec, "backend_tokenizer") or hasattr(spec, "sp_model"):
        return _from_transformers(spec)
    raise TokenizerError(f"cannot load a tokenizer from a {type(spec).__module__}.{type(spec).__name__}; "
                         f"accepted: {_accepted()}")


def _load_str(spec: str) -> Tokenizer:
    if spec in TIKTOKEN_ENCODINGS:
        return load_tiktoken_name(spec)
    if spec in MISTRAL_FILES:
        return _load_mistral(spec)
    if spec == "bytes":
        return BytesTokenizer()
    if spec.startswith("hf:"):
        return _load_hub(spec[3:])
    looks_like_path = (
        os.sep in spec or "/" in spec or spec.endswith((".json", ".tiktoken")) or _SP_SUFFIX.search(spec) is not None
        or os.path.exists(spec)
    )
    if looks_like_path:
        return _load_path(Path(spec))
    names = [name for name, _ in known_tokenizers()]
    close = difflib.get_close_matches(spec, names, n=2)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise TokenizerError(f"unknown tokenizer {spec!r}.{hint} Accepted: {_accepted()}")


MAX_TOKENIZER_FILE_BYTES = 1 << 30  # Gemma 3's tokenizer.json is 33 MB; a GiB is no tokenizer


def _load_path(path: Path) -> Tokenizer:
    from polymem.tokenizers.sentencepiece_adapter import load_sentencepiece_path

    if not path.exists():
        raise TokenizerError(
            f"tokenizer file {str(path)!r} does not exist; pass an existing tokenizer.json, .model or .tiktoken "
            f"path, or a builtin name ({', '.join(n for n, _ in known_tokenizers())})"
        )
    if path.is_dir():
        for candidate in ("tokenizer.json", "tokenizer.model"):
            if (path / candidate).is_file():
                return _load_path(path / candidate)
        raise TokenizerError(
            f"directory {str(path)!r} holds neither tokenizer.json nor tokenizer.model; pass the tokenizer file itself"
        )
    name = path.parent.name if path.stem == "tokenizer" and path.parent.name else path.stem
    from polymem._io import open_regular, read_bounded

    fix = "pass the tokenizer file itself"
    with open_regular(path, what="tokenizer file", max_bytes=MAX_TOKENIZER_FILE_BYTES, error=TokenizerError, fix=fix):
        pass  # a FIFO or device is refused here, unopened; a file larger than any tokenizer, unread
    if path.name.endswith(".json"):
        try:
            text = read_bounded(path, what="tokenizer file", max_bytes=MAX_TOKENIZER_FILE_BYTES, error=TokenizerError,
                                fix=fix).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(
                f"cannot read {str(path)!r} as a UTF-8 tokenizer.json: {exc}. Pass the model's tokenizer.json"
            ) from exc
        from polymem.tokenizers.hf_adapter import hf_tokenizer_from_json_text

        return hf_tokenizer_from_json_text(text, name=name, source=repr(str(path)))
    if _SP_SUFFIX.search(path.name):
        sp_name = _SP_SUFFIX.sub("", path.name)
        sp_name = path.parent.name if sp_name == "tokenizer" and path.parent.name else sp_name
        return load_sentencepiece_path(path, name=sp_name)
    if path.name.endswith(".tiktoken"):
        return load_tiktoken_path(path)
    raise TokenizerError(
        f"cannot tell the tokenizer format of {str(path)!r} from its name; expected tokenizer.json (or *.json), "
        "*.model / *.model.vN (SentencePiece) or NAME.tiktoken. Rename the file or pass the right one"
    )


def _load_mistral(name: str) -> Tokenizer:
    from polymem.tokenizers.sentencepiece_adapter import load_sentencepiece_bytes

    filename, sha256, _ = MISTRAL_FILES[name]
    spec = importlib.util.find_spec("mistral_common")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(r) / "data" / filename for r in roots if (Path(r) / "data" / filename).is_file()), None)
    if path is None:
        from polymem._optional import missing_extra

        raise missing_extra(f"mistral-common (its data/{filename})", "mistral",
                            f"the builtin tokenizer {name!r} (or pass the path of a tokenizer.model)")
    data = check_pinned_sha256(path.read_bytes(), sha256, path=path, what=f"builtin {name!r}",
                               fix="pip install --force-reinstall mistral-common, or pass the .model path directly")
    return load_sentencepiece_bytes(data, name=name, source=repr(str(path)))


def _load_hub(repo_id: str) -> Tokenizer:
    if not repo_id:
        raise TokenizerError("'hf:' needs a Hub repo id after the colon, e.g. 'hf:gpt2'")
    from polymem._optional import optional_import

    hf_hub_download = optional_import(
        "huggingface_hub", extra="hf", purpose=f"'hf:{repo_id}' (or pass a local tokenizer.json path)"
    ).hf_hub_download
    offline = os.environ.get("POLYMEM_OFFLINE", "") in ("1", "true", "yes")
    try:
        # Cache first: a cached tokenizer.json needs no network (and no retries when there is none).
        local = hf_hub_download(repo_id=repo_id, filename="tokenizer.json", local_files_only=True)
    except Exception as cache_exc:  # noqa: BLE001 - not cached (or a bad cache): try the Hub unless offline
        if offline:
            raise TokenizerError(
                f"tokenizer.json of Hub repo {repo_id!r} is not in the local Hugging Face cache and POLYMEM_OFFLINE "
                "is set. Fix: pass a local tokenizer.json path, or unset POLYMEM_OFFLINE to download it"
            ) from cache_exc
        try:
            local = hf_hub_download(repo_id=repo_id, filename="tokenizer.json")
        except Exception as exc:  # noqa: BLE001 - network, auth, missing repo/file: all mean "no file here"
            raise TokenizerError(
                f"cannot get tokenizer.json of Hub repo {repo_id!r}: {type(exc).__name__}: {str(exc)[:200]}. "
                "Either there is no network and the file is not in the local Hugging Face cache, or the repo has "
                "no tokenizer.json. Fix: pass a local tokenizer.json path instead"
            ) from exc
    tok = _load_path(Path(local))
    tok.name = repo_id
    return tok


def _from_backend(backend: Any, *, name: str) -> Tokenizer:
    from polymem.tokenizers.hf_adapter import hf_tokenizer_from_json_text

    # Rebuild from JSON: a copy, so switching on encode_special_tokens never changes the caller's object.
    return hf_tokenizer_from_json_text(backend.to_str(), name=name, source=f"the given {type(backend).__name__}")


def _from_transformers(obj: Any) -> Tokenizer:
    raw_name = str(getattr(obj, "name_or_path", "") or type(obj).__name__)
    name = Path(raw_name).name if os.sep in raw_name and os.path.exists(raw_name) else raw_name
    name = name or type(obj).__name__
    backend = getattr(obj, "backend_tokenizer", None)
    if backend is not None:
        return _from_backend(backend, name=name)
    sp_model = getattr(obj, "sp_model", None)
    if sp_model is not None and hasattr(sp_model, "serialized_model_proto"):
        from polymem.tokenizers.sentencepiece_adapter import load_sentencepiece_bytes

        return load_sentencepiece_bytes(sp_model.serialized_model_proto(), name=name,
                                        source=f"the sp_model of {type(obj).__name__}")
    raise TokenizerError(
        f"transformers tokenizer {type(obj).__name__} has neither backend_tokenizer (fast) nor sp_model "
        "(SentencePiece); load it with use_fast=True, or pass its tokenizer.json / tokenizer.model path"
    )
