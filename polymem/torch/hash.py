"""The byte-level polynomial hash and layouts in torch, bit-identical to the numpy/numba/plain-Python paths.

torch has no general uint64 arithmetic, so every uint64 value is carried in an int64 tensor with the same
bits: + and × wrap identically in two's complement; right shifts are made logical with a mask; the multiply-high of :func:`fastrange` is assembled
from 32-bit halves. Works on any device (CPU here, CUDA where
present); the tests compare it with the plain-Python reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from polymem.errors import PolymemError

from polymem.hash.spec import FMIX_M1, FMIX_M2, GOLDEN, MASK64
from polymem.hash.layout import Layout


def _s64(v: int) -> int:
    """The int64 with the same bits as the uint64 ``v``."""
    v &= MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


_F1 = _s64(FMIX_M1)
_F2 = _s64(FMIX_M2)


def _lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def fmix64(k: torch.Tensor) -> torch.Tensor:
    k = k ^ _lsr(k, 33)
    k = k * _F1
    k = k ^ _lsr(k, 33)
    k = k * _F2
    return k ^ _lsr(k, 33)


def finalize(h: torch.Tensor, stream: int) -> torch.Tensor:
    return fmix64(h + _s64((stream + 1) * GOLDEN))


def fastrange(z: torch.Tensor, m: int) -> torch.Tensor:
    """⌊z·m / 2^64⌋ for z as uint64 and 0 < m < 2^32, from 32-bit halves (products wrap bit-exactly)."""
    c = _lsr((z & 0xFFFFFFFF) * m, 32)
    return _lsr(_lsr(z, 32) * m + c, 32)


def ngram_hashes_torch(
    C: torch.Tensor, P: torch.Tensor, special: torch.Tensor, ids: torch.Tensor, max_n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """ids long [..., T] -> (hashes int64 [..., T, max_n] (uint64 bits), valid bool [..., T, max_n]).

    C, P: int64 [V] (uint64 bits of C(t) and base^L(t)); special: bool [V].
    """
    c = C[ids]  # [..., T]
    p = P[ids]
    ok = ~special[ids]
    T = ids.shape[-1]
    hs = [torch.where(ok, c, torch.zeros_like(c))]
    vs = [ok]
    h, m, v = c, p, ok
    for n in range(2, max_n + 1):
        s = n - 1  # the new leftmost token sits s positions back
        if s >= T:
            hs.append(torch.zeros_like(c))
            vs.append(torch.zeros_like(ok))
            continue
        c_s = torch.nn.functional.pad(c[..., :-s], (s, 0))
        p_s = torch.nn.functional.pad(p[..., :-s], (s, 0))
        ok_s = torch.nn.functional.pad(ok[..., :-s], (s, 0), value=False)
        h = c_s * m + h
        m = p_s * m
        v = v & ok_s
        hs.append(torch.where(v, h, torch.zeros_like(h)))
        vs.append(v)
    return torch.stack(hs, dim=-1), torch.stack(vs, dim=-1)


def rows_torch(layout: Layout, h: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """int64 hashes [...] -> int64 rows [..., K] (-1 where ``valid`` is False). Matches :meth:`Layout.rows`."""
    K, S, P = layout.heads, layout.slots, layout.pages
    k = torch.arange(K, device=h.device, dtype=torch.int64)
    if layout.kind == "page-local":
        page = fastrange(finalize(h, 0), P)  # [...]
        ws = torch.stack([finalize(h, 1 + g) for g in range((K + 3) // 4)], dim=-1)  # [..., G]
        w = ws[..., k // 4]  # [..., K]
        field = (w >> (16 * (k % 4))) & 0xFFFF
        slot = (field * S) >> 16
        rows = (page.unsqueeze(-1) * K + k) * S + slot
    elif layout.kind == "flat":
        e = fastrange(finalize(h, 0), P * S)
        rows = e.unsqueeze(-1) * K + k
    else:
        q = P * S
        rows = k * q + torch.stack([fastrange(finalize(h, 1 + j), q) for j in range(K)], dim=-1)
    if valid is not None:
        if valid.dtype != torch.bool:
            raise PolymemError(f"valid must be a boolean mask, got dtype {valid.dtype}; pass valid > 0.5 or "
                               "valid.bool() if that is what you mean")
        rows = torch.where(valid.unsqueeze(-1), rows, torch.full_like(rows, -1))
    return rows


@dataclass(frozen=True, eq=False)
class TorchTokenHashes:
    """A :class:`polymem.TokenHashes` as device tensors, for hashing inside a model's forward."""

    C: torch.Tensor  # int64 [V]
    P: torch.Tensor  # int64 [V]
    special: torch.Tensor  # bool [V]

    @classmethod
    def from_cache(cls, cache, device: torch.device | str | None = None) -> "TorchTokenHashes":
        """The per-token C, P and special flags of a :class:`polymem.TokenHashes` as tensors on ``device``."""
        return cls(
            C=torch.from_numpy(cache.C.view(np.int64).copy()).to(device),
            P=torch.from_numpy(cache.P.view(np.int64).copy()).to(device),
            special=torch.from_numpy(cache.special.copy()).to(device),
        )

    def to(self, device: torch.device | str) -> "TorchTokenHashes":
        """The same tables on ``device``."""
        return TorchTokenHashes(C=self.C.to(device), P=self.P.to(device), special=self.special.to(device))

    def ngram_hashes(self, ids: torch.Tensor, max_n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (int64 [..., T]) -> (hashes int64 [..., T, max_n], valid bool [..., T, max_n]), bit-identical to the numpy path."""
        return ngram_hashes_torch(self.C, self.P, self.special, ids, max_n)

    def ngram_rows(self, ids: torch.Tensor, layout: Layout, max_n: int) -> torch.Tensor:
        """ids -> the table rows of every n-gram ending at each position (int64 [..., T, max_n, K], -1 invalid)."""
        h, v = self.ngram_hashes(ids, max_n)
        return rows_torch(layout, h, v)
