"""A training checkpoint read back (polymem/recipes/checkpoint.py) is checked before any of it is used: state.json
against its declared schema, the dense file's names and shapes, each row file's tensors and rows. Unit level: a
small table, a linear layer and their optimizers, no model or corpus."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from fifos import fifo, quick
from polymem.errors import PolymemError
from polymem.hash.layout import Layout
from polymem.hash.spec import HashSpec
from polymem.recipes.checkpoint import Checkpoints, check_checkpoint_path, remove_checkpoint
from polymem.torch.optim import SparseRowRMS
from polymem.torch.tables import TrainableTable

STEPS = 10


def _run(path: Path, seed: int = 0) -> Checkpoints:
    torch.manual_seed(seed)
    layout = Layout.for_params(64 * 4 * 4 * 8, heads=4, slots=4, head_dim=8)
    table = TrainableTable(None, spec=HashSpec(), layout=layout, orders=(1, 2))
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(lin.parameters())
    lin(torch.ones(1, 3)).sum().backward()
    opt.step()  # AdamW now has its moments
    return Checkpoints(path, every=2, key="k", modules={"m": lin}, opt=opt, table=table, topt=SparseRowRMS([table.weight]),
                       steps=STEPS)


@pytest.fixture
def ckpt(tmp_path) -> Path:
    p = tmp_path / "out.pmem.ckpt"
    _run(p).save(4, [2.0, 1.5, 1.25, 1.0], 3.5)
    return p


def test_a_whole_checkpoint_resumes(ckpt):
    assert _run(ckpt, seed=1).resume() == {"step": 4, "losses": [2.0, 1.5, 1.25, 1.0], "train_s": 3.5, "world": 1}


def _state(edit):
    def apply(p: Path) -> None:
        head = json.loads((p / "state.json").read_text())
        (p / "state.json").write_text(json.dumps(edit(head)))
    return apply


def _rows(edit):
    def apply(p: Path) -> None:
        from safetensors.torch import load_file, save_file

        f = next(p.glob("rows-*.safetensors"))
        save_file(edit(load_file(str(f))), str(f))
    return apply


def _dense(edit):
    def apply(p: Path) -> None:
        from safetensors.torch import load_file, save_file

        f = p / "dense.safetensors"
        save_file(edit(load_file(str(f))), str(f))
    return apply


CASES = {
    "step -1": (_state(lambda h: {**h, "step": -1}), "field 'step' is -1; expected an integer in [1, 9]"),
    "step 10^12": (_state(lambda h: {**h, "step": 10**12}), "field 'step' is 1000000000000; expected an integer in [1, 9]"),
    "step 9.5": (_state(lambda h: {**h, "step": 9.5}), "field 'step' is 9.5; expected an integer"),
    "step 'ten'": (_state(lambda h: {**h, "step": "ten"}), "field 'step' is 'ten'"),
    "losses of strings": (_state(lambda h: {**h, "losses": ["a", "b", "c", "d"]}), "field 'losses[0]' is 'a'"),
    "train_s a string": (_state(lambda h: {**h, "train_s": "3.5"}), "field 'train_s' is '3.5'"),
    "losses short of the step": (_state(lambda h: {**h, "losses": [1.0]}), "it records 1 losses for step 4"),
    "world 0": (_state(lambda h: {**h, "world": 0}), "field 'world' is 0"),
    "rows file short of its rows": (_rows(lambda d: {k: v[:-3] for k, v in d.items()}), "holds 'n' as I32 ["),
    "rows file missing a tensor": (_rows(lambda d: {"v": d["v"]}), "holds ['v'], not the tensors ['n', 'v']"),
    "dense moment of the wrong shape": (_dense(lambda d: {**d, "adam.0.exp_avg": torch.zeros(5)}),
                                        "optimizer moment 'adam.0.exp_avg' is torch.float32 (5,)"),
    "dense moment of no parameter": (_dense(lambda d: {**d, "adam.7.exp_avg": torch.zeros(2)}),
                                     "'adam.7.exp_avg' names no parameter of this run's 2"),
    "dense weight missing": (_dense(lambda d: {k: v for k, v in d.items() if k != "m.bias"}), "lacks ['m.bias']"),
    "dense weight of the wrong shape": (_dense(lambda d: {**d, "m.weight": torch.zeros(2, 4)}),
                                        "its weight 'm.weight' is torch.float32 (2, 4)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_edited_or_damaged_checkpoint_is_one_error_naming_what(ckpt, case):
    """Before: the step used as is (-1: 11 steps run; 10^12: none, and the half-trained table written as finished;
    9.5: truncated), tracebacks for the others, a wrong-shaped moment met at the next optimizer step."""
    edit, says = CASES[case]
    edit(ckpt)
    with pytest.raises(PolymemError) as e:
        _run(ckpt, seed=1).resume()
    msg = str(e.value)
    assert says in msg and "remove" in msg and "\n" not in msg, msg


def test_a_state_file_that_is_a_fifo_or_huge_is_refused_unread(ckpt):
    (ckpt / "state.json").unlink()
    with fifo(ckpt / "state.json"):
        got = quick(_run(ckpt, seed=1).resume)
    assert isinstance(got, PolymemError) and "is a FIFO (named pipe)" in str(got), got
    os.unlink(ckpt / "state.json")
    with open(ckpt / "state.json", "wb") as f:
        f.truncate(1 << 30)
    with pytest.raises(PolymemError, match="is 1,073,741,824 bytes; polymem reads one of at most 16,777,216"):
        _run(ckpt, seed=1).resume()


@pytest.mark.parametrize("which", ["", ".tmp", ".old"])
def test_a_checkpoint_path_that_is_a_link_is_refused_before_the_run(tmp_path, which):
    """Before: the run trained, wrote its asset, then died in the clean-up ('Cannot call rmtree on a symbolic
    link', naming no path)."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "keep.txt").write_text("keep")
    out = tmp_path / "out.pmem.ckpt"
    (tmp_path / f"out.pmem.ckpt{which}").symlink_to(real)
    with pytest.raises(PolymemError, match=rf"the checkpoint path '.*out\.pmem\.ckpt{which}' is a symbolic link "
                                           rf"\(to '.*real'\); .* Remove the link"):
        check_checkpoint_path(out)
    with pytest.raises(PolymemError, match="is a symbolic link"):
        _run(out)
    with pytest.raises(PolymemError, match="is a symbolic link"):
        remove_checkpoint(out)
    assert (real / "keep.txt").read_text() == "keep"


def test_train_refuses_a_linked_checkpoint_before_the_model_loads(tmp_path):
    from typer.testing import CliRunner

    from polymem.cli.app import app

    c = tmp_path / "c.txt"
    c.write_text("hello " * 50)
    (tmp_path / "real").mkdir()
    (tmp_path / "t.pmem.ckpt").symlink_to(tmp_path / "real")
    r = CliRunner().invoke(app, ["train", "--model", "no-such-model", "-c", str(c), "--out", str(tmp_path / "t.pmem")])
    assert isinstance(r.exception, PolymemError), (r.output, r.exception)
    assert "t.pmem.ckpt' is a symbolic link" in str(r.exception)


@pytest.mark.parametrize("name", ["rows", "dense.safetensors"])
def test_a_row_or_dense_file_that_is_a_fifo_is_refused_at_once(ckpt, name):
    f = next(ckpt.glob("rows-*.safetensors")) if name == "rows" else ckpt / name
    f.unlink()
    with fifo(f):
        got = quick(_run(ckpt, seed=1).resume)
    assert isinstance(got, PolymemError) and "is a FIFO (named pipe)" in str(got), got
