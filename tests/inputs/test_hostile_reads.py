"""The one opener for files polymem reads whole (polymem/_io.py: open_regular, read_bounded, read_json), the
declared schemas (polymem/_schema.py), and the output-over-input check reaching the files an input names."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest

from fifos import fifo, quick
from polymem._io import check_outputs_not_inputs, read_bounded, read_json
from polymem._schema import Const, Int, ListOf, Nullable, Num, Obj, Str, validate
from polymem.errors import FormatError, OutputError, PolymemError


def test_a_fifo_is_refused_at_once_and_a_regular_file_read(tmp_path):
    with fifo(tmp_path / "pipe.json") as p:
        got = quick(read_json, p, what="manifest")
    assert isinstance(got, FormatError)
    assert f"manifest {str(p)!r} is a FIFO (named pipe), not a regular file" in str(got)
    (tmp_path / "ok.json").write_text('{"a": 1}')
    assert read_json(tmp_path / "ok.json", what="manifest") == {"a": 1}
    with pytest.raises(FormatError, match="is a directory, not a regular file"):
        read_bounded(tmp_path, what="state", max_bytes=10)
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "none", what="state", max_bytes=10)


def test_a_file_over_the_bound_is_refused_unread(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB of NULs
    tracemalloc.start()
    with pytest.raises(FormatError, match=r"'.*big\.json' is 1,073,741,824 bytes; polymem reads one of at most "
                                          r"16,777,216 bytes \(it was not read\)"):
        read_json(big, what="manifest")
    assert tracemalloc.get_traced_memory()[1] < 1 << 20
    tracemalloc.stop()


@pytest.mark.parametrize("data, says", [(b"\xff\xfe", "UnicodeDecodeError"), (b"[" * 100_000, "RecursionError"),
                                        (b"1" * 5000, "ValueError"), (b"{", "JSONDecodeError")])
def test_text_that_is_not_json_is_one_error(tmp_path, data, says):
    (tmp_path / "x.json").write_bytes(data)
    with pytest.raises(FormatError, match=f"state '.*x.json' is not JSON \\({says}"):
        read_json(tmp_path / "x.json", what="state")


STATE = Obj({"step": Int(1, 9), "losses": ListOf(Num(finite=False), max_len=9), "train_s": Num(0),
             "key": Str(8), "bos": Nullable(Int(0, 5)), "format": Const(("x",))})
GOOD = {"step": 2, "losses": [1.5, float("nan")], "train_s": 0.5, "key": "k", "bos": None, "format": "x"}


@pytest.mark.parametrize("edit, says", [
    ({"step": -1}, "field 'step' is -1; expected an integer in [1, 9]"),
    ({"step": 10**12}, "field 'step' is 1000000000000; expected an integer in [1, 9]"),
    ({"step": 9.5}, "field 'step' is 9.5; expected an integer"),
    ({"step": 2.0}, "field 'step' is 2.0; expected an integer"),
    ({"step": True}, "field 'step' is True; expected an integer"),
    ({"step": "ten"}, "field 'step' is 'ten'; expected an integer"),
    ({"losses": ["a"]}, "field 'losses[0]' is 'a'; expected a number"),
    ({"losses": [0.0] * 10}, "; expected a list of at most 9 items"),
    ({"train_s": "1"}, "field 'train_s' is '1'; expected a finite number >= 0"),
    ({"train_s": float("inf")}, "field 'train_s' is inf; expected a finite number"),
    ({"key": ""}, "field 'key' is ''; expected a non-empty string"),
    ({"bos": 6}, "field 'bos' is 6; expected null or an integer in [0, 5]"),
    ({"format": "y"}, "field 'format' is 'y'; expected one of 'x'"),
    ({"step": None}, "field 'step' is None"),
])
def test_a_field_outside_its_declared_schema_is_one_error_naming_it(edit, says):
    validate(GOOD, STATE, where="s.json", fix="remove it")
    with pytest.raises(FormatError) as e:
        validate({**GOOD, **edit}, STATE, where="s.json", fix="remove it")
    assert str(e.value).startswith("s.json: ") and str(e.value).endswith(": remove it")
    assert says in str(e.value), str(e.value)
    with pytest.raises(FormatError, match="field 'train_s' is \\(missing\\)"):
        validate({k: v for k, v in GOOD.items() if k != "train_s"}, STATE, where="s.json", fix="remove it")
    with pytest.raises(FormatError, match="the file is \\[1\\]; expected an object"):
        validate([1], STATE, where="s.json", fix="remove it")


def test_jsonschema_agrees_with_the_declared_schema_on_the_checkpoint_state():
    """The checkpoint's state schema, written out as JSON Schema, accepts and refuses what polymem's does."""
    jsonschema = pytest.importorskip("jsonschema")
    from polymem.recipes.checkpoint import FORMAT, VERSION, state_schema

    js = {"type": "object", "required": ["format", "version", "key", "step", "world", "losses", "train_s"],
          "properties": {"format": {"const": FORMAT}, "version": {"const": VERSION}, "key": {"type": "string", "minLength": 1},
                         "step": {"type": "integer", "minimum": 1, "maximum": 6}, "world": {"type": "integer", "minimum": 1},
                         "losses": {"type": "array", "items": {"type": "number"}, "maxItems": 6},
                         "train_s": {"type": "number", "minimum": 0}}}
    good = {"format": FORMAT, "version": VERSION, "key": "k", "step": 4, "world": 1, "losses": [1.0] * 4,
            "train_s": 1.5}
    for edit in ({}, {"step": -1}, {"step": 7}, {"step": 9.5}, {"step": "ten"}, {"losses": ["a"]},
                 {"train_s": "x"}, {"world": 0}, {"key": 3}):
        doc = {**good, **edit}
        ours = theirs = True
        try:
            validate(doc, state_schema(7), where="s", fix="f")
        except FormatError:
            ours = False
        try:
            jsonschema.validate(doc, js)
        except jsonschema.ValidationError:
            theirs = False
        assert ours == theirs, edit


def _site(folder: Path, table_path: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "site.json").write_text(json.dumps({"table": {"source": {"kind": "asset", "path": table_path}}}))
    return folder


def test_an_output_over_the_table_a_site_names_is_refused(tmp_path, monkeypatch):
    """--json over a file of the table a --site names (the path as recorded, or relative to the site folder)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.pmem").mkdir()
    (tmp_path / "t.pmem" / "zarr.json").write_text("{}")
    site = _site(tmp_path / "s", str(tmp_path / "t.pmem"))
    with pytest.raises(OutputError, match=r"--json 't\.pmem/zarr\.json' is inside an input of this run \(the "
                                          r"site's table \(named by '.*s'\) directory '.*t\.pmem'\)"):
        check_outputs_not_inputs({"--json": "t.pmem/zarr.json"}, [("site", site)])
    rel = _site(tmp_path / "r", "../t.pmem")  # a path relative to the site folder
    with pytest.raises(OutputError, match="is inside an input of this run"):
        check_outputs_not_inputs({"--json": "t.pmem/zarr.json"}, [("site", rel)])
    link = tmp_path / "link.pmem"
    link.symlink_to(tmp_path / "t.pmem")
    linked = _site(tmp_path / "l", str(link))  # links resolved
    with pytest.raises(OutputError, match="is inside an input of this run"):
        check_outputs_not_inputs({"--json": "t.pmem/zarr.json"}, [("site", linked)])
    check_outputs_not_inputs({"--json": "report.json"}, [("site", site)])  # beside them: fine
    bad = tmp_path / "b"
    bad.mkdir()
    os.mkfifo(bad / "site.json")  # the site's own reader says what is wrong; the check neither waits nor fails
    quick(check_outputs_not_inputs, {"--json": "report.json"}, [("site", bad)])
    assert (tmp_path / "t.pmem" / "zarr.json").read_text() == "{}"


def test_prompts_fifo_and_oversized_prompts_are_one_line(tmp_path):
    from typer.testing import CliRunner

    from polymem.cli.app import app

    with fifo(tmp_path / "p.txt") as p:
        r = quick(CliRunner().invoke, app, ["generate", "--model", "smollm2-135m", "--prompts", str(p)])
    assert isinstance(r.exception, PolymemError), (r.output, r.exception)
    assert "is a FIFO (named pipe), not a regular file" in str(r.exception)
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate((64 << 20) + 1)
    r = CliRunner().invoke(app, ["generate", "--model", "smollm2-135m", "--prompts", str(big)])
    assert isinstance(r.exception, PolymemError), (r.output, r.exception)
    assert "is 67,108,865 bytes; polymem reads one of at most 67,108,864" in str(r.exception)


@pytest.mark.parametrize("value", ["inf", "1e30"])
def test_cache_mb_out_of_range_is_one_line_before_the_model_loads(value, tmp_path):
    from typer.testing import CliRunner

    from polymem.cli.app import app

    r = CliRunner().invoke(app, ["generate", "--model", str(tmp_path / "no-such-model.gguf"), "--prompt", "x",
                                 "--cache-mb", value])
    assert isinstance(r.exception, PolymemError), (r.output, r.exception)
    assert "--cache-mb=" in str(r.exception) and "must be a number in [0, 1,073,741,824]" in str(r.exception)
    assert "no-such-model" not in str(r.exception)  # said before the model is looked for


def test_a_corpus_of_one_oversized_document_says_so_and_names_the_bound(tmp_path):
    from polymem.recipes.data import read_named_documents

    (tmp_path / "one.txt").write_bytes(b"a" * (17 << 20))
    with pytest.raises(PolymemError) as e:
        read_named_documents([tmp_path])
    msg = str(e.value)
    assert "no documents read from" in msg and "every one was left out (1 document too large)" in msg, msg
    assert "16,777,216 bytes" in msg and "one.txt" in msg, msg


@pytest.mark.parametrize("edit, says", [
    (lambda h: h["site"].update(max_n=-1), "field 'site.max_n' is -1; expected an integer >= 0"),
    (lambda h: h.update(layers=[]), "field 'layers' is []; expected a list of 1 to 4,096 items"),
    (lambda h: h["site"].update(gate_init=float("nan")), "field 'site.gate_init' is nan; expected a finite number"),
    (lambda h: h["table"].update(orders=[1, "2"]), "field 'table.orders[1]' is '2'; expected an integer"),
    (lambda h: h.update(train="everything"), "field 'train' is 'everything'; expected one of 'projection'"),
])
def test_a_site_json_field_outside_its_schema_is_one_error(tmp_path, edit, says):
    import shutil

    from fuzz_seeds import seed_files
    from polymem.torch.sitefile import read_site

    site = tmp_path / "site"
    shutil.copytree(seed_files("site")[0].parent, site)
    read_site(site)
    head = json.loads((site / "site.json").read_text())
    edit(head)
    (site / "site.json").write_text(json.dumps(head))
    with pytest.raises(FormatError, match="save the site again") as e:
        read_site(site)
    assert says in str(e.value), str(e.value)


@pytest.mark.parametrize("name", ["tokenizer.json", "x.tiktoken", "sp.model"])
def test_a_tokenizer_file_that_is_a_fifo_is_refused_unopened(tmp_path, name):
    from polymem.errors import TokenizerError
    from polymem.tokenizers import load_tokenizer

    with fifo(tmp_path / name) as p:
        got = quick(load_tokenizer, str(p))
    assert isinstance(got, TokenizerError) and "is a FIFO (named pipe), not a regular file" in str(got), got


@pytest.mark.parametrize("which", ["model config", "transfer result", "tokenizers check --text"])
def test_other_files_read_whole_refuse_a_fifo(tmp_path, which):
    """A model folder's config.json, a transfer result in --out-dir, a --text file: the same opener."""
    from polymem.models.registry import _check_checkpoint
    from polymem.recipes.pretrained import _read

    if which == "model config":
        with fifo(tmp_path / "config.json"):
            got = quick(_check_checkpoint, tmp_path)
    elif which == "transfer result":
        with fifo(tmp_path / "r.json") as p:
            got = quick(_read, p)
    else:
        from typer.testing import CliRunner

        from polymem.cli.app import app

        with fifo(tmp_path / "t.txt") as p:
            got = quick(CliRunner().invoke, app, ["tokenizers", "check", "bytes", "--text", str(p)]).exception
    assert isinstance(got, PolymemError) and "is a FIFO (named pipe), not a regular file" in str(got), got


def test_a_resumed_result_is_read_through_the_one_opener(tmp_path: Path) -> None:
    """The content study's and the teach arms' resumable pieces (donor-own.json, teach.json): the file of these
    settings is reused, another key is computed again, a FIFO or text that is not JSON is one line (before: a plain
    read, which waited on a FIFO and raised a JSONDecodeError traceback)."""
    from polymem._io import atomic_write_json, read_keyed

    f = tmp_path / "donor-own.json"
    assert read_keyed(f, "k1", what="the donor's own scores") is None
    atomic_write_json(f, {"key": "k1", "bpb": 1.0})
    assert read_keyed(f, "k1", what="the donor's own scores") == {"key": "k1", "bpb": 1.0}
    assert read_keyed(f, "k2", what="the donor's own scores") is None
    f.write_text('{"key": "k1", "bpb": ')
    with pytest.raises(FormatError, match="the donor's own scores .* is not JSON.*remove it"):
        read_keyed(f, "k1", what="the donor's own scores")
    g = tmp_path / "teach.json"
    with fifo(g):
        with pytest.raises(FormatError, match="teach.json"):
            read_keyed(g, "k1", what="the donor's text")
