"""A model folder someone else made is data, never code: `load_model` refuses a folder that names its own code
(`auto_map`) or holds only pickled weights, before transformers reads it, and a weights file that does not hold the
model's weights is an error, not a freshly initialised model. Each case plants code that would leave a marker file
if it ran: the marker never appears."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

from polymem.errors import PolymemError  # noqa: E402
from polymem.models import load_model  # noqa: E402

V = 300


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A tiny Llama checkpoint with its tokenizer, saved by transformers (safetensors)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from conftest import sample_text

    path = tmp_path_factory.mktemp("good") / "ckpt"
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(path))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([sample_text()], trainer=trainers.BpeTrainer(
        vocab_size=V, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<bos>", "<eos>"],
        show_progress=False))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>").save_pretrained(str(path))
    return path


def _copy(good: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(good, tmp_path / "ckpt"))


def _plant_code(folder: Path, marker: Path) -> None:
    (folder / "modeling_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nfrom transformers import LlamaForCausalLM as EvilModel\n")


def test_the_good_checkpoint_loads(good):
    lm = load_model(good)
    assert lm.load["weights"] == "checkpoint" and type(lm.model).__name__ == "LlamaForCausalLM"


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_a_folder_that_names_its_own_code_is_refused_and_nothing_runs(good, tmp_path, where):
    folder = _copy(good, tmp_path)
    marker = tmp_path / "code-ran"
    _plant_code(folder, marker)
    meta = json.loads((folder / where).read_text())
    meta["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel", "AutoTokenizer": ["modeling_evil.EvilModel", None]}
    (folder / where).write_text(json.dumps(meta))
    with pytest.raises(PolymemError, match=rf"names its own code \({where}: auto_map .*never runs code from a model folder"):
        load_model(folder)
    assert not marker.exists()


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # unpickling creates the marker file


def test_pickled_weights_are_refused_without_unpickling(good, tmp_path):
    folder = _copy(good, tmp_path)
    marker = tmp_path / "unpickled"
    for f in folder.glob("*.safetensors"):
        f.unlink()
    torch.save({"model.embed_tokens.weight": _Evil(str(marker))}, folder / "pytorch_model.bin")
    with pytest.raises(PolymemError, match=r"holds only pickled weights \(pytorch_model\.bin\); polymem reads "
                                           r"safetensors or GGUF only"):
        load_model(folder)
    assert not marker.exists()


def test_a_weights_file_without_the_models_weights_is_an_error(good, tmp_path):
    from safetensors.torch import save_file

    folder = _copy(good, tmp_path)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    save_file({"something.else": torch.zeros(3)}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PolymemError, match=r"its weights file does not match the model its config describes "
                                           r"\(missing keys: \d+ .*unexpected keys: 1 \(something\.else\)"):
        load_model(folder)


@pytest.mark.parametrize("config", ["[1, 2]", "{not json", '"a string"'])
def test_a_config_that_is_not_an_object_is_one_line(good, tmp_path, config):
    folder = _copy(good, tmp_path)
    (folder / "config.json").write_text(config)
    with pytest.raises(PolymemError, match=r"config\.json' (holds a JSON (list|str), not an object|is not a readable JSON config)"):
        load_model(folder)


# ------------------------------------------------------------------------------------------------ GGUF files
def test_a_linked_gguf_loads_the_file_it_names_not_its_sibling(tmp_path, monkeypatch):
    """A/mine.gguf -> B/real.gguf, with a different B/mine.gguf beside it: the link's target is what loads."""
    from tinygguf import write_tiny_gguf

    monkeypatch.setenv("POLYMEM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    real = write_tiny_gguf(tmp_path / "B" / "real.gguf", seed=0)
    write_tiny_gguf(tmp_path / "B" / "mine.gguf", seed=1)
    (tmp_path / "A" / "mine.gguf").symlink_to(real)
    linked = load_model(tmp_path / "A" / "mine.gguf", cache=False)
    direct = load_model(real, cache=False)
    assert linked.source["path"] == str(real.resolve()) and linked.source["sha256"] == direct.source["sha256"]
    w, d = linked.model.state_dict(), direct.model.state_dict()
    assert all(torch.equal(w[k], d[k]) for k in d)


def _header(path: Path, magic: bytes = b"GGUF", version: int = 3, tensors: int = 1, kvs: int = 1) -> Path:
    import struct

    path.write_bytes(magic + struct.pack("<IQQ", version, tensors, kvs) + b"\0" * 4096)
    return path


@pytest.mark.parametrize("case, says", [
    (dict(magic=b"PK\x03\x04"), r"is not a GGUF file \(its first bytes are b'PK\\x03\\x04'"),
    (dict(version=9), r"is GGUF version 9; polymem reads versions 2 and 3"),
    (dict(tensors=2**40), r"claims 1,099,511,627,776 tensors and 1 metadata entries, more than its 4,120 bytes"),
    (dict(kvs=2**62), r"claims 1 tensors and 4,611,686,018,427,387,904 metadata entries"),
])
def test_a_gguf_header_that_cannot_be_a_model_is_one_line_before_hashing(tmp_path, case, says):
    with pytest.raises(PolymemError, match=says):
        load_model(_header(tmp_path / "bad.gguf", **case))


def _kv_gguf(path: Path, kvs: bytes, n: int = 1) -> Path:
    import struct

    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, n) + kvs + b"\0" * 64)
    return path


def _key(name: str, kind: int) -> bytes:
    import struct

    return struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", kind)


def test_a_huge_gguf_metadata_array_is_refused_before_any_parser_lists_it(tmp_path):
    """transformers makes a Python list of every metadata array (>= 8 bytes per element); 5M one-byte values (a
    5 MB file) would take 40+ MB, 100M would take GBs. Refused from the header walk, before the file is hashed."""
    import struct
    import tracemalloc

    count = 5_000_000
    f = _kv_gguf(tmp_path / "big.gguf", _key("x.big", 9) + struct.pack("<IQ", 0, count) + bytes(count))
    tracemalloc.start()
    with pytest.raises(PolymemError, match=r"metadata 'x\.big' is an array of 5,000,000 elements; polymem loads at "
                                           r"most 4,194,304"):
        load_model(f)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.parametrize("arrays, says", [
    ([("x.big", 500_000)], r"metadata 'x\.big' is an array of 500,000 elements \(about 334 MiB as the loader holds "
                           r"it\); outside the tokenizer's arrays .* at most 65,536"),
    ([(f"tokenizer.ggml.a{i}", 1_000_000) for i in range(3)],
     r"its metadata arrays hold more than 3,000,000 elements, about 1\.96 GiB as the loader holds them .* at most "
     r"1\.5 GiB"),
])
def test_gguf_metadata_is_bounded_by_the_bytes_the_loader_would_hold(tmp_path, arrays, says):
    """Under the element-count bound, half a million one-byte values still raised a load's peak by 330 MB (the
    loader holds hundreds of bytes per element): the bound is on bytes, per array outside the tokenizer's and in
    all. Refused from the header walk, in bounded memory."""
    import struct
    import tracemalloc

    kvs = b"".join(_key(name, 9) + struct.pack("<IQ", 0, n) + bytes(n) for name, n in arrays)
    f = _kv_gguf(tmp_path / "wide.gguf", kvs, n=len(arrays))
    tracemalloc.start()
    with pytest.raises(PolymemError, match=says):
        load_model(f)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.parametrize("kvs, says", [
    (_key("s", 8) + (1 << 40).to_bytes(8, "little"), r"claims 1,099,511,627,776 bytes for a string of metadata 's'"),
    (_key("a", 9) + (8).to_bytes(4, "little") + (3).to_bytes(8, "little") + (1 << 50).to_bytes(8, "little"),
     r"bytes for a string of metadata 'a'"),
    (_key("n", 9) + (9).to_bytes(4, "little") + (1).to_bytes(8, "little"), r"metadata 'n' has value type 9"),
])
def test_gguf_metadata_past_its_file_is_one_line(tmp_path, kvs, says):
    with pytest.raises(PolymemError, match=says):
        load_model(_kv_gguf(tmp_path / "bad.gguf", kvs))


def test_a_fifo_named_gguf_is_refused_without_being_opened(tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe.gguf")
    with pytest.raises(PolymemError, match=r"pipe\.gguf' is not a regular file"):
        load_model(tmp_path / "pipe.gguf")
