"""What each command needs beyond the core, checked before any work: one table, consulted first by every command.

    check_needs("coverage", locals())   # the first line of `polymem coverage`: its --plot needs matplotlib,
                                        # its outputs must be writable, its inputs find their packages

:data:`NEEDS` maps a command to its parameters (by their Python name) and what a value given to each needs:

* an extra: ``--plot`` needs matplotlib (``polymem[plot]``), ``--model`` transformers, gguf and accelerate
  (``polymem[models]``), ``--dask``/``--processes`` distributed (``polymem[dask]``);
* an extra chosen by the value: a builtin Mistral tokenizer needs mistral-common, ``hf:NAME`` huggingface_hub,
  a ``.zst`` corpus zstandard, a Parquet corpus pyarrow, an ``s3://`` URL s3fs;
* a writable place: a file output (``--json``, ``--plot``, ``--csv``), a directory output (an asset).

A missing package is a :class:`~polymem._optional.MissingExtraError` naming the option and the extra; an
unwritable output an :class:`~polymem._io.OutputError`; the CLI prints either as one line and exits 2.
tests/cli/test_needs_and_output.py holds every command to failing this way before it counts, trains or reads anything.

What this module does not do: import the packages (it looks them up, which costs nothing), or check what only
the work itself can tell (a tokenizer file's contents, a corpus's records, an asset's checksums).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from polymem._optional import missing_extra


def _find(module: str) -> bool:
    """Is ``module`` importable? Looked up, not imported (an import hook that refuses it counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _require(packages: tuple[tuple[str, str], ...], extra: str, purpose: str) -> None:
    for module, package in packages:
        if not _find(module):
            raise missing_extra(package, extra, purpose)


def _plot(value: Any, purpose: str) -> None:
    _require((("matplotlib", "matplotlib"),), "plot", purpose)
    _file(value, purpose)


def _model(value: Any, purpose: str) -> None:
    _require((("transformers", "transformers"), ("gguf", "gguf"), ("accelerate", "accelerate")), "models",
             f"{purpose} {value}")


def _dask(value: Any, purpose: str) -> None:
    _require((("distributed", "distributed"),), "dask", purpose)


def _tokenizer(value: Any, purpose: str) -> None:
    from polymem.tokenizers.registry import MISTRAL_FILES

    spec = str(value)
    if spec in MISTRAL_FILES:
        _require((("mistral_common", "mistral-common"),), "mistral", f"{purpose} {spec} (the builtin tokenizer)")
    elif spec.startswith("hf:"):
        _require((("huggingface_hub", "huggingface_hub"),), "hf", f"{purpose} {spec}")


def _source(value: Any, purpose: str) -> None:
    """A corpus file or asset, local or a URL: the packages its protocol and file kind need."""
    from polymem._paths import is_url, kind_of

    text = str(value)
    if is_url(text) and text.split("://", 1)[0] in ("s3", "s3a"):
        _require((("s3fs", "s3fs"),), "s3", f"{purpose} {text}")
    kind, compression = kind_of(text)
    if compression == "zstd":
        _require((("zstandard", "zstandard"),), "corpus", f"{purpose} {text}")
    if kind == "parquet":
        _require((("pyarrow", "pyarrow"),), "corpus", f"{purpose} {text}")


def _local(value: Any) -> str | None:
    """The local path an output names (None for stdout "-" and URLs, which are checked where they are written)."""
    from polymem._paths import is_url

    text = str(value)
    if text == "-" or is_url(text, remote=True):
        return None
    return text.removeprefix("file://")


def _file(value: Any, purpose: str, *, directory: bool = False) -> None:
    """A file output (``directory``: a directory to create, an asset): writable here, or its URL's package."""
    from polymem._io import check_output_path

    path = _local(value)
    if path is None:
        _source(value, purpose)
    else:
        check_output_path(path, directory=directory)


def _directory(value: Any, purpose: str) -> None:
    _file(value, purpose, directory=True)


def _table(value: Any, purpose: str) -> None:
    """`train --out`: a single-file table (NAME.safetensors) or an asset directory."""
    (_file if str(value).endswith(".safetensors") else _directory)(value, purpose)


PLOT, MODEL, DASK, TOKENIZER, SOURCE, FILE, DIRECTORY, TABLE = (_plot, _model, _dask, _tokenizer, _source, _file,
                                                                _directory, _table)
Needs = tuple[tuple[str, str, Callable[[Any, str], None]], ...]  # (flag or "" for an argument, parameter, need)

#: command -> what a value given to each of its parameters needs; every command is listed (tests/cli/test_needs_and_output.py)
NEEDS: dict[str, Needs] = {
    "attach": (("--model", "model", MODEL), ("--asset", "asset", SOURCE), ("--corpus", "corpus", SOURCE),
               ("--out", "out", DIRECTORY), ("--json", "json_out", FILE), ("--bundle", "bundle", DIRECTORY)),
    "bundle": (("--asset", "asset", SOURCE), ("--out", "out", DIRECTORY)),
    "build-cache": (("--tokenizer", "tokenizer", TOKENIZER), ("--output", "output", FILE), ("--json", "json_out", FILE)),
    "convert": (("", "src", SOURCE), ("--tokenizer", "tokenizer", TOKENIZER), ("--corpus", "corpus", SOURCE),
                ("--output", "output", DIRECTORY), ("--json", "json_out", FILE)),
    "coverage": (("", "paths", SOURCE), ("--target", "target", TOKENIZER), ("--reference", "reference", TOKENIZER),
                 ("--json", "json_out", FILE), ("--csv", "csv_out", FILE), ("--plot", "plot_out", PLOT),
                 ("--processes", "processes", DASK), ("--dask", "dask", DASK), ("--scratch", "scratch", SOURCE)),
    "demo": (("--a", "a", TOKENIZER), ("--b", "b", TOKENIZER)),
    "eval": (("--model", "model", MODEL), ("--corpus", "corpus", SOURCE), ("--table", "table", SOURCE),
             ("--json", "json_out", FILE)),
    "export": (("", "asset", SOURCE), ("--output", "output", DIRECTORY)),
    "generate": (("--model", "model", MODEL), ("--asset", "asset", SOURCE), ("--json", "json_out", FILE)),
    "import": (("--output", "output", DIRECTORY), ("--tokenizer", "tokenizer", TOKENIZER)),
    "init": (("", "asset", DIRECTORY),),
    "inspect": (("", "asset", SOURCE),),
    "iosim": (("", "paths", SOURCE), ("--tokenizer", "tokenizer", TOKENIZER), ("--asset", "asset", SOURCE),
              ("--json", "json_out", FILE), ("--plot", "plot_out", PLOT)),
    "models": (),
    "models clear": (),
    "merge": (("", "assets", SOURCE), ("--output", "output", DIRECTORY), ("--json", "json_out", FILE)),
    "pull": (("", "url", SOURCE), ("", "directory", DIRECTORY)),
    "push": (("", "url", SOURCE),),
    "quantize": (("", "asset", SOURCE), ("--output", "output", DIRECTORY), ("--check-model", "check_model", MODEL)),
    "subset": (("", "asset", SOURCE), ("--output", "output", DIRECTORY), ("--tokenizer", "tokenizer", TOKENIZER),
               ("--corpus", "corpus", SOURCE), ("--heldout", "heldout", SOURCE), ("--json", "json_out", FILE)),
    "tokenizers": (),
    "tokenizers check": (("", "spec", TOKENIZER),),
    "train": (("--corpus", "corpus", SOURCE), ("--out", "out", TABLE), ("--tokenizer", "tokenizer", TOKENIZER),
              ("--model", "model", MODEL), ("--heldout", "heldout", SOURCE), ("--json", "json_out", FILE)),
    "transfer": (("--asset", "asset", SOURCE), ("--corpus", "corpus", SOURCE), ("--tokenizer", "tokenizer", TOKENIZER),
                 ("--model", "model", MODEL), ("--eval-corpus", "eval_corpus", SOURCE), ("--json", "json_out", FILE),
                 ("--plot", "plot", PLOT)),
    "upgrade": (),
    "verify": (("", "asset", SOURCE),),
}


def check_needs(command: str, given: dict[str, Any]) -> None:
    """Check the values ``command`` was given (its parameters by name: the command passes ``locals()`` as its
    first statement) against :data:`NEEDS`."""
    for flag, name, need in NEEDS[command]:
        value = given[name]
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and v is not False:
                need(v, f"{command} {flag}".rstrip())
