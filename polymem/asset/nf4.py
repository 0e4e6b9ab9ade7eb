"""NF4 (4-bit NormalFloat, QLoRA) row quantisation for memory tables (the PageGram report: 34-byte rows).

A head row of r values (r even) becomes ``r/2 + 2`` bytes: r/2 code bytes, then one little-endian float16
scale (the row's absolute maximum). Value ``j`` decodes to ``NF4_LEVELS[code_j] * scale``; byte ``i`` holds
code ``2i`` in its low nibble and code ``2i+1`` in its high nibble. Worked example (r=4)::

    row    = [1.0, -0.5, 0.0, 0.25]         scale = 1.0 (absmax, as float16 0x3c00)
    codes  = [15, 2, 7, 10]                 nearest levels 1.0, -0.5251, 0.0, 0.2461
    bytes  = 2f a7 00 3c                    0x2f = 15 | 2<<4, 0xa7 = 7 | 10<<4, then 00 3c

The scale is a float16, so rows whose absolute maximum is below float16's smallest subnormal (~6e-8)
decode to zero, and rows above 65504 are refused. Decoding refuses a scale no encoder makes (NaN, ±inf,
negative: :class:`ScaleError`), so a corrupt scale never reaches a model as NaN. The asset packs these rows into pages and 4 KiB blocks (``docs/asset-format.md`` §5); this module only
encodes and decodes rows. Not here: files, zarr, torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

from polymem.errors import FormatError, PolymemError

#: QLoRA's 16 NormalFloat levels (quantiles of N(0,1) scaled to [-1, 1], exact zero at code 7).
NF4_LEVELS = np.array(
    [
        -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.2461123913526535, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
    ],
    dtype=np.float32,
)
_MIDPOINTS = ((NF4_LEVELS[1:] + NF4_LEVELS[:-1]) / 2).astype(np.float32)
_FP16_MAX = 65504.0


def row_bytes(head_dim: int) -> int:
    """Bytes of one NF4 row of width ``head_dim``: codes plus a float16 scale (64 -> 34)."""
    _check_dim(head_dim)
    return head_dim // 2 + 2


def _check_dim(head_dim: int) -> None:
    if head_dim < 2 or head_dim % 2:
        raise PolymemError(f"nf4 needs an even head_dim >= 2 (two codes per byte), got {head_dim}; use float16 instead")


def _prepare(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate rows; return (float32 rows, float16 scales)."""
    x = np.asarray(x, dtype=np.float32)
    _check_dim(x.shape[-1])
    if not np.isfinite(x).all():
        raise PolymemError("nf4 quantisation got NaN or inf values; clean the table first")
    absmax = np.abs(x).max(axis=-1) if x.size else np.zeros(x.shape[:-1], np.float32)
    if absmax.size and float(absmax.max()) > _FP16_MAX:
        raise PolymemError(
            f"a row's absolute maximum {float(absmax.max()):g} exceeds float16's range (65504); "
            "the nf4 scale is a float16 — rescale the table or keep it in float32"
        )
    return x, absmax.astype(np.float16)


def quantize_numpy(x: np.ndarray) -> np.ndarray:
    """Readable numpy version of :func:`quantize` (same bytes)."""
    x, scale16 = _prepare(x)
    r = x.shape[-1]
    scale = scale16.astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0)[..., None]
    normed = np.clip(x / safe, -1.0, 1.0)  # [..., r]
    codes = np.searchsorted(_MIDPOINTS, normed, side="left").astype(np.uint8)  # ties -> lower code
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)  # [..., r/2]
    out = np.empty(x.shape[:-1] + (r // 2 + 2,), dtype=np.uint8)
    out[..., : r // 2] = packed
    out[..., r // 2 :] = scale16.astype("<f2")[..., None].view(np.uint8).reshape(scale16.shape + (2,))
    return out


@numba.njit(cache=True, nogil=True)
def _quantize_rows(  # pragma: no cover - compiled (the annotations are for readers and mypy only)
    x: npt.NDArray[np.float32], scale: npt.NDArray[np.float32], mids: npt.NDArray[np.float32], out: npt.NDArray[np.uint8],
) -> None:
    n, r = x.shape
    for i in range(n):
        s = scale[i]
        if s <= 0:
            s = np.float32(1.0)
        for j in range(0, r, 2):
            c = 0
            for h in range(2):
                v = x[i, j + h] / s
                if v > 1.0:
                    v = np.float32(1.0)
                elif v < -1.0:
                    v = np.float32(-1.0)
                k = 0  # searchsorted(mids, v, side="left") = number of midpoints < v (branch-free)
                for m in range(15):
                    k += mids[m] < v
                c |= k << (4 * h)
            out[i, j // 2] = c


def quantize(x: np.ndarray) -> np.ndarray:
    """float [..., r] -> uint8 [..., r/2 + 2] (codes, then float16 scale). Rows must be finite, |x| <= 65504."""
    x, scale16 = _prepare(x)
    r = x.shape[-1]
    lead = x.shape[:-1]
    x2 = np.ascontiguousarray(x.reshape(-1, r))
    out = np.empty((x2.shape[0], r // 2 + 2), dtype=np.uint8)
    _quantize_rows(x2, scale16.reshape(-1).astype(np.float32), _MIDPOINTS, out)
    out[:, r // 2 :] = scale16.reshape(-1).astype("<f2").view(np.uint8).reshape(-1, 2)
    return out.reshape(lead + (r // 2 + 2,))


def dequantize(q: np.ndarray, head_dim: int) -> np.ndarray:
    """uint8 [..., r/2 + 2] -> float32 [..., r]."""
    q = np.asarray(q, dtype=np.uint8)
    nb = row_bytes(head_dim)
    if q.shape[-1] != nb:
        raise PolymemError(f"nf4 rows of head_dim {head_dim} are {nb} bytes, got rows of {q.shape[-1]} bytes")
    codes = np.empty(q.shape[:-1] + (head_dim,), dtype=np.uint8)
    codes[..., 0::2] = q[..., : head_dim // 2] & 0x0F
    codes[..., 1::2] = q[..., : head_dim // 2] >> 4
    bits = np.ascontiguousarray(q[..., head_dim // 2 :]).view("<u2")[..., 0]  # float16 scale bits [...]
    _check_scales(bits)
    return NF4_LEVELS[codes] * bits.view("<f2").astype(np.float32)[..., None]


def check_scales(q: np.ndarray, head_dim: int) -> None:
    """Raise :class:`ScaleError` unless every row of uint8 [..., r/2 + 2] has a finite scale >= 0."""
    _check_scales(np.ascontiguousarray(q[..., head_dim // 2 :]).view("<u2")[..., 0])


def _check_scales(bits: np.ndarray) -> None:
    """float16 bits: one max decides the common case (sign bit or an all-ones exponent set = negative, ±inf or
    NaN, or -0, which is allowed)."""
    if bits.size and bits.max() >= 0x7C00:
        bad = np.flatnonzero((bits >= 0x7C00) & (bits != 0x8000))
        if bad.size:
            i = int(bad[0])
            raise ScaleError(i, float(bits.reshape(-1)[i : i + 1].view("<f2")[0]))


class ScaleError(FormatError):
    """A stored row scale that no writer makes (NaN, ±inf or negative: a scale is a row's absolute maximum).

    ``row`` is the flat index of the row among those decoded; readers re-raise it naming the shard and page."""

    def __init__(self, row: int, value: float) -> None:
        super().__init__(f"nf4 row {row} has scale {value!r}; a scale is the row's absolute maximum, a finite "
                         "number >= 0, so the stored bytes are corrupt; restore the asset")
        self.row, self.value = row, value


@dataclass(frozen=True)
class QuantError:
    """Per-row reconstruction error of nf4: RMS of (x - x̂), and the same relative to the row's RMS."""

    rms_mean: float
    rms_max: float
    rel_mean: float
    rel_max: float
    rows: int


def reconstruction_error(x: np.ndarray, xhat: np.ndarray) -> QuantError:
    """Errors over rows [..., r] (all-zero rows count as relative error 0)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1, np.shape(x)[-1])
    d = np.asarray(xhat, dtype=np.float64).reshape(x.shape) - x
    rms = np.sqrt((d * d).mean(axis=1))
    norm = np.sqrt((x * x).mean(axis=1))
    rel = np.where(norm > 0, rms / np.where(norm > 0, norm, 1.0), 0.0)
    n = x.shape[0]
    return QuantError(
        rms_mean=float(rms.mean()) if n else 0.0, rms_max=float(rms.max()) if n else 0.0,
        rel_mean=float(rel.mean()) if n else 0.0, rel_max=float(rel.max()) if n else 0.0, rows=n,
    )
