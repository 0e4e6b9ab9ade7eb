"""The transformers tokenizer converted from a GGUF file, kept on disk so later loads skip the conversion.

transformers builds a fast tokenizer from a GGUF's vocabulary on every ``from_pretrained(..., gguf_file=...)``:
seconds for SmolLM2's 49,152 ids, far longer for Gemma 3's 262,144. The converted tokenizer is saved once with
``save_pretrained`` under ``<cache dir>/models/tokenizers/<key>/``, where the key names the GGUF's sha256 and the
transformers and tokenizers versions (a new file or a new converter gets a new entry), and read back from there.

Each entry holds a manifest, written last: the sha256 of every saved file, polymem's tokenizer fingerprint, the
bos/eos ids and the ids of a probe text. A read is used only when all of them match; anything else (a truncated
file, a missing manifest, a load error) counts as damaged: one line on stderr, and the entry is converted again.
Entries are written to a hidden temporary folder and renamed into place, so a reader never sees half of one and
two processes converting the same file at once both end up with a good tokenizer (the second rename loses and
its copy is dropped).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any

from polymem._paths import cache_root

MANIFEST = "polymem-tokenizer-cache.json"
_FORMAT = 1
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


def _file_hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}


def _facts(hf_tok: Any, tok: Any) -> dict[str, Any]:
    """What a cached tokenizer must reproduce of the converted one."""
    return {"fingerprint": tok.fingerprint, "vocab_size": int(tok.vocab_size),
            "bos_id": getattr(hf_tok, "bos_token_id", None), "eos_id": getattr(hf_tok, "eos_token_id", None),
            "probe_ids": [int(i) for i in hf_tok(PROBE)["input_ids"]], "class": type(hf_tok).__name__}


def _read(folder: Path, tf: Any) -> tuple[Any, Any]:
    """The cached (transformers, polymem) tokenizers; ValueError saying what is wrong when the entry is damaged."""
    from polymem.tokenizers import load_tokenizer

    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"no readable {MANIFEST} ({type(exc).__name__})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        raise ValueError(f"{MANIFEST} is not format {_FORMAT}")
    if _file_hashes(folder) != manifest.get("files"):
        raise ValueError("its files differ from the ones its manifest lists")
    hf_tok = tf.AutoTokenizer.from_pretrained(str(folder))
    tok = load_tokenizer(hf_tok)
    got = _facts(hf_tok, tok)
    bad = [k for k, v in got.items() if manifest.get(k) != v]
    if bad:
        raise ValueError(f"it loads with a different {', '.join(bad)}")
    return hf_tok, tok


def _write(folder: Path, hf_tok: Any, tok: Any, sha256: str) -> None:
    """Save the converted tokenizer as the entry ``folder`` (temporary folder, manifest last, rename)."""
    import transformers

    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        tmp.mkdir(parents=True)
        hf_tok.save_pretrained(str(tmp))
        manifest = {"format": _FORMAT, "gguf_sha256": sha256, "transformers": transformers.__version__,
                    "files": _file_hashes(tmp), **_facts(hf_tok, tok)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        if folder.exists():  # a damaged entry: moved aside first (a rename onto a full folder fails)
            old = folder.with_name(f".{folder.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
            try:
                os.rename(folder, old)
            except OSError:
                pass  # another process moved or replaced it
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, folder)
    except OSError:
        pass  # another process put its entry there first, or the cache is not writable: this load goes on
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gguf_tokenizer(tf: Any, where: str, gguf_file: str, sha256: str) -> tuple[Any, Any]:
    """The (transformers, polymem) tokenizers of ``where/gguf_file`` (sha256 given): read from the cache when
    an intact entry is there, else converted by transformers and cached. Conversion errors propagate."""
    from polymem.tokenizers import load_tokenizer

    folder = cache_dir(sha256)
    if folder.exists():
        try:
            return _read(folder, tf)
        except Exception as exc:  # any failure to read the entry back means: convert again
            print(f"note: the cached tokenizer {str(folder)!r} is damaged ({str(exc)[:160]}); converting it "
                  f"again from {gguf_file!r}", file=sys.stderr)
    hf_tok = tf.AutoTokenizer.from_pretrained(where, gguf_file=gguf_file)
    tok = load_tokenizer(hf_tok)
    _write(folder, hf_tok, tok, sha256)
    return hf_tok, tok
