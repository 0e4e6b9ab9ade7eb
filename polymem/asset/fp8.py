"""FP8 rows as DeepSeek-V4.1's Engram tables store them: E4M3 values with one E8M0 scale per 32 values.

A row of 256 values is 256 ``float8_e4m3fn`` bytes (``…engram.embed.weight``) and 8 ``float8_e8m0fnu`` bytes
(``…engram.embed.scale``): 264 bytes. Value ``j`` of a row is ``e4m3(w[j]) × 2^(s[j // 32] − 127)``.

* E4M3 (the "fn" variant): sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; ``0x7f``/``0xff``
  are NaN; the largest finite value is 448; exponent 0 holds subnormals ``m/8 · 2^-6``.
* E8M0: an unsigned exponent byte, ``2^(b − 127)``; ``0xff`` is NaN. Every ``2^(b−127)`` is a float32, so a
  decoded value is one correctly rounded float32 product (what torch computes).

Pure numpy; no torch. Not here: the asset row layouts that use these (``polymem/asset/_codec.py``); the
engines' import and export (``polymem/engines/io.py``) use them from here.
"""

from __future__ import annotations

import numpy as np

from polymem.errors import PolymemError

E4M3_MAX = 448.0
BLOCK = 32  # values per E8M0 scale


def _e4m3_table() -> np.ndarray:
    """float32 [256]: the value of every E4M3 byte."""
    code = np.arange(256)
    exp, man = (code >> 3) & 0xF, (code & 0x7).astype(np.float64)
    mag = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * 2.0 ** (exp - 7))
    mag = np.where(code & 0x7F == 0x7F, np.nan, mag)
    return np.where(code & 0x80, -mag, mag).astype(np.float32)


_E4M3 = _e4m3_table()
_POSITIVE = _E4M3[:0x7F].astype(np.float64)  # codes 0 … 0x7e, increasing: 0 … 448


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """uint8 [...] -> float32 [...]: ``decode_e4m3(np.array([0x38, 0x7e, 0x01])) == [1.0, 448.0, 2**-9]``."""
    return _E4M3[np.asarray(codes, dtype=np.uint8)]


def decode_e8m0(scales: np.ndarray) -> np.ndarray:
    """uint8 [...] -> float32 [...]: ``2^(b − 127)``, NaN for 0xff."""
    b = np.asarray(scales, dtype=np.uint8)
    out = np.ldexp(np.float32(1.0), np.minimum(b, 254).astype(np.int32) - 127).astype(np.float32)
    return np.where(b == 0xFF, np.float32(np.nan), out)


def decode_rows(weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """weight uint8 [R, D], scale uint8 [R, D // 32] -> float32 [R, D]."""
    w, s = np.asarray(weight, dtype=np.uint8), np.asarray(scale, dtype=np.uint8)
    if w.ndim != 2 or s.shape != (w.shape[0], w.shape[1] // BLOCK) or w.shape[1] % BLOCK:
        raise PolymemError(f"FP8 rows need weight [R, D] with D a multiple of {BLOCK} and scale [R, D // {BLOCK}]; "
                         f"got {w.shape} and {s.shape}")
    values = decode_e4m3(w).reshape(w.shape[0], -1, BLOCK)  # [R, D/32, 32]
    with np.errstate(over="ignore"):  # a scale near 2^127 overflows to ±inf, as torch's float32 product does
        out: np.ndarray = (values * decode_e8m0(s)[:, :, None]).reshape(w.shape)
        return out


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """float [...] -> uint8 [...]: nearest E4M3, ties to even; past ±448 saturates, as torch's cast does;
    NaN -> 0x7f."""
    v = np.asarray(x, dtype=np.float64)  # float32 and float64 inputs are read exactly
    mag = np.minimum(np.abs(v), E4M3_MAX)
    hi = np.clip(np.searchsorted(_POSITIVE, mag), 1, 0x7E)  # _POSITIVE[hi-1] ≤ mag ≤ _POSITIVE[hi]
    lo = hi - 1
    mid = (_POSITIVE[lo] + _POSITIVE[hi]) / 2  # exact in float64
    code = np.where(mag < mid, lo, np.where(mag > mid, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(np.signbit(v), code | 0x80, code)
    return np.where(np.isnan(v), 0x7F, code).astype(np.uint8)


def encode_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [R, D] -> (weight uint8 [R, D], scale uint8 [R, D // 32]), one power-of-two scale per block.

    A block's scale is the smallest ``2^e`` with ``amax / 2^e ≤ 448`` (DeepSeek's ``ue8m0`` rounding of
    ``amax / 448`` upwards), ``e`` clamped to [−127, 127]; an all-zero block takes ``e = −127``.
    """
    x = np.asarray(values, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % BLOCK:
        raise PolymemError(f"FP8 rows need values [R, D] with D a multiple of {BLOCK}; got {x.shape}")
    blocks = x.reshape(x.shape[0], -1, BLOCK)  # [R, D/32, 32]
    amax = np.abs(blocks).max(axis=2).astype(np.float64)  # [R, D/32]
    mant, exp = np.frexp(amax / E4M3_MAX)  # amax/448 = mant·2^exp, mant in [0.5, 1)
    e = np.where(mant == 0.5, exp - 1, exp)  # the smallest e with amax/448 ≤ 2^e
    e = np.clip(np.where(amax > 0, e, -127), -127, 127).astype(np.int32)
    scaled = np.ldexp(blocks.astype(np.float64), -e[:, :, None])  # exact: a power-of-two step in float64
    return encode_e4m3(scaled).reshape(x.shape), (e + 127).astype(np.uint8)


__all__ = ["BLOCK", "E4M3_MAX", "decode_e4m3", "decode_e8m0", "decode_rows", "encode_e4m3", "encode_rows"]
