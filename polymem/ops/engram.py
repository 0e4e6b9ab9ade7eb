"""Tokenizer-bound tables as :func:`polymem.ops.convert` reads them: :class:`IdTable` (rows, their id-hash spec
and sub-table offsets), the Engram safetensors form (docs/asset-format.md §10: :func:`write_engram_table`,
:func:`read_engram_table`), and :func:`open_id_table`, which opens any such source (an Engram file, a polymem
``--hash xor`` asset or table file).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from polymem.asset.engine_table import EngineTableSpec
from polymem.errors import FormatError, PolymemError, SpecMismatchError
from polymem.hash.idhash import IdHashSpec
from polymem.ops._opbase import AssetLike

ENGRAM_FORMAT = "engram.hash-table"


@dataclass
class IdTable:
    """A tokenizer-bound table in memory: rows [R, r], its spec, and where each (order, head) sub-table starts."""

    spec: IdHashSpec
    table: np.ndarray  # float32 [R, r]
    offsets: np.ndarray  # int64 [len(orders), K]: first row of each sub-table in ``table``
    id_map: np.ndarray | None = None  # int64 [V_tokenizer]: tokenizer id -> hashed id (Engram's compression)
    counts: np.ndarray | None = None
    source: dict[str, Any] = field(default_factory=dict)

    def rows(self, ids: np.ndarray, special: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Tokenizer ids [T] -> (rows int64 [T, len(orders), K] into ``table`` (-1 invalid), valid [T, len(orders)])."""
        ids = np.asarray(ids, dtype=np.int64)
        hid = ids
        if self.id_map is not None:
            if ids.size and int(ids.max()) >= self.id_map.shape[0]:
                raise PolymemError(f"token id {int(ids.max())} is beyond the Engram lookup_table ({self.id_map.shape[0]} ids)")
            hid = self.id_map[ids]
        u, valid = self.spec.residues(hid, None)
        if special is not None:  # a special id (separator) breaks n-grams
            bad = np.asarray(special, dtype=bool)[ids]
            for oi, n in enumerate(self.spec.orders):
                win = bad.copy()
                for s in range(1, n):
                    win[s:] |= bad[:-s]
                valid[:, oi] &= ~win
        rows = u + self.offsets
        rows[~valid] = -1
        return rows, valid


def write_engram_table(
    path: str | os.PathLike[str], table: np.ndarray, *, layer_id: int, seed: int, vocab_size: int, max_n: int,
    heads: int, order_vocab_sizes: Sequence[int], primes: Sequence[int] | None = None, pad_id: int = 0,
    layer_ids: Sequence[int] | None = None, tokenizer: str = "", tokenizer_fingerprint: str = "",
    lookup_table: np.ndarray | None = None,
) -> Path:
    """Write one layer's Engram ``MultiHeadEmbedding`` table and its hash parameters (docs/asset-format.md §10)."""
    from safetensors.numpy import save_file

    spec = IdHashSpec.engram(layer_id=layer_id, seed=seed, vocab_size=vocab_size, max_n=max_n, heads=heads,
                             order_vocab_sizes=order_vocab_sizes, tokenizer={"name": tokenizer, "fingerprint": tokenizer_fingerprint},
                             pad_id=pad_id, layer_ids=layer_ids, primes=primes)
    t = np.ascontiguousarray(table, dtype=np.float32)
    if t.ndim != 2 or t.shape[0] != sum(spec.primes):
        raise PolymemError(f"Engram table has shape {t.shape}; its primes need [{sum(spec.primes)}, D/heads]")
    meta = {
        "format": ENGRAM_FORMAT, "version": "1", "layer_id": str(layer_id), "seed": str(seed),
        "vocab_size": str(vocab_size), "max_ngram_size": str(max_n), "n_head_per_ngram": str(heads),
        "engram_vocab_size": json.dumps([int(v) for v in order_vocab_sizes]),
        "primes": json.dumps([list(spec.primes[i * heads : (i + 1) * heads]) for i in range(max_n - 1)]),
        "multipliers": json.dumps([str(m) for m in spec.multipliers]), "pad_id": str(pad_id),
        "layer_ids": json.dumps([int(x) for x in (layer_ids or [layer_id])]),
        "tokenizer": tokenizer, "tokenizer_fingerprint": tokenizer_fingerprint,
    }
    tensors = {"multi_head_embedding.embedding.weight": t}
    if lookup_table is not None:
        tensors["lookup_table"] = np.ascontiguousarray(lookup_table, dtype=np.int64)
    return _atomic_file(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def read_engram_table(path: str | os.PathLike[str]) -> IdTable:
    """Read the Engram safetensors form; recompute multipliers (and check the primes) from the parameters."""
    from safetensors import safe_open

    p = Path(path)
    with safe_open(str(p), framework="numpy") as f:
        meta = f.metadata() or {}
        if meta.get("format") != ENGRAM_FORMAT:
            raise FormatError(f"{str(p)!r}: safetensors metadata format is {meta.get('format')!r}, expected {ENGRAM_FORMAT!r} (docs/asset-format.md §10)")
        if meta.get("version") != "1":
            raise FormatError(f"{str(p)!r}: Engram table version {meta.get('version')!r}; this polymem reads '1'")
        keys = set(f.keys())
        wkey = next((k for k in ("multi_head_embedding.embedding.weight", "embedding.weight") if k in keys), None)
        if wkey is None:
            raise FormatError(f"{str(p)!r} has no tensor 'multi_head_embedding.embedding.weight'; tensors: {sorted(keys)}")
        table = np.asarray(f.get_tensor(wkey), dtype=np.float32)
        lut = np.asarray(f.get_tensor("lookup_table"), dtype=np.int64) if "lookup_table" in keys else None
    try:
        max_n, heads = int(meta["max_ngram_size"]), int(meta["n_head_per_ngram"])
        primes = [int(x) for row in json.loads(meta["primes"]) for x in row]
        spec = IdHashSpec.engram(
            layer_id=int(meta["layer_id"]), seed=int(meta["seed"]), vocab_size=int(meta["vocab_size"]), max_n=max_n,
            heads=heads, order_vocab_sizes=json.loads(meta["engram_vocab_size"]), pad_id=int(meta.get("pad_id", 0)),
            tokenizer={"name": meta.get("tokenizer", ""), "fingerprint": meta.get("tokenizer_fingerprint", "")},
            primes=primes)
    except KeyError as e:
        raise FormatError(f"{str(p)!r}: Engram metadata lacks {e.args[0]!r} (docs/asset-format.md §10)") from None
    except (ValueError, TypeError, PolymemError) as e:
        raise FormatError(f"{str(p)!r}: Engram metadata is malformed: {e}") from None
    from polymem.hash.xor import _is_prime

    if len(set(primes)) != len(primes) or not all(_is_prime(q) for q in primes):
        raise FormatError(f"{str(p)!r}: Engram primes {primes} must be distinct primes")
    if "multipliers" in meta and [int(m) for m in json.loads(meta["multipliers"])] != list(spec.multipliers):
        raise FormatError(f"{str(p)!r}: stored multipliers differ from those recomputed from seed/layer_id/vocab_size "
                          "(numpy default_rng); the parameters were edited")
    if table.ndim != 2 or table.shape[0] != sum(primes):
        raise FormatError(f"{str(p)!r}: table has shape {table.shape}, the primes need {sum(primes)} rows")
    offs = np.concatenate([[0], np.cumsum(primes)[:-1]]).astype(np.int64).reshape(max_n - 1, heads)
    return IdTable(spec=spec, table=table, offsets=offs, id_map=lut,
                   source={"kind": "engram-safetensors", "path": str(p), "layer_id": int(meta["layer_id"])})


def open_id_table(src: IdTable | AssetLike) -> IdTable:
    """A tokenizer-bound source: an Engram safetensors file, or a polymem asset / table file with an id-hash spec."""
    if isinstance(src, IdTable):
        return src
    from polymem.asset.core import MemoryAsset

    p = Path(os.fspath(src)) if isinstance(src, (str, os.PathLike)) else Path("")
    if p.suffix == ".safetensors":
        if not p.is_file():
            raise PolymemError(f"source {str(p)!r} does not exist")
        from safetensors import safe_open

        with safe_open(str(p), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("format") == ENGRAM_FORMAT:
                pass
            elif "polymem" in meta:  # a polymem table file (polymem.torch.tablefile), read without torch
                head = json.loads(meta["polymem"])
                spec_d = head.get("hash_spec", {})
                if not isinstance(spec_d, dict) or spec_d.get("format") != "polymem.id-hash":
                    raise SpecMismatchError(f"{str(p)!r}: convert re-addresses tokenizer-bound tables; this table file is byte-addressed already")
                spec = IdHashSpec.from_dict(spec_d)
                cnt = np.asarray(f.get_tensor("counts")) if "counts" in f.keys() else None
                return IdTable(spec=spec, table=np.asarray(f.get_tensor("table"), dtype=np.float32), offsets=spec.offsets(),
                               counts=cnt, source={"kind": "polymem-table-file", "path": str(p), "provenance": head.get("provenance", {})})
            else:
                raise FormatError(f"{str(p)!r}: safetensors file is neither an Engram table (metadata format {ENGRAM_FORMAT!r}) "
                                  "nor a polymem table file; see docs/asset-format.md §10")
        return read_engram_table(p)
    a = src if isinstance(src, MemoryAsset) else MemoryAsset.open(src)
    spec = a.spec
    if isinstance(spec, EngineTableSpec):
        raise SpecMismatchError(
            f"{a.path} is an engine table (written by `polymem import`): re-address it with "
            "polymem.engines.convert.convert_engine (the CLI's `polymem convert` takes both kinds)")
    if not isinstance(spec, IdHashSpec):
        raise SpecMismatchError(
            f"{a.path}: convert re-addresses tokenizer-bound tables, but this asset is already byte-addressed "
            f"(hash spec {spec.spec_id}); use it as is, or `polymem subset`/`merge` it")
    counts = a.row_counts() if hasattr(a, "row_counts") else None
    return IdTable(spec=spec, table=np.asarray(a.to_numpy(), dtype=np.float32), offsets=spec.offsets(), counts=counts,
                   source={"kind": "polymem", "path": str(a.path), "provenance": dict(a.provenance)})


def convert_source(src: IdTable | AssetLike) -> tuple[IdTable, int, int]:
    """(the opened tokenizer-bound source, its heads per order, its row width): what a target layout must match."""
    idt = open_id_table(src)
    return idt, idt.spec.heads, idt.table.shape[1]


def _atomic_file(dest: Path, write: Callable[[Path], Any], overwrite: bool = True) -> Path:
    if dest.exists() and not overwrite:
        raise PolymemError(f"{str(dest)!r} already exists; pass overwrite=True (CLI: --overwrite) or pick another path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


__all__ = ["ENGRAM_FORMAT", "IdTable", "convert_source", "open_id_table", "read_engram_table", "write_engram_table"]
