"""Errors on the library side: bad numbers, ragged ids and a killed worker give one-line PolymemErrors."""

from __future__ import annotations

import os
import re
import signal
import sys

import numpy as np
import pytest

import polymem
from polymem import HashSpec, Layout, PolymemError, TokenHashes
from polymem.errors import WorkerError
from polymem.tokenizers import Tokenizer


# --------------------------------------------------------------------------------------- Layout.for_params
def test_for_params_accepts_a_whole_float_budget() -> None:
    assert Layout.for_params(2.5e6) == Layout.for_params(2_500_000) == Layout(pages=1220)
    assert Layout.for_params(np.float64(2e6)).pages == 976 and Layout.for_params(np.int64(2_000_000)).pages == 976


@pytest.mark.parametrize("params,match", [
    (2.5e6 + 0.5, r"params=2500000\.5 is not a whole number of parameters"),
    (float("inf"), r"params=inf is not a finite number"),
    (float("nan"), r"params=nan is not a finite number"),
    ("2M", r"params='2M' must be a number"),
    (True, r"params=True must be a number"),
])
def test_for_params_refuses_other_budgets_clearly(params, match: str) -> None:
    with pytest.raises(PolymemError, match=match):
        Layout.for_params(params)


@pytest.mark.parametrize("field", ["heads", "slots", "head_dim"])
def test_for_params_with_a_zero_or_float_geometry_is_an_error_not_a_zero_division(field: str) -> None:
    with pytest.raises(PolymemError, match=rf"layout {field}=0 must be an integer in \[1, "):
        Layout.for_params(2_000_000, **{field: 0})
    with pytest.raises(PolymemError, match=rf"layout {field}=2\.5 must be an integer"):
        Layout.for_params(2_000_000, **{field: 2.5})


# --------------------------------------------------------------------------------------------- ragged ids
def test_ragged_id_lists_are_a_clear_error() -> None:
    cache = TokenHashes.build("bytes", HashSpec())
    layout = Layout(pages=4, heads=2, slots=2, head_dim=4)
    for call in (lambda ids: cache.ngram_hashes(ids, 2), lambda ids: cache.ngram_rows(ids, layout, 2),
                 lambda ids: cache.check_ids(ids)):
        with pytest.raises(PolymemError, match=r"token ids are a ragged list \(row lengths 3, 1\); pass one "
                                               r"sequence \[T\] or equal-length rows \[B, T\]"):
            call([[1, 2, 3], [4]])
        with pytest.raises(PolymemError, match=r"token ids must be integers"):
            call([[1, "x"]])
    assert cache.ngram_hashes([[1, 2], [3, 4]], 2)[0].shape == (2, 2, 2)  # equal rows still work


# --------------------------------------------------------------------------------------------- killed worker
class _Killer(Tokenizer):
    """Byte ids; a worker process that meets the text KILL dies by SIGKILL (an OOM killer, a user's kill -9)."""

    def __init__(self, parent: int) -> None:
        self.parent = parent
        super().__init__(name="killer", family="bytes", vocab_size=256, dummy_prefix=False, lossy=False)

    def _encode(self, text: str) -> list[int]:
        if "KILL" in text and os.getpid() != self.parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return list(text.encode())

    def _compute_all_token_bytes(self) -> list[bytes | None]:
        return [bytes([b]) for b in range(256)]


@pytest.mark.slow  # ~30 s: a local Dask cluster, a killed worker, its nanny's restart and the shutdown
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_task_that_kills_its_worker_is_a_one_line_error() -> None:
    """A partition that kills every worker running it (here: SIGKILL on a marked document; in life: one document
    too large for a worker's memory) ends, after Dask's retries, in one line instead of a KilledWorker traceback."""
    pytest.importorskip("distributed")
    import cloudpickle
    import dask

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import tests/
    docs = ["plain text"] * 3 + ["KILL"] + ["more text"] * 3
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):  # give up after the first death
        with pytest.raises(WorkerError) as e:
            polymem.coverage(_Killer(os.getpid()), "bytes", docs, max_n=2, workers=2, processes=True,
                             partition_mb=1e-6)
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, PolymemError) and isinstance(e.value, RuntimeError)
    # the partition with KILL (3), or another one queued on the same worker when it died (Dask fails those too,
    # and whichever result comes back first is reported): a fresh-clone run reported partition 1
    assert re.match(r"a coverage task \(partition [0-6] of the corpus\) was lost with the worker process running it",
                    msg), msg
    assert "KilledWorker" in msg and "Rerun with fewer --workers" in msg
    # the same documents in this process (where KILL is harmless) give a report
    assert polymem.coverage(_Killer(os.getpid()), "bytes", docs, max_n=2).docs == 7
