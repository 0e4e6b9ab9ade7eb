"""Options shared by several commands, defined once: typer ``Annotated`` aliases, ``Enum`` choices and the
parsers of counts and order lists. A command declares ``heads: Heads = 8``; the flag name, range and help come
from here, so ``init``, ``iosim``, ``train`` and ``transfer`` cannot drift apart.

Choices whose home is a module that loads heavy dependencies (torch for gates, numba for asset dtypes) are
spelled out here and checked against that home by tests/cli/test_commands.py; the CLI must start fast.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from enum import Enum, EnumMeta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, cast

import typer

from polymem._cpus import choose_threads
from polymem._paths import is_url
from polymem.errors import PolymemError
from polymem.hash.layout import LAYOUT_KINDS
from polymem.hash.spec import NORMALIZERS


class Choice(str, Enum):
    """What every choice below is: a str enum whose members (value = name) are made from a list of strings."""

    _value_: str


def _choices(name: str, values: tuple[str, ...] | list[str]) -> type[Choice]:
    """A :class:`Choice` subclass named ``name`` with a member per value (Enum's functional API)."""
    return cast("type[Choice]", EnumMeta.__call__(Choice, name, [(v, v) for v in values]))


if TYPE_CHECKING:  # members made from data are invisible to mypy: to it, each choice is a Choice
    AssetDtype = Choice
    LayoutKind = Choice
    Normalizer = Choice
    Gate = Choice
    ValueInit = Choice
    DonorInit = Choice
    Precision = Choice
    HashKind = Choice
    Softmax = Choice
    NextBytes = Choice
    ByteReader = Choice
    ByteHits = Choice
else:
    AssetDtype = _choices("AssetDtype", ("float32", "float16", "bfloat16", "nf4", "fp8-e4m3-e8m0", "fp8-e4m3"))  # = polymem.asset.DTYPES
    LayoutKind = _choices("LayoutKind", LAYOUT_KINDS)
    Normalizer = _choices("Normalizer", sorted(NORMALIZERS))
    Gate = _choices("Gate", ("scalar", "context", "count"))  # = polymem.torch.site.GATES
    HashKind = _choices("HashKind", ("bytes", "xor"))  # = polymem.recipes.train.HASHES
    Softmax = _choices("Softmax", ("corpus", "full"))  # = polymem.recipes.frozen.SOFTMAX
    ValueInit = _choices("ValueInit", ("zero", "orthogonal"))  # = polymem.torch.site.VALUE_INITS but aligned
    DonorInit = _choices("DonorInit", ("zero", "orthogonal", "aligned"))  # = polymem.recipes.pretrained.DONOR_INITS
    Precision = _choices("Precision", ("auto", "fp32", "bf16"))  # = polymem.torch.precision.PRECISIONS
    NextBytes = _choices("NextBytes", ("auto", "on", "off"))  # polymem attach's byte reader
    ByteReader = _choices("ByteReader", ("mix", "add"))  # how it joins the model's prediction
    ByteHits = _choices("ByteHits", ("any", "all"))  # = polymem.torch.bytesite.HITS: which n-grams it reads

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9, "T": 10**12}


def parse_count(text: str, option: str = "--params") -> int:
    """'200M' -> 200_000_000; suffixes K, M, G (= B, billion), T; decimals allowed ('1.5G')."""
    t = text.strip().upper().replace("_", "")
    suffix = t[-1] if t and t[-1] in _SUFFIX else ""
    try:
        value = float(t[: len(t) - len(suffix)]) * _SUFFIX[suffix]
    except ValueError:
        raise PolymemError(f"{option} {text!r} is not a count; use e.g. 200M, 1.5G, 20B or 12000000") from None
    if not math.isfinite(value):
        raise PolymemError(f"{option} {text!r} is not a finite count; use e.g. 200M, 1.5G, 20B or 12000000")
    if value < 1:
        raise PolymemError(f"{option} {text!r} must be at least 1")
    return int(value)


def parse_orders(text: str) -> tuple[int, ...]:
    """'1,2,3' -> (1, 2, 3) (checked by :func:`polymem.hash.spec.check_orders`)."""
    from polymem.hash.spec import check_orders

    try:
        values = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise PolymemError(f"--orders {text!r} must be comma-separated integers, e.g. 1,2,3") from None
    return check_orders(values)


# ------------------------------------------------------------------------------ paths and URLs
# typer's Path type would turn s3://bucket/t into the local path s3:/bucket/t; path options parse the text
# themselves: a URL is kept where the library reads or writes URLs, refused where it needs a local path.
def local_path(takes: str, *, exists: bool = False, file: bool = False) -> Callable[[str], Path]:
    """A typer ``parser`` for an option that takes a local path (``takes``: what, e.g. "a local file"): the
    Path (file://PATH too); a URL is refused, with ``exists`` a path that is not there, with ``file`` a
    directory."""

    def parse(value: str) -> Path:
        if is_url(value, remote=True):
            raise typer.BadParameter(f"{value!r} is a URL; this takes {takes}: give a local path (or file://PATH)")
        path = Path(value.removeprefix("file://"))
        if exists and not path.exists():
            raise typer.BadParameter(f"{value!r} does not exist; give {takes}")
        if file and path.is_dir():
            raise typer.BadParameter(f"{value!r} is a directory; give {takes}")
        return path

    return parse


def corpus_source(value: str) -> str | Path:
    """A typer ``parser`` for a corpus option: ``sample:NAME`` the shipped corpus NAME, a URL as given (read
    through fsspec), else a local path that must exist."""
    if value.startswith("sample:"):
        return sample_corpus(value)
    return value if is_url(value, remote=True) else local_path("corpus files or folders", exists=True)(value)


def sample_corpus(value: str) -> str:
    """A typer ``parser`` for corpus arguments that also take globs and ``-``: ``sample:NAME`` resolved to the
    shipped file (polymem/samples.py), anything else as given."""
    from polymem.samples import resolve_sample

    try:
        return str(resolve_sample(value))
    except PolymemError as e:
        raise typer.BadParameter(str(e)) from None


# ------------------------------------------------------------------------------ tokenizer and corpus
def tokenizer_spec(value: str) -> str:
    """A typer ``parser`` for every tokenizer option: a builtin model's name (smollm2-135m, gemma3-270m) becomes
    the path of that model's tokenizer.json (polymem.models.cache.model_tokenizer_file: converted from its GGUF
    once, named after the model); any other spec is passed on as given."""
    from polymem.models.registry import BUILTIN_MODELS

    if value not in BUILTIN_MODELS:
        return value
    from polymem.models.cache import model_tokenizer_file

    return str(model_tokenizer_file(value))


Tokenizer = Annotated[str, typer.Option("--tokenizer", "-t", parser=tokenizer_spec, help="Tokenizer spec: a name (cl100k_base, mistral-v1, bytes, …), a builtin model's name (smollm2-135m, gemma3-270m: its own tokenizer), hf:NAME, or a path to tokenizer.json / .model / .tiktoken.")]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="A pretrained model: smollm2-135m, gemma3-270m, a .gguf file, a transformers checkpoint folder, or hf:ORG/NAME (needs polymem[models]). Brings its own tokenizer.")]
CorpusFiles = Annotated[list[Path], typer.Option("--corpus", "-c", parser=corpus_source, help="Corpus files/folders (.txt, .md, .jsonl[.gz]), URLs (s3://bucket/shard-*.jsonl.zst) or sample:pydocs (shipped with polymem); repeatable.")]
MaxN = Annotated[int, typer.Option("--max-n", min=1, max=32, help="n-gram orders 1..N.")]
JsonOut = Annotated[Optional[Path], typer.Option("--json", parser=local_path("a local file"), help="Write the result as JSON here.")]
PlotOut = Annotated[Optional[Path], typer.Option("--plot", parser=local_path("a local file"), help="Write a plot (PNG) here; needs polymem[plot].")]
NormalizerOpt = Annotated[Normalizer, typer.Option("--normalizer", help="Per-byte normaliser of the hash spec.")]

# ------------------------------------------------------------------------------ table geometry (K, S, r, params)
Params = Annotated[str, typer.Option("--params", help="Table parameters (rows × head dim): 200M, 1.5G, 20B …; P = the most pages that fit.")]
Heads = Annotated[int, typer.Option("--heads", min=1, max=64, help="K: head rows per n-gram.")]
Slots = Annotated[int, typer.Option("--slots", min=1, max=1 << 16, help="S: slots per head per page (4 was best in PageGram).")]
HeadDim = Annotated[int, typer.Option("--head-dim", min=1, max=1 << 16, help="r: width of one head row.")]
Dtype = Annotated[AssetDtype, typer.Option("--dtype", help="Storage type of the table.")]
Orders = Annotated[str, typer.Option("--orders", help="n-gram orders, comma-separated, e.g. 1,2,3.")]

# ------------------------------------------------------------------------------ training (train, transfer)
TrainSteps = Annotated[Optional[int], typer.Option("--steps", min=1, help="Optimizer steps (default 620; 80 with --model).")]
TransferSteps = Annotated[Optional[int], typer.Option("--steps", min=1, help="Optimizer steps per recipient arm and seed (default 400; 40 with --model).")]
BatchSize = Annotated[Optional[int], typer.Option("--batch-size", min=1, help="Sequences per step (default 8; 4 with --model).")]
SiteBatchSize = Annotated[int, typer.Option("--batch-size", min=1, help="Sequences per step.")]  # attach: always a model
BlockSize = Annotated[int, typer.Option("--block-size", min=8, help="Tokens per sequence.")]
NLayer = Annotated[int, typer.Option("--n-layer", min=1, help="Transformer blocks.")]
DModel = Annotated[int, typer.Option("--d-model", min=16, help="Model width.")]
NHead = Annotated[int, typer.Option("--n-head", min=1, help="Attention heads.")]
Lr = Annotated[float, typer.Option("--lr", min=0.0, help="Dense AdamW peak learning rate.")]
TableLrMult = Annotated[float, typer.Option("--table-lr-mult", min=0.0, help="Table learning rate = lr × this (row-wise RMS rule).")]
MaxEvalTokens = Annotated[Optional[int], typer.Option("--max-eval-tokens", min=1, help="Cap on held-out tokens scored.")]
PrecisionOpt = Annotated[Precision, typer.Option("--precision", help="auto (bf16 autocast only where the CPU/GPU does bf16 natively and fast, else fp32; the choice and why are printed), fp32 or bf16; tables stay fp32.")]
BackbonePrecision = Annotated[Precision, typer.Option("--precision", help="The pretrained model's arithmetic: auto (bf16 where the CPU/GPU does bf16 natively: avx512_bf16, AMX, CUDA bf16; else fp32; the choice and why are printed), fp32 or bf16. Tables, sites' weights and losses stay fp32.")]
Bf16 = Annotated[Optional[bool], typer.Option("--bf16/--no-bf16", help="Deprecated: use --precision bf16|fp32.")]
Threads = Annotated[Optional[int], typer.Option("--threads", min=1, max=4096, help="torch CPU threads (default: one per physical core this process may use, fewer while other work keeps CPUs busy; said in one line).")]
Device = Annotated[str, typer.Option("--device", help="auto (CUDA when present, else CPU), cpu, cuda, cuda:1, …")]


def apply_threads(threads: int | None, console: Any) -> int:
    """Set torch's CPU threads: ``--threads``, else :func:`polymem._cpus.choose_threads` (printing its note when
    other work keeps the CPUs busy). Returns the count set."""
    import torch

    if threads is None:
        choice = choose_threads()
        threads = choice.threads
        if choice.note:
            console.print(choice.note, highlight=False, soft_wrap=True)
    torch.set_num_threads(threads)
    return threads


StorageOptionsOpt = Annotated[str | None, typer.Option(
    "--storage-options", metavar="JSON", help="fsspec storage options for s3:// (and other) URLs, e.g. "
    "'{\"endpoint_url\": \"http://127.0.0.1:9000\"}'; default: the AWS environment variables and config files.")]


def parse_storage_options(text: str | None) -> dict[str, Any]:
    """--storage-options JSON -> dict (exit 2 with the reason when it is not a JSON object)."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"{text!r} is not JSON ({e.msg} at column {e.colno}); pass a JSON object such as "
                                 "'{\"anon\": true}'", param_hint="'--storage-options'") from None
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{text!r} is a JSON {type(value).__name__}, expected an object such as "
                                 "'{\"anon\": true}'", param_hint="'--storage-options'")
    return value




def refuse_unused(mode: str, options: dict[str, tuple[Any, Any]]) -> None:
    """Options (by parameter name: ``table_lr_mult`` is ``--table-lr-mult``) given a value other than their default
    in a mode that does not read them: one error naming them (an option silently ignored reads as one that took
    effect)."""
    bad = ["--" + name.replace("_", "-") for name, (value, default) in options.items()
           if (getattr(value, "value", value)) != (getattr(default, "value", default))]
    if bad:
        one = len(bad) == 1
        raise PolymemError(f"{', '.join(bad)} {'has' if one else 'have'} no effect {mode}; drop {'it' if one else 'them'}")
