"""The seed inputs of tests/test_fuzz_parsers.py: small valid files made by the real writers, kept in
tests/data/fuzz/<parser>/ so the fuzzer starts from what polymem (and the libraries it reads after) write.

    python tests/fuzz_seeds.py          # rewrite every seed (after a writer's format changed)

Seeds whose bytes depend on the run (the token cache's zip timestamps, trained tokenizers' merge order) are
checked by what they parse to, not byte for byte (``test_every_seed_parses``). Assets are not kept here: the
fuzzer writes a small real one with polymem's own API into a temporary directory (see ``make_assets``).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as a script
    sys.path.insert(0, str(HERE))

SEEDS = HERE / "data" / "fuzz"
SITE_LAYOUT = dict(pages=4, heads=2, slots=2, head_dim=8)


def _bf16(values: np.ndarray) -> bytes:
    """float32 values as BF16 bytes (the upper half of each float32)."""
    return (np.asarray(values, "<f4").view("<u4") >> 16).astype("<u2").tobytes()


def write_safetensors(root: Path) -> None:
    """One file by polymem's writer (engines/_safetensors.header_bytes), one by the safetensors library."""
    from safetensors.numpy import save_file

    from polymem.engines import _safetensors as st

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    tensors = [("a.weight", "F32", (2, 3)), ("b.ids", "U8", (4,)), ("c.weight", "BF16", (3, 2)), ("d.scalar", "F32", ())]
    data = [rng.standard_normal((2, 3)).astype("<f4").tobytes(), bytes(range(4)),
            _bf16(rng.standard_normal(6)), np.float32(0.5).tobytes()]
    (root / "polymem.safetensors").write_bytes(st.header_bytes({"format": "pt"}, tensors) + b"".join(data))
    save_file({"x": rng.standard_normal((3, 4)).astype(np.float32), "y": np.arange(5, dtype=np.int64)},
              str(root / "library.safetensors"), metadata={"source": "safetensors"})


def write_gguf(root: Path) -> None:
    """One file by polymem's writer (engines/_gguf.header_bytes), one by the gguf package's GGUFWriter."""
    import gguf

    from polymem.engines import _gguf

    root.mkdir(parents=True, exist_ok=True)
    meta = [["general.architecture", 8, "llama"], ["general.alignment", 4, 32], ["x.float", 6, 0x3F800000],
            ["x.flag", 7, 1], ["x.ids", 9, [5, [1, -2, 3]]], ["x.words", 9, [8, ["a", "bc", ""]]],
            ["x.big", 12, 0x400921FB54442D18]]
    tensors = [("blk.0.w", (8, 2), _gguf.TYPE_I8, 0), ("blk.1.w", (4,), 0, 32)]
    head = _gguf.header_bytes(meta, tensors, 32)
    (root / "polymem.gguf").write_bytes(head + bytes(range(16)) + bytes(16) + np.arange(4, dtype="<f4").tobytes())
    w = gguf.GGUFWriter(str(root / "gguf-py.gguf"), arch="llama")
    w.add_block_count(1)
    w.add_context_length(16)
    w.add_token_list(["<s>", "a", "b"])
    w.add_tensor("tok.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("blk.0.ffn", np.ones((2, 4), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_token_cache(root: Path) -> None:
    """``polymem build-cache bytes -o …``'s file: TokenHashes.save of the 256-id bytes tokenizer."""
    from polymem import HashSpec, TokenHashes

    root.mkdir(parents=True, exist_ok=True)
    TokenHashes.build("bytes", HashSpec()).save(root / "bytes.npz")


def write_tokenizers(root: Path) -> None:
    """Small tokenizer.json files of three HF models (byte-level BPE, WordPiece, Unigram) and a .tiktoken."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from conftest import generated_text, sample_text

    root.mkdir(parents=True, exist_ok=True)
    texts = [sample_text()[:4000], generated_text(600)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=290, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       special_tokens=["<|endoftext|>"], show_progress=False))
    bpe.save(str(root / "bpe.json"))
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.Lowercase()
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    wp.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=120, special_tokens=["[UNK]", "[CLS]"],
                                                            show_progress=False))
    wp.save(str(root / "wordpiece.json"))
    uni = Tokenizer(models.Unigram())
    uni.pre_tokenizer = pre_tokenizers.Metaspace()
    uni.decoder = decoders.Metaspace()
    uni.train_from_iterator([generated_text(600)], trainers.UnigramTrainer(vocab_size=100, special_tokens=["<unk>"], unk_token="<unk>",
                                                           show_progress=False))
    uni.save(str(root / "unigram.json"))
    import base64

    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines += [f"{base64.b64encode(t).decode()} {256 + i}" for i, t in enumerate([b"th", b"he", b"the", b" the"])]
    (root / "tiny.tiktoken").write_text("\n".join(lines) + "\n")


def tiny_gpt():
    """The 2-layer GPT the site seed was saved from (byte vocabulary, width 32)."""
    import torch

    from polymem.recipes.model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=256, n_used=256, block_size=32, n_layer=2, n_head=2, d_model=32), torch.arange(256))


def write_site(root: Path) -> None:
    """A site folder (site.json + site.safetensors) as AttachHandle.save writes it: a trained table saved in it."""
    from polymem import HashSpec, Layout
    from polymem.torch import attach

    h = attach(tiny_gpt(), Layout(**SITE_LAYOUT), "bytes", layers=[1], train="table", spec=HashSpec())
    h.save(root)
    h.detach()


def write_corpus(root: Path) -> None:
    """A .jsonl, its .jsonl.gz and a .txt of a few short documents."""
    root.mkdir(parents=True, exist_ok=True)
    docs = [{"id": "a", "text": "Hello world."}, {"id": 7, "text": "Zweite Zeile, ünïcödé."}, {"text": "三 \U0001F600"}]
    text = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    (root / "docs.jsonl").write_text(text, encoding="utf-8")
    with gzip.GzipFile(root / "docs.jsonl.gz", "wb", mtime=0) as f:
        f.write(text.encode())
    (root / "doc.txt").write_text("A plain text document.\nSecond line.\n", encoding="utf-8")


WRITERS = {"safetensors": write_safetensors, "gguf": write_gguf, "token_cache": write_token_cache,
           "tokenizer": write_tokenizers, "site": write_site, "corpus": write_corpus}


def seed_files(parser: str) -> list[Path]:
    """The kept seed files of ``parser`` (a key of WRITERS), sorted."""
    return sorted(p for p in (SEEDS / parser).iterdir() if p.is_file())


def main() -> None:
    """Rewrite every seed under tests/data/fuzz/."""
    import shutil

    for name, write in WRITERS.items():
        shutil.rmtree(SEEDS / name, ignore_errors=True)
        write(SEEDS / name)
        print(f"{name}: {', '.join(f'{p.name} ({p.stat().st_size:,} B)' for p in seed_files(name))}")


if __name__ == "__main__":
    main()
