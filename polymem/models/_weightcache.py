"""The de-quantised weights of a GGUF model, kept on disk as safetensors so later loads map them.

transformers de-quantises every tensor of a GGUF on each ``from_pretrained(..., gguf_file=...)``: about 7 s for
SmolLM2-135M and 21 s for Gemma 3 270M on 2 cores with the file in the page cache. The first load of a GGUF writes
the result once under ``<cache dir>/models/weights/<key>/``, where the key names the GGUF's sha256, the dtype and
the transformers version (a new file, dtype or converter gets a new entry); later loads read it with transformers'
own safetensors path, which memory-maps the file.

An entry holds ``config.json`` (the model's config, without the GGUF quantisation record), ``model.safetensors``
(every weight once: tied weights are stored once and tied again on load) and the manifest
``polymem-model-cache.json``, written last (:mod:`polymem.models._entry`): format, the GGUF's sha256, dtype,
versions, the model class, the weights' names, and every file's size and crc32c. A read is used only when all of
them check out and transformers reports no missing, unexpected or mismatched weight; anything else (a truncated or
tampered file, a missing manifest, a load error) is damaged: one line on stderr, the model is loaded from its
GGUF and the entry written again. A cache that cannot take an entry (read-only, not enough free space) gets one
line too, and the load goes on from the GGUF.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from polymem._paths import cache_root
from polymem.models._entry import note, read_manifest, write_entry

MANIFEST = "polymem-model-cache.json"
_FORMAT = 2  # format 1 had no manifest_crc32c


def _fields() -> dict[str, Any]:
    """The weights manifest's own fields, declared (:func:`polymem.models._entry.manifest_schema`)."""
    from polymem._schema import ListOf, Str

    return {"dtype": Str(32), "class": Str(256), "weights": ListOf(Str(1024), max_len=1 << 16), "gguf_sha256": Str(64),
            "source": Str(4096, empty=True), "transformers": Str(64), "safetensors": Str(64)}
_SPARE = 64 << 20  # free space to leave beside an entry


def dtype_name(dtype: Any) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def cache_key(sha256: str, dtype: Any) -> str:
    """The entry name of the GGUF with this sha256, de-quantised to ``dtype`` by the installed transformers."""
    import transformers

    return f"{sha256}-{dtype_name(dtype)}-transformers-{transformers.__version__}"


def cache_dir(sha256: str, dtype: Any) -> Path:
    """Where the de-quantised weights of the GGUF with this sha256 are kept."""
    return cache_root() / "models" / "weights" / cache_key(sha256, dtype)


def _weight_names(model: Any) -> list[str]:
    return sorted(model.state_dict().keys())


def _read(folder: Path, tf: Any, dtype: Any) -> Any:
    """The cached model; ValueError saying what is wrong when the entry is damaged."""
    meta = read_manifest(folder, MANIFEST, _FORMAT, _fields())
    if meta.get("dtype") != dtype_name(dtype):
        raise ValueError(f"it holds {meta.get('dtype')} weights, not {dtype_name(dtype)}")
    model, info = tf.AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, output_loading_info=True)
    wrong = {k: sorted(v)[:3] for k, v in info.items() if v and k != "error_msgs"}
    if info.get("error_msgs"):
        wrong["errors"] = [str(e)[:120] for e in info["error_msgs"][:2]]
    if wrong:
        raise ValueError(f"its weights do not fit the model: {wrong}")
    if type(model).__name__ != meta.get("class") or _weight_names(model) != meta.get("weights"):
        raise ValueError(f"it loads as {type(model).__name__} with other weights than its manifest lists")
    return model


def _unique_bytes(model: Any) -> int:
    seen: dict[int, int] = {}
    for t in model.state_dict().values():
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _write(folder: Path, model: Any, sha256: str, dtype: Any, source: str = "") -> str | None:
    """Save the model's weights as the entry ``folder``; None when written, else why not."""
    import safetensors
    import safetensors.torch
    import transformers

    from polymem._io import free_bytes

    need = _unique_bytes(model) + _SPARE
    free = free_bytes(folder.parent)
    if free is not None and free < need:
        return f"it needs {need / 2**30:.2f} GiB and {free / 2**30:.2f} GiB is free"

    def fill(tmp: Path) -> dict[str, Any]:
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the GGUF record: these weights are plain tensors
        cfg = type(model.config).from_dict(config)
        cfg.save_pretrained(str(tmp))
        safetensors.torch.save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        return {"format": _FORMAT, "gguf_sha256": sha256, "source": source, "dtype": dtype_name(dtype),
                "transformers": transformers.__version__, "safetensors": safetensors.__version__,
                "class": type(model).__name__, "weights": _weight_names(model)}

    return write_entry(folder, MANIFEST, fill, errors=(safetensors.SafetensorError,))


def cached_model(tf: Any, sha256: str, dtype: Any, from_source: Callable[[], Any],
                 source: str = "") -> tuple[Any, str]:
    """The model whose GGUF has this sha256, in ``dtype``: read from the cache when an intact entry is there, else
    ``from_source()`` (which loads the GGUF ``source``, its file name) and written to the cache. Returns (model,
    how): how is ``"cache"``, ``"gguf, cached"`` or ``"gguf, not cached"``."""
    folder = cache_dir(sha256, dtype)
    if folder.exists():
        try:
            return _read(folder, tf, dtype), "cache"
        except Exception as exc:  # any failure to read the entry back means: load the source, write it again
            note(f"the cached weights {str(folder)!r} are damaged ({str(exc)[:160]}); loading the GGUF again")
    model = from_source()
    why = _write(folder, model, sha256, dtype, source)
    if why is not None:
        note(f"the de-quantised weights were not cached in {str(folder.parent)!r}: {why}; the next load "
             "de-quantises the GGUF again")
        return model, "gguf, not cached"
    return model, "gguf, cached"
