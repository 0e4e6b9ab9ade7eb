"""TokenHashes: per-token hash C(t), byte length L(t) and power P(t) = base^L(t) for one (tokenizer, HashSpec).

Built once per tokenizer in well under a second, saved as an ``.npz`` (no pickle) with a JSON header that
records the format, the hash spec and the tokenizer's fingerprint; loading refuses a cache made for another
tokenizer or spec and names both. With a cache, hashing every n-gram of a token stream is two multiplies per
order per position (:meth:`TokenHashes.ngram_hashes`).

Not here: tokenisation (:mod:`polymem.tokenizers`), row layouts (:mod:`polymem.hash.layout`), torch.
"""

from __future__ import annotations

import json
import os
import time
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polymem import _npy
from polymem._paths import cache_root
from polymem.hash import _numba as _kernels
from polymem.errors import FormatError, PolymemError, SpecMismatchError
from polymem.hash.spec import HashSpec, check_max_n
from polymem.hash.layout import Layout
from polymem.hash.ngram import ngram_hashes_numpy
from polymem.tokenizers.base import MAX_VOCAB_SIZE, pack_token_bytes

CACHE_FORMAT = "polymem.token-cache"
SUPPORTED_CACHE_VERSIONS = (1,)
_ARRAYS = ("header", "C", "L", "P", "special", "powers")


@dataclass(frozen=True, eq=False)
class TokenHashes:
    spec: HashSpec
    tokenizer_name: str
    fingerprint: str
    C: np.ndarray  # uint64 [V]  Hash(bytes(t)); 0 for special tokens
    L: np.ndarray  # int32  [V]  byte length; 0 for special tokens
    P: np.ndarray  # uint64 [V]  base^L(t)
    special: np.ndarray  # bool [V]  token has no bytes (special/control/unused id)
    powers: np.ndarray  # uint64 [max L + 1]  B(p) = base^p
    lossy: bool = False
    dummy_prefix: bool = False
    build_seconds: float = field(default=0.0, compare=False)

    @property
    def vocab_size(self) -> int:
        return int(self.C.shape[0])

    @property
    def num_special(self) -> int:
        return int(self.special.sum())

    # ------------------------------------------------------------------------------------------ build
    @classmethod
    def build(cls, tokenizer: Any, spec: HashSpec | None = None) -> "TokenHashes":
        """Hash every token of ``tokenizer`` (a :class:`polymem.tokenizers.Tokenizer` or anything
        :func:`polymem.load_tokenizer` accepts) under ``spec`` (default: ``HashSpec()``)."""
        from polymem.tokenizers import load_tokenizer

        if getattr(spec, "tokenizer_bound", False):
            from polymem.errors import TokenizerBoundError

            raise TokenizerBoundError(
                f"hash spec {type(spec).__name__} is a tokenizer-bound token-id hash (of "
                f"{dict(getattr(spec, 'tokenizer', {}) or {}).get('name', 'one tokenizer')!r}); "
                "byte-level token hashes cannot be built for it. Re-address the table by bytes with `polymem convert`"
            )
        tok = load_tokenizer(tokenizer)
        t0 = time.perf_counter()
        tb = tok.all_token_bytes()
        if tok.lossy:
            warnings.warn(
                f"tokenizer {tok.name!r} is not byte-faithful (its token bytes do not concatenate back to the "
                "text, e.g. WordPiece): its n-gram hashes will not match other tokenizers' byte-equivalent n-grams",
                stacklevel=2,
            )
        cache = cls.from_token_bytes(
            tb, spec, name=tok.name, fingerprint=tok.fingerprint, lossy=bool(tok.lossy),
            dummy_prefix=bool(tok.dummy_prefix),
        )
        object.__setattr__(cache, "build_seconds", time.perf_counter() - t0)
        return cache

    @classmethod
    def from_token_bytes(
        cls, token_bytes: "list[bytes | None]", spec: HashSpec | None = None, *, name: str, fingerprint: str,
        lossy: bool = False, dummy_prefix: bool = False,
    ) -> "TokenHashes":
        """Build from the ordered token byte strings (None = special/control/unused id)."""
        spec = spec or HashSpec()
        tb = token_bytes
        special = np.fromiter((b is None for b in tb), dtype=bool, count=len(tb))
        buf, offsets = pack_token_bytes(tb)
        lengths = np.diff(offsets)
        table = np.array(spec.effective_byte_table, dtype=np.uint64)
        C = _kernels.token_hashes(buf, offsets, table, np.uint64(spec.base))
        max_len = int(lengths.max()) if len(tb) else 0
        powers = _powers(spec.base, max_len)
        P = powers[lengths]
        C[special] = 0
        return cls(
            spec=spec, tokenizer_name=name, fingerprint=fingerprint, C=C, L=lengths.astype(np.int32),
            P=P, special=special, powers=powers, lossy=lossy, dummy_prefix=dummy_prefix,
        )

    # ------------------------------------------------------------------------------------------ hashing
    def check_ids(self, ids: Any) -> np.ndarray:
        """Validate token ids: integers in [0, vocab_size). Returns them as int64."""
        arr = as_id_array(ids)
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise PolymemError(f"token ids must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64, copy=False)
        if arr.size:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= self.vocab_size:
                bad = lo if lo < 0 else hi
                raise PolymemError(
                    f"token id {bad} is out of range for tokenizer {self.tokenizer_name!r} "
                    f"(vocab size {self.vocab_size}, ids 0..{self.vocab_size - 1}); were these ids made by "
                    "another tokenizer?"
                )
        return arr

    def ngram_hashes(self, ids: Any, max_n: int = 3, *, backend: str = "numba") -> tuple[np.ndarray, np.ndarray]:
        """Hashes of every suffix n-gram, n = 1..max_n, in one joint space.

        ids int [T] or [B, T] -> (hashes uint64 [..., T, max_n], valid bool [..., T, max_n]); column n-1 is
        order n; invalid n-grams (reaching before the start, or containing a special token) hash to 0.
        """
        arr = self.check_ids(ids)
        max_n = check_max_n(max_n)
        if backend == "numpy":
            return ngram_hashes_numpy(self.C, self.P, self.special, arr, max_n)
        if backend != "numba":
            raise PolymemError(f"backend {backend!r} is unknown; accepted: 'numba', 'numpy'")
        ids2 = _as_2d(arr)
        h, v = _kernels.ngram_hashes(ids2, self.C, self.P, self.special, max_n)
        shape = arr.shape + (max_n,)
        return h.reshape(shape), v.reshape(shape)

    def ngram_rows(self, ids: Any, layout: Layout, max_n: int = 3) -> np.ndarray:
        """Fused hashing + layout: ids [..., T] -> rows int64 [..., T, max_n, K]; -1 for invalid n-grams."""
        arr = self.check_ids(ids)
        max_n = check_max_n(max_n)
        ids2 = _as_2d(arr)
        rows = _kernels.ngram_rows(
            ids2, self.C, self.P, self.special, max_n,
            layout.kind_code, layout.heads, layout.slots, layout.pages,
        )
        return rows.reshape(arr.shape + (max_n, layout.heads))

    # ------------------------------------------------------------------------------------------ storage
    def header(self) -> dict[str, Any]:
        """The cache file's JSON header: format, tokenizer name and fingerprint, hash spec and sizes."""
        return {
            "format": CACHE_FORMAT,
            "version": 1,
            "spec": self.spec.to_dict(),
            "tokenizer": {"name": self.tokenizer_name, "fingerprint": self.fingerprint},
            "vocab_size": self.vocab_size,
            "lossy": self.lossy,
            "dummy_prefix": self.dummy_prefix,
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically (temp file in the same folder, then rename). Returns the final path."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(path.suffix + ".npz") if path.suffix else path.with_suffix(".npz")
        from polymem._io import atomic_path

        header = np.frombuffer(json.dumps(self.header(), sort_keys=True).encode(), dtype=np.uint8)
        with atomic_path(path, fsync=True) as tmp:
            with open(tmp, "wb") as f:
                np.savez(
                    f, allow_pickle=False, header=header, C=self.C, L=self.L, P=self.P, special=self.special,
                    powers=self.powers,
                )
        return path

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, tokenizer: Any = None, spec: HashSpec | None = None
    ) -> "TokenHashes":
        """Load a saved cache; refuse it (naming both sides) if ``tokenizer``'s fingerprint or ``spec`` differ.

        Nothing is sized by the file before it is checked: each array's dtype and shape are read from its .npy
        header inside the zip (at most MAX_VOCAB_SIZE entries) before any data is decompressed, and the spec and
        tokenizer are compared before the arrays are read. Then the values that follow from others are checked
        (P = base^L, zero hashes and lengths for special ids); with ``tokenizer``, every hash is recomputed from
        its token bytes and compared (~20 ms for a 100k vocabulary), so an altered cache is refused.
        """
        path = Path(path)
        if not path.is_file():
            raise PolymemError(f"token cache {str(path)!r} does not exist; build it with `polymem build-cache`")
        where = f"token cache {str(path)!r}"
        tok = None
        try:
            with zipfile.ZipFile(path) as zf:
                sizes = {k: _member_size(zf, k, where) for k in _ARRAYS}
                header = _parse_header(_read_member(zf, "header"), where)
                stored_spec = _check_header(header, sizes, where)
                if spec is not None and spec != stored_spec:
                    raise SpecMismatchError(
                        f"{where} was built with hash spec {stored_spec.spec_id} ({stored_spec!r}) but "
                        f"spec {spec.spec_id} ({spec!r}) was requested; rebuild the cache with that spec"
                    )
                if tokenizer is not None:
                    tok = _same_tokenizer(tokenizer, header["tokenizer"], where)
                arrays = {k: _read_member(zf, k) for k in _ARRAYS[1:]}
        except PolymemError:
            raise
        # numpy raises ValueError for a bad .npy; zipfile NotImplementedError for an unknown compression method,
        # RuntimeError for an encrypted member, zlib.error for damaged deflate data
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError, zlib.error) as e:
            raise FormatError(f"{where} is not a readable .npz ({type(e).__name__}: {e}); rebuild it") from None
        cache = cls(
            spec=stored_spec, tokenizer_name=str(header["tokenizer"]["name"]),
            fingerprint=str(header["tokenizer"]["fingerprint"]), C=arrays["C"].astype(np.uint64, copy=False),
            L=arrays["L"].astype(np.int32, copy=False), P=arrays["P"].astype(np.uint64, copy=False),
            special=arrays["special"].astype(bool, copy=False), powers=arrays["powers"].astype(np.uint64, copy=False),
            lossy=bool(header.get("lossy", False)), dummy_prefix=bool(header.get("dummy_prefix", False)),
        )
        _check_derived(cache, where)
        if tok is not None:
            _check_against(cache, tok, where)
        return cache


# dtype of every array of a cache file; shapes: [V] for C, L, P, special; [max L + 1] for powers
_DTYPES = {"header": np.uint8, "C": np.uint64, "L": np.int32, "P": np.uint64, "special": np.bool_,
           "powers": np.uint64}
_MAX_HEADER_BYTES = 1 << 16  # the JSON header is ~400 bytes


def _member_size(zf: zipfile.ZipFile, key: str, where: str) -> int:
    """The length of 1-D array ``key``, from the .npy header of its zip member (no data decompressed);
    FormatError for a missing member, another dtype or shape, or a length over the bound."""
    try:
        info = zf.getinfo(f"{key}.npy")
    except KeyError:
        raise FormatError(f"{where} lacks array {key!r}; rebuild it") from None
    with zf.open(info) as f:
        try:
            shape, _, dtype = _npy.read_header(f)
        except ValueError as e:
            raise FormatError(f"{where}: array {key!r}: {e}. Rebuild it") from None
    want = np.dtype(_DTYPES[key])
    bound = _MAX_HEADER_BYTES if key == "header" else MAX_VOCAB_SIZE
    if (dtype.kind, dtype.itemsize) != (want.kind, want.itemsize) or len(shape) != 1 or shape[0] > bound:
        raise FormatError(
            f"{where}: array {key!r} is {dtype} of shape {shape}; expected a 1-D {want} array of at most "
            f"{bound:,} entries. The file is damaged or was not written by polymem; rebuild it")
    return int(shape[0])


def _read_member(zf: zipfile.ZipFile, key: str) -> np.ndarray:
    with zf.open(f"{key}.npy") as f:
        return _npy.read_array(f)


def _parse_header(raw: np.ndarray, where: str) -> dict[str, Any]:
    try:
        header = json.loads(raw.tobytes().decode())
    except RecursionError:
        raise FormatError(f"{where} has a corrupt header (JSON nested deeper than Python's limit); rebuild it") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
        raise FormatError(f"{where} has a corrupt header ({e}); rebuild it") from None
    if not isinstance(header, dict):
        raise FormatError(f"{where} has a header that is not a JSON object; rebuild it")
    if header.get("format") != CACHE_FORMAT or header.get("version") not in SUPPORTED_CACHE_VERSIONS:
        raise FormatError(
            f"{where} is format {header.get('format')!r} version {header.get('version')!r}; "
            f"this polymem reads {CACHE_FORMAT!r} versions {list(SUPPORTED_CACHE_VERSIONS)}"
        )
    return header


def _check_header(header: dict[str, Any], sizes: dict[str, int], where: str) -> HashSpec:
    """The stored spec; the header's other fields checked, vocab_size against the arrays' lengths."""
    tok = header.get("tokenizer")
    if not isinstance(tok, dict) or not all(isinstance(tok.get(k), str) for k in ("name", "fingerprint")):
        raise FormatError(f"{where} has a header without the tokenizer's name and fingerprint; rebuild it")
    try:
        spec = HashSpec.from_dict(header["spec"])
    except FormatError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(f"{where} has a header without a valid {e} field; rebuild it") from None
    V = header.get("vocab_size")
    if type(V) is not int or V < 0:
        raise FormatError(f"{where} has a header without a valid 'vocab_size' field (it is {str(V)[:40]!r}; expected "
                          "an integer >= 0, the length of its arrays). The file is damaged or was not written by "
                          "polymem; rebuild it")
    for k in ("C", "L", "P", "special"):
        if sizes[k] != V:
            raise FormatError(f"{where}: array {k} has shape ({sizes[k]},), expected ({V},)")
    return spec


def _same_tokenizer(tokenizer: Any, stored: dict[str, Any], where: str) -> Any:
    from polymem.tokenizers import load_tokenizer

    tok = load_tokenizer(tokenizer)
    if tok.fingerprint != stored["fingerprint"]:
        raise SpecMismatchError(
            f"{where} was built for tokenizer {stored['name']!r} (fingerprint {stored['fingerprint'][:16]}…) but "
            f"tokenizer {tok.name!r} has fingerprint {tok.fingerprint[:16]}…; rebuild the cache for this tokenizer"
        )
    return tok


def _check_derived(cache: TokenHashes, where: str) -> None:
    """The values that follow from others: powers = base^0..base^max L, P = powers[L], special ids all zero."""
    L, powers = cache.L, cache.powers
    max_len = int(L.max()) if L.size else 0
    base = np.uint64(cache.spec.base)
    if L.size and int(L.min()) < 0:
        bad = "L holds a negative length"
    elif powers.shape != (max_len + 1,) or powers[0] != 1 or not np.array_equal(powers[1:], powers[:-1] * base):
        bad = f"powers is not base^0..base^{max_len} (the longest token)"
    elif not np.array_equal(cache.P, powers[L]):
        bad = "P is not base^L"
    elif cache.C[cache.special].any() or L[cache.special].any():
        bad = "special ids have a non-zero hash or length"
    else:
        return
    raise FormatError(f"{where}: {bad}; its values were changed after it was built. Rebuild it")


def _check_against(cache: TokenHashes, tok: Any, where: str) -> None:
    """Every hash, length and special flag as ``tok``'s token bytes give them under the cache's spec."""
    fresh = TokenHashes.from_token_bytes(tok.all_token_bytes(), cache.spec, name=tok.name, fingerprint="")
    for k in ("special", "L", "C"):
        diff = np.flatnonzero(getattr(fresh, k) != getattr(cache, k))
        if diff.size:
            raise FormatError(
                f"{where}: {diff.size:,} of its {cache.vocab_size:,} values of {k} differ from those of tokenizer "
                f"{tok.name!r} under the cache's spec (first at id {int(diff[0])}); the file was changed after it "
                "was built. Rebuild it (polymem build-cache)")


def default_cache_path(tokenizer_name: str, fingerprint: str, spec: HashSpec) -> Path:
    """``<user cache dir>/polymem/token-caches/<name>-<fingerprint[:12]>-<spec_id>.npz``."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in tokenizer_name)[:64]
    return cache_root() / "token-caches" / f"{safe}-{fingerprint[:12]}-{spec.spec_id}.npz"


def _powers(base: int, max_len: int) -> np.ndarray:
    out = np.empty(max_len + 1, dtype=np.uint64)
    acc = 1
    for p in range(max_len + 1):
        out[p] = acc
        acc = (acc * base) & ((1 << 64) - 1)
    return out


def _as_2d(arr: np.ndarray) -> np.ndarray:
    if arr.ndim == 0:
        raise PolymemError("token ids must be a sequence [T] or a batch [B, T], got a scalar; wrap it in a list")
    return np.ascontiguousarray(arr.reshape(int(np.prod(arr.shape[:-1])), arr.shape[-1]))



def as_id_array(ids: Any) -> np.ndarray:
    """``np.asarray(ids)``, with a ragged list of rows (which numpy refuses with a long ValueError) reported as
    one line that says what to pass instead."""
    try:
        return np.asarray(ids)
    except ValueError:
        lengths = [len(r) for r in ids] if isinstance(ids, (list, tuple)) and all(
            hasattr(r, "__len__") for r in ids) else None
        shown = ", ".join(map(str, lengths[:8])) + (", ..." if lengths and len(lengths) > 8 else "") if lengths else "?"
        raise PolymemError(
            f"token ids are a ragged list (row lengths {shown}); pass one sequence [T] or equal-length rows [B, T] "
            "(pad the rows, or call once per sequence)"
        ) from None
