"""numba kernels of the byte-fidelity check: does a tokenizer's token stream spell the document's UTF-8 bytes
(exactly, or after a dummy-prefix space)? By hash (:func:`stream_fidelity`, from the token hashes the counting
has just used) and, when that does not settle it, by the bytes (:func:`compare_token_words`,
:func:`compare_token_bytes`). Used by :mod:`polymem.analysis.coverage._job`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from polymem.hash._numba import _U0, _U1


@njit(cache=True, nogil=True)
def compare_token_bytes(ids, buf, offsets, text):  # pragma: no cover - compiled
    """Compare the concatenated token bytes of ``ids`` (token t = buf[offsets[t]:offsets[t+1]]) with ``text``.

    Returns (status, offset): status 0 exact, 1 equal to b" " + text (a dummy prefix), 2 mismatch at
    byte ``offset`` of the token stream (compared against the text, or against b" " + text when the stream
    is one byte longer than the text; the offset is the length of the shorter one when one is a prefix of the
    other).

    The lengths are summed first: when they agree (the usual case) every token's bytes lie inside the text, and
    each token is compared in one tight loop without bounds checks; otherwise :func:`_compare_unequal`."""
    L = text.shape[0]
    n = ids.shape[0]
    total = 0
    for k in range(n):
        t = ids[k]
        total += offsets[t + 1] - offsets[t]
    shift = 1 if total == L + 1 else 0
    if total != L + shift:
        return _compare_unequal(ids, buf, offsets, text)
    k = 0
    q = 0  # bytes of the text compared so far
    if shift:  # the stream's first byte must be the dummy prefix's space
        while k < n:
            t = ids[k]
            a, b = offsets[t], offsets[t + 1]
            k += 1
            if b > a:
                if buf[a] != 32:
                    return 2, 0
                for j in range(a + 1, b):
                    if buf[j] != text[q]:
                        return 2, q + 1
                    q += 1
                break
    for kk in range(k, n):
        t = ids[kk]
        a, b = offsets[t], offsets[t + 1]
        d = q - a
        for j in range(a, b):
            if buf[j] != text[j + d]:
                return 2, j + d + shift
        q += b - a
    return shift, 0


@njit(cache=True, nogil=True)
def _compare_unequal(ids, buf, offsets, text):  # pragma: no cover - compiled
    """:func:`compare_token_bytes` when the stream is neither as long as the text nor one byte longer: always a
    mismatch, at the first differing byte or at the end of the shorter one."""
    L = text.shape[0]
    pos = 0
    for t in ids:
        for j in range(offsets[t], offsets[t + 1]):
            if pos >= L or buf[j] != text[pos]:
                return 2, pos
            pos += 1
    return 2, pos


PAD = 8  # bytes of zeros after the text and after the token buffer for :func:`compare_token_words`


@intrinsic
def _load8(typingctx, arr, idx):  # pragma: no cover - compiled
    """The 8 bytes arr[idx:idx+8] of a uint8 array as one native-endian uint64 (an unaligned load; the caller
    guarantees idx + 8 <= len(arr))."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.uint8 and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(ary.data, [i]), ir.IntType(64).as_pointer())
        return builder.load(ptr, align=1)

    return types.uint64(arr, idx), codegen


@njit(cache=True, nogil=True)
def compare_token_words(ids, buf, offsets, text, L, shift):  # pragma: no cover - compiled
    """:func:`compare_token_bytes` of ``text[:L]`` (the same result), 8 bytes at a time. ``buf`` and ``text``
    each end with at least :data:`PAD` bytes beyond their data (any values), so a token's bytes and the text
    under them are compared as masked 8-byte words, one per token of up to 8 bytes, with no inner byte loop
    (whose exit, a different trip count per token, mispredicts about once a token). ``shift`` is a guess of the
    status (1 for a tokenizer with a dummy prefix, else 0): the stream is compared against the text shifted by
    it, and only a complete match, with the stream ending where the text does, is answered here (it proves
    the stream's length is L + shift, so the status is shift); anything else goes to
    :func:`compare_token_bytes`. Little-endian machines only (the mask keeps the low bytes); the caller checks."""
    n = ids.shape[0]
    ones = ~_U0
    q = -shift  # the text byte under the token's first byte
    for k in range(n):
        t = ids[k]
        a, b = offsets[t], offsets[t + 1]
        c = a
        if q < 0:  # the dummy prefix: the stream's first byte (q = -1) must be a space
            if b == a:
                continue
            if buf[a] != 32:
                return compare_token_bytes(ids, buf, offsets, text[:L])
            c = a + 1
        if q + (b - a) > L:
            return compare_token_bytes(ids, buf, offsets, text[:L])
        while c < b:
            # compiled code calls an intrinsic without its typing context, which numba's stub counts as an argument
            w: Any = _load8(buf, c) ^ _load8(text, q + (c - a))  # type: ignore[call-arg]
            m = b - c
            if m < 8:
                w &= ~(ones << np.uint64(8 * m))
            if w != _U0:
                return compare_token_bytes(ids, buf, offsets, text[:L])  # a mismatch: the byte loop finds where
            c += 8
        q += b - a
    if q != L:
        return compare_token_bytes(ids, buf, offsets, text[:L])
    return shift, 0


@njit(cache=True, inline="always")
def _stream_status(ids, C, P, h_text, h_space_text, p_len, p_len1):  # pragma: no cover - compiled
    """0 if the token stream's bytes hash and measure as the text, 1 as b" " + text, else -1 (see
    :func:`stream_fidelity`)."""
    h = _U0
    pp = _U1
    for k in range(ids.shape[0]):
        t = ids[k]
        h = h * P[t] + C[t]
        pp *= P[t]
    if pp == p_len and h == h_text:
        return 0
    if pp == p_len1 and h == h_space_text:
        return 1
    return -1


@njit(cache=True, nogil=True)
def stream_fidelity(ti, tC, tP, ri, rC, rP, text, table, base):  # pragma: no cover - compiled
    """Byte fidelity of both tokenizers' ids for one document, by hash: (status of ti, status of ri), each 0
    when the token stream is the text, 1 when it is b" " + text, -1 otherwise (then :func:`compare_token_bytes`
    says where they differ). A stream's hash and length come from the token hashes the counting has just used
    (Hash(A‖B) = Hash(A)·base^|B| + Hash(B): the fold h·P[t] + C[t], and the product of P[t] = base^len(t),
    equal to base^L iff the lengths are equal: base's multiplicative order is >= 2^56), the text's from its
    bytes with the spec's byte ``table`` (uint64 [256]); the hashes must be of a spec without a normalizer.
    Compared with the bytes themselves this reads no token bytes (a random read per token of a vocabulary-sized
    buffer the tokenizers have just evicted from the cache); a stream answered 0 or 1 differs from the text only
    if two different byte strings of the same length collide in 64 bits."""
    L = text.shape[0]
    h = _U0
    for i in range(L):
        h = (h + table[text[i]]) * base
    p_len = _U1  # base^L by squaring
    b = base
    e = L
    while e > 0:
        if e & 1:
            p_len *= b
        b *= b
        e >>= 1
    p_len1 = p_len * base
    h_space = (table[32] * base) * p_len + h  # Hash(b" " + text) = Hash(b" ")·base^L + Hash(text)
    return (_stream_status(ti, tC, tP, h, h_space, p_len, p_len1),
            _stream_status(ri, rC, rP, h, h_space, p_len, p_len1))
