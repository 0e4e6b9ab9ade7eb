"""NF4 row codec: the worked example, a plain-Python reference, error bounds, and bad input."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from polymem.asset import nf4
from polymem.errors import PolymemError


def reference_quantize_row(row: list[float]) -> bytes:
    """Readable reference: nearest level (ties to the lower code), low nibble first, fp16 absmax scale."""
    absmax = max(abs(v) for v in row)
    scale = struct.unpack("<e", struct.pack("<e", absmax))[0]
    levels = [float(v) for v in nf4.NF4_LEVELS]
    codes = []
    for v in row:
        x = min(1.0, max(-1.0, v / scale)) if scale > 0 else 0.0
        x = float(np.float32(x))
        # nearest level = number of midpoints below x (strictly: a tie goes to the lower code)
        mids = [float(np.float32((np.float32(levels[i]) + np.float32(levels[i + 1])) / np.float32(2))) for i in range(15)]
        best = sum(1 for m in mids if x > m)
        codes.append(best)
    packed = bytes(codes[2 * i] | (codes[2 * i + 1] << 4) for i in range(len(row) // 2))
    return packed + struct.pack("<e", absmax)


def test_worked_example_from_docstring():
    q = nf4.quantize(np.array([1.0, -0.5, 0.0, 0.25], dtype=np.float32))
    assert q.tobytes().hex() == "2fa7003c"
    np.testing.assert_allclose(nf4.dequantize(q, 4), [1.0, -0.5250730514526367, 0.0, 0.2461123913526535], rtol=1e-7)


def test_row_bytes_34_for_64():
    assert nf4.row_bytes(64) == 34
    assert nf4.quantize(np.zeros((5, 64), np.float32)).shape == (5, 34)


def test_levels_are_qlora_nf4():
    assert nf4.NF4_LEVELS.shape == (16,)
    assert nf4.NF4_LEVELS[0] == -1.0 and nf4.NF4_LEVELS[7] == 0.0 and nf4.NF4_LEVELS[15] == 1.0
    assert np.all(np.diff(nf4.NF4_LEVELS) > 0)


def test_zero_row_is_code_7_scale_0():
    q = nf4.quantize(np.zeros(8, np.float32))
    assert q.tobytes() == bytes([0x77] * 4) + b"\x00\x00"
    assert not nf4.dequantize(q, 8).any()


rows = hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.sampled_from([2, 4, 8, 64])),
                  elements=st.floats(-1000, 1000, width=32))


@settings(max_examples=60, deadline=None)
@given(rows)
def test_matches_reference_and_error_bound(x):
    q = nf4.quantize(x)
    for i in range(x.shape[0]):
        assert q[i].tobytes() == reference_quantize_row([float(v) for v in x[i]])
    xh = nf4.dequantize(q, x.shape[1])
    scale = q[:, -2:].copy().view("<f2")[:, 0].astype(np.float64)
    # each value is within half the widest level gap of its level, plus what a scale rounded *down* to
    # float16 clips off (rows below float16's smallest subnormal, ~6e-8, become zero)
    absmax = np.abs(x).max(axis=1).astype(np.float64)
    gap = 0.5 * float(np.diff(nf4.NF4_LEVELS).max())
    bound = scale * gap + np.maximum(absmax - scale, 0) + absmax * 1e-6 + 1e-30
    assert np.all(np.abs(xh - x).max(axis=1) <= bound)
    # re-quantising the dequantised rows is a fixed point
    assert np.array_equal(nf4.quantize(xh), q)


def test_reconstruction_error_stats():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 64)).astype(np.float32)
    e = nf4.reconstruction_error(x, nf4.dequantize(nf4.quantize(x), 64))
    assert e.rows == 1000 and 0 < e.rel_mean < e.rel_max < 0.2 and e.rms_mean <= e.rms_max
    zero = nf4.reconstruction_error(np.zeros((3, 4)), np.zeros((3, 4)))
    assert (zero.rms_max, zero.rel_max) == (0.0, 0.0)


@pytest.mark.parametrize(
    "x, match",
    [
        (np.zeros((2, 3), np.float32), "even head_dim"),
        (np.array([np.inf, 0.0], np.float32), "NaN or inf"),
        (np.array([1e6, 0.0], np.float32), "float16's range"),
    ],
)
def test_bad_input(x, match):
    with pytest.raises(PolymemError, match=match):
        nf4.quantize(x)


def test_dequantize_checks_row_width():
    with pytest.raises(PolymemError, match="34 bytes"):
        nf4.dequantize(np.zeros((1, 33), np.uint8), 64)


@settings(max_examples=60, deadline=None)
@given(rows)
def test_numba_and_numpy_quantize_agree(x):
    assert nf4.quantize(x).tobytes() == nf4.quantize_numpy(x).tobytes()


def test_quantize_keeps_leading_shape():
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 8)).astype(np.float32)
    q = nf4.quantize(x)
    assert q.shape == (2, 3, 5, 6) and np.array_equal(q, nf4.quantize_numpy(x))
    assert nf4.quantize(np.zeros((0, 8), np.float32)).shape == (0, 6)
