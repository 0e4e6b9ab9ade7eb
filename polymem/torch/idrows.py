"""Token-id (Engram XOR) rows in torch, bit-identical to :meth:`polymem.hash.idhash.IdHashSpec.rows`.

:class:`TorchIdRows` stands in for :class:`polymem.torch.hash.TorchTokenHashes` inside an attached model when
the table is tokenizer-bound: ``ngram_rows(ids, layout, max_n)`` -> int64 rows ``[..., T, max_n, K]`` (-1 for
invalid n-grams and for orders the table does not have). uint64 products wrap identically in int64; the
modulus of a uint64 held in int64 bits is corrected with ``2^64 mod p``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from polymem.hash.idhash import IdHashSpec
from polymem.hash.layout import Layout
from polymem.torch.hash import _s64


@dataclass(frozen=True, eq=False)
class TorchIdRows:
    spec: IdHashSpec
    special: torch.Tensor  # bool [V]: ids that break n-grams (document separators)
    C: torch.Tensor  # a 1-element tensor on the device (attach checks C.device)

    @classmethod
    def build(cls, spec: IdHashSpec, special: np.ndarray | None = None, vocab: int | None = None) -> "TorchIdRows":
        V = max(int(vocab or 0), spec.vocab_size, 0 if special is None else len(special))
        sp = np.zeros(V, dtype=bool)
        if special is not None:
            sp[: len(special)] = special
        return cls(spec=spec, special=torch.from_numpy(sp), C=torch.zeros(1, dtype=torch.int64))

    def to(self, device) -> "TorchIdRows":
        return TorchIdRows(spec=self.spec, special=self.special.to(device), C=self.C.to(device))

    def ngram_rows(self, ids: torch.Tensor, layout: Layout, max_n: int) -> torch.Tensor:
        s = self.spec
        x = ids.long()
        T = x.shape[-1]
        bad = self.special[x.clamp(0, self.special.numel() - 1)] | (x >= self.special.numel())
        out = torch.full(tuple(x.shape) + (max_n, s.heads), -1, dtype=torch.int64, device=x.device)
        offsets = torch.from_numpy(s.offsets()).to(x.device)  # [O, K]
        mix = x * _s64(s.multipliers[0])
        any_bad = bad
        done = 1
        for oi, n in enumerate(s.orders):
            while done < n:
                if done < T:
                    sh = torch.nn.functional.pad(x[..., :-done], (done, 0), value=s.pad_id)
                    sb = torch.nn.functional.pad(bad[..., :-done], (done, 0), value=False)
                else:
                    sh = torch.full_like(x, s.pad_id)
                    sb = torch.zeros_like(bad)
                mix = mix ^ (sh * _s64(s.multipliers[done]))
                any_bad = any_bad | sb
                done += 1
            if n > max_n:
                break
            ps = s.primes[oi * s.heads : (oi + 1) * s.heads]
            p = torch.tensor(ps, dtype=torch.int64, device=x.device)  # [K]
            c = torch.tensor([(1 << 64) % q for q in ps], dtype=torch.int64, device=x.device)
            m = mix.unsqueeze(-1)  # [..., T, 1]
            r = torch.remainder(m, p)
            r = torch.where(m < 0, torch.remainder(r + c, p), r)  # uint64 value = int64 bits + 2^64
            valid = ~any_bad
            if n > 1:
                pos = torch.arange(T, device=x.device)
                valid = valid & (pos >= n - 1)
            rows = r + offsets[oi]
            out[..., n - 1, :] = torch.where(valid.unsqueeze(-1), rows, torch.full_like(rows, -1))
        return out


__all__ = ["TorchIdRows"]


def xor_spec_for(params: int, *, heads: int, head_dim: int, max_n: int, tokenizer: dict, vocab_size: int,
                 seed: int = 0) -> IdHashSpec:
    """The Engram-style XOR spec of ``polymem train --hash xor``: orders 1..max_n, ``heads`` per order, sub-tables
    of ≤ params / (head_dim·heads·max_n) rows (a distinct prime each), within a budget of ``params`` scalars."""
    from polymem.errors import PolymemError
    from polymem.hash.xor import XorHashSpec

    head_rows = params // (head_dim * heads * max_n)
    if head_rows < 64:
        raise PolymemError(
            f"--params {params} gives {head_rows} rows per (order, head) sub-table for --hash xor "
            f"({heads} heads × {max_n} orders × r={head_dim}); need ≥ 64: raise --params")
    xor = XorHashSpec(head_rows=head_rows, orders=tuple(range(1, max_n + 1)), heads=heads, seed=seed)
    return IdHashSpec.from_xor(xor, tokenizer=tokenizer, vocab_size=vocab_size)
