"""The transformers tokenizer converted from a GGUF file, kept on disk so later loads skip the conversion.

transformers builds a fast tokenizer from a GGUF's vocabulary on every ``from_pretrained(..., gguf_file=...)``:
seconds for SmolLM2's 49,152 ids, far longer for Gemma 3's 262,144. The converted tokenizer is saved once with
``save_pretrained`` under ``<cache dir>/models/tokenizers/<key>/``, where the key names the GGUF's sha256 and the
transformers and tokenizers versions (a new file or a new converter gets a new entry), and read back from there.

Each entry holds a manifest, written last (:mod:`polymem.models._entry`: temporary folder, rename): the size and
crc32c of every saved file, polymem's tokenizer fingerprint, the bos/eos ids and the ids of a probe text (as
polymem's tokenizer and transformers' give them), and a crc32c of the manifest's own fields (so a changed
``bos_id`` is a damaged entry, not a silently different score). A read builds polymem's tokenizer from the entry's
``tokenizer.json`` and is used only when its files, fingerprint and probe ids match (transformers' tokenizer is
read from the entry on first use, and checked then); anything else (a truncated file, a missing manifest, a load
error) counts as damaged: one line on stderr, and the entry is converted again. A cache that cannot take the entry
(read-only, full) gets one line too, and the load goes on with the converted tokenizer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from polymem._paths import cache_root
from polymem.errors import PolymemError
from polymem.models._entry import note, read_manifest, write_entry

MANIFEST = "polymem-tokenizer-cache.json"
_FORMAT = 4  # files: {name: {"bytes", "crc32c"}}; polymem_probe_ids; manifest_crc32c


def _fields() -> dict[str, Any]:
    """The tokenizer manifest's own fields, declared (:func:`polymem.models._entry.manifest_schema`)."""
    from polymem._schema import Int, ListOf, Nullable, Str

    ids = ListOf(Int(0, (1 << 24) - 1), max_len=4096)
    return {"fingerprint": Str(256), "vocab_size": Int(1, 1 << 24), "bos_id": Nullable(Int(0, (1 << 24) - 1)),
            "eos_id": Nullable(Int(0, (1 << 24) - 1)), "probe_ids": ids, "polymem_probe_ids": ids, "class": Str(256),
            "gguf_sha256": Str(64), "source": Str(4096, empty=True), "transformers": Str(64)}
# Mixed scripts, whitespace runs, tabs, digits and special-token look-alikes: ids that differ on any of these
# mean the cached tokenizer would not reproduce the converted one.
PROBE = ("Hello world, naïve café — 日本語のテキスト, Ünïcödé\n\n  def f(x):\treturn x ** 2  # 12345 67.89\r\n"
         "<bos> <s> </s> <|endoftext|> <start_of_turn>user\nЗдравствуй, мир! 🙂")


def cache_key(sha256: str) -> str:
    """The cache entry name of the GGUF with this sha256, under the installed transformers and tokenizers."""
    import tokenizers
    import transformers

    return f"{sha256}-transformers-{transformers.__version__}-tokenizers-{tokenizers.__version__}"


def cache_dir(sha256: str) -> Path:
    """Where the converted tokenizer of the GGUF with this sha256 is kept."""
    return cache_root() / "models" / "tokenizers" / cache_key(sha256)


def _facts(hf_tok: Any, tok: Any) -> dict[str, Any]:
    """What a cached tokenizer must reproduce of the converted one."""
    return {"fingerprint": tok.fingerprint, "vocab_size": int(tok.vocab_size),
            "bos_id": getattr(hf_tok, "bos_token_id", None), "eos_id": getattr(hf_tok, "eos_token_id", None),
            "probe_ids": [int(i) for i in hf_tok(PROBE)["input_ids"]], "class": type(hf_tok).__name__,
            "polymem_probe_ids": [int(i) for i in tok.encode(PROBE)]}


_POLYMEM_FACTS = ("fingerprint", "vocab_size", "polymem_probe_ids")


@dataclass
class GgufTokenizer:
    """A GGUF's tokenizer: polymem's (``tok``), its BOS/EOS ids, and transformers' on demand (``hf()``: read
    from the cache entry on first use, since a command that only scores needs polymem's alone)."""

    tok: Any
    bos_id: int | None
    eos_id: int | None
    hf: Callable[[], Any]


def _read(folder: Path, tf: Any) -> GgufTokenizer:
    """The cached tokenizer; ValueError saying what is wrong when the entry is damaged. polymem's tokenizer is
    built from the entry's tokenizer.json and checked against the manifest now; transformers' is loaded (and
    checked) when first asked for."""
    from polymem.tokenizers import load_tokenizer

    manifest = read_manifest(folder, MANIFEST, _FORMAT, _fields())
    tok = load_tokenizer(str(folder / "tokenizer.json"))
    got = {"fingerprint": tok.fingerprint, "vocab_size": int(tok.vocab_size),
           "polymem_probe_ids": [int(i) for i in tok.encode(PROBE)]}
    bad = [k for k in _POLYMEM_FACTS if manifest.get(k) != got[k]]
    if bad:
        raise ValueError(f"it loads with a different {', '.join(bad)}")
    for k in ("bos_id", "eos_id"):  # scoring starts every window from BOS: an id the vocabulary lacks is damage
        if manifest[k] is not None and manifest[k] >= tok.vocab_size:
            raise ValueError(f"its {k} {manifest[k]} is not an id of its {tok.vocab_size:,}-id vocabulary")

    def hf() -> Any:
        hf_tok = tf.AutoTokenizer.from_pretrained(str(folder))
        facts = _facts(hf_tok, tok)
        wrong = [k for k, v in facts.items() if manifest.get(k) != v]
        if wrong:
            raise PolymemError(f"the cached tokenizer {str(folder)!r} loads into transformers with a different "
                               f"{', '.join(wrong)}; remove it (polymem models clear {folder.name[:12]}) and load again")
        return hf_tok

    return GgufTokenizer(tok, manifest.get("bos_id"), manifest.get("eos_id"), functools.cache(hf))


def _write(folder: Path, hf_tok: Any, tok: Any, sha256: str, source: str = "") -> str | None:
    """Save the converted tokenizer as the entry ``folder``; None when written, else why not."""
    import transformers

    def fill(tmp: Path) -> dict[str, Any]:
        hf_tok.save_pretrained(str(tmp))
        return {"format": _FORMAT, "gguf_sha256": sha256, "source": source, "transformers": transformers.__version__,
                **_facts(hf_tok, tok)}

    return write_entry(folder, MANIFEST, fill)


def gguf_tokenizer(tf: Any, where: str, gguf_file: str, sha256: str) -> GgufTokenizer:
    """The tokenizer of ``where/gguf_file`` (sha256 given): read from the cache when an intact entry is there,
    else converted by transformers and cached. Conversion errors propagate."""
    from polymem.tokenizers import load_tokenizer

    folder = cache_dir(sha256)
    if folder.exists():
        try:
            return _read(folder, tf)
        except Exception as exc:  # any failure to read the entry back means: convert again
            note(f"the cached tokenizer {str(folder)!r} is damaged ({str(exc)[:160]}); converting it again "
                 f"from {gguf_file!r}")
    else:
        note(f"converting the tokenizer of {gguf_file!r} (first use: up to a minute for a large vocabulary; cached "
             f"in {str(folder.parent)!r} for later runs)")
    hf_tok = tf.AutoTokenizer.from_pretrained(where, gguf_file=gguf_file)
    tok = load_tokenizer(hf_tok)
    why = _write(folder, hf_tok, tok, sha256, gguf_file)
    if why is not None:
        note(f"the converted tokenizer was not cached in {str(folder.parent)!r}: {why}")
    return GgufTokenizer(tok, getattr(hf_tok, "bos_token_id", None), getattr(hf_tok, "eos_token_id", None),
                         lambda: hf_tok)
