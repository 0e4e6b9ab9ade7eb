"""Serving tables bigger than memory: attach(..., in_memory=False) reads pages through the page service.

Outputs are bit-identical to the in-memory table built from the same asset (float16, bfloat16, NF4; plain
forwards, generate() with a KV cache, a training step of a recipient); the cache stays within its size; a
page is read once per batch; read errors surface in the forward that needed them; reader threads stop on
detach and on garbage collection; remote (fsspec) assets are served the same way.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import polymem
from polymem import FormatError, HashSpec, Layout, MemoryAsset, PolymemError, TokenHashes
import polymem.serve.service as service_mod
import polymem.torch.pages as torch_pages
from polymem.serve import _load
from polymem.serve._state import READING
from polymem.serve.pending import IORead
from polymem.serve.service import THREAD_PREFIX, PageService
from polymem.samples import sample_text
from polymem.torch import AssetTable, TrainableTable, attach

torch.set_num_threads(1)
LAYOUT = Layout(pages=512, heads=4, slots=4, head_dim=8)


@pytest.fixture(scope="module")
def byte_cache() -> TokenHashes:
    return TokenHashes.build("bytes", HashSpec())


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    arr = polymem.load_tokenizer("bytes").encode(sample_text())[:192]
    return torch.from_numpy(np.stack([arr[:48], arr[48:96], arr[96:144], arr[144:192]]))  # [4, 48]


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, MemoryAsset]:
    d = tmp_path_factory.mktemp("assets")
    w = np.random.default_rng(3).standard_normal((LAYOUT.num_rows, LAYOUT.head_dim)).astype(np.float32)
    f32 = MemoryAsset.from_array(d / "f32", w, HashSpec(), LAYOUT, orders=(1, 2, 3), chunks_per_shard=128)
    out = {"float32": f32}
    for dt in ("float16", "bfloat16", "nf4"):
        out[dt], _ = f32.quantize(d / dt, to=dt)
    return out


def llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


# how prefetched reads are made: "nowait" = the consumer's thread reads what the OS page cache holds (RWF_NOWAIT)
# and hands the rest to the service's I/O thread, all on the compiled lane (the default); "io" = every missing
# chunk goes to the I/O thread (what chunks that must come from storage get); "general" = as "nowait" without the
# lane (planning, cache copies and decoding as separate steps: what CUDA consumers get); "pool" = every missing
# chunk goes to the pool of reader threads (the path without the compiled reader, and of URLs); "python" = the
# pool path without any numba kernel (reads, planning, NF4 decode)
READ_MODES = ["nowait", "io", "general", "pool", "python"]
LANE_MODES = ("nowait", "io", "sync-lane")


@contextlib.contextmanager
def read_mode(svc, mode: str):
    saved = svc.reader.nowait, svc.io_thread, svc.lane, _load._IO, torch_pages.USE_HOST_KERNELS
    svc.reader.nowait = svc.reader.nowait and mode in ("nowait", "general")
    svc.io_thread = svc.io_thread and mode in ("nowait", "io", "general", "sync-lane")
    svc.lane = svc.lane and mode in LANE_MODES
    if mode == "python":  # no numba anywhere: reads in Python, rows planned and decoded by numpy/torch
        _load._IO = False
        torch_pages.USE_HOST_KERNELS = False
    try:
        yield svc
    finally:
        svc.reader.nowait, svc.io_thread, svc.lane, _load._IO, torch_pages.USE_HOST_KERNELS = saved


def pages_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def wait_no_threads(timeout: float = 10.0) -> list[threading.Thread]:
    for t in pages_threads():
        t.join(timeout)
    return pages_threads()


def run_generate(model, h, prompt):
    with torch.no_grad():
        logits = model(input_ids=prompt).logits
        h.reset()
        gen = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None,
                             output_logits=True, return_dict_in_generate=True)
    return logits, gen.sequences, torch.stack(gen.logits)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "nf4"])
@pytest.mark.parametrize("mode", ["sync", "sync-lane"] + READ_MODES)
def test_served_outputs_are_bit_identical_to_in_memory(byte_cache, ids, assets, dtype, mode):
    asset = assets[dtype]
    prefetch = not mode.startswith("sync")
    model = llama()
    prompt = ids[:, :12]
    h = attach(model, asset, byte_cache, layers=[0, 2], in_memory=True, value_init="orthogonal")
    ref = run_generate(model, h, prompt)
    with torch.no_grad():
        full_ref = model(input_ids=ids).logits
    h.detach()
    h = attach(model, asset, byte_cache, layers=[0, 2], in_memory=False, prefetch=prefetch, cache_mb=1,
               value_init="orthogonal")
    assert isinstance(h.table, AssetTable)
    with read_mode(h.table.service, "pool" if mode == "sync" else mode):
        lane = h.table.service.lane
        got = run_generate(model, h, prompt)
        for a, b in zip(ref, got):
            assert torch.equal(a, b)
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids).logits, full_ref)
    with h.disabled(), torch.no_grad():  # the memory matters: without it the logits differ
        assert not torch.equal(model(input_ids=ids).logits, full_ref)
    st = h.stats()
    assert st["prefetch"] is prefetch and st["misses"] > 0 and st["hits"] > 0 and st["bytes_read"] > 0
    assert st["reads"] == st["misses"] and st["errors"] == 0
    if mode not in ("nowait", "general"):
        assert st["nowait_reads"] == 0
    # the lane serves every forward once the shards are open (where numba and preadv2 are there)
    assert (st["lane_forwards"] > 0) == (mode in LANE_MODES and lane)
    h.detach()


@pytest.mark.parametrize("dtype", ["float16", "nf4"])
def test_training_step_with_frozen_served_table_is_bit_identical(byte_cache, ids, assets, dtype):
    """A recipient trained from scratch next to a frozen donor table: one AdamW step on the in-memory table
    and one on the served asset give the same loss, gradients and weights."""
    asset = assets[dtype]
    results = []
    for in_memory in (True, False):
        model = llama(seed=1).train()
        h = attach(model, asset, byte_cache, layers=[1], in_memory=in_memory, freeze_model=False, cache_mb=1)
        assert h.table.trainable is False
        params = h.trainable_parameters()
        opt = torch.optim.AdamW(params, lr=1e-3)
        losses = []
        for step in range(2):
            batch = ids[:, step * 8: step * 8 + 32]
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            losses.append(loss.detach())
            opt.step()
            opt.zero_grad()
        grads_seen = [p.detach().clone() for p in params]
        results.append((torch.stack(losses), grads_seen))
        h.detach()
    (l1, p1), (l2, p2) = results
    assert torch.equal(l1, l2)
    assert len(p1) == len(p2) and all(torch.equal(a, b) for a, b in zip(p1, p2))


def _chunks_of(ids: torch.Tensor, asset: MemoryAsset, byte_cache, max_n: int = 3) -> set[int]:
    """Distinct stored chunks the valid rows of a forward live in (numpy, independent of torch)."""
    from polymem.torch.hash import TorchTokenHashes

    rows = TorchTokenHashes.from_cache(byte_cache).ngram_rows(ids, asset.layout, max_n).numpy().reshape(-1)
    rows = rows[rows >= 0]
    g = asset.geometry
    return set((rows // g.rows_per_page // g.pages_per_chunk).tolist())


@pytest.mark.parametrize("dtype", ["float16", "nf4"])
def test_a_page_is_read_once_per_batch(byte_cache, assets, dtype):
    """A batch whose n-grams hit the same pages many times reads each chunk exactly once; the next forward
    of the same ids reads nothing (all hits)."""
    asset = assets[dtype]
    model = llama()
    text = np.frombuffer(b"the cat the cat the cat the cat the cat", dtype=np.uint8).astype(np.int64)
    batch = torch.from_numpy(np.stack([text, text, text]))  # every n-gram repeats across rows and positions
    need = _chunks_of(batch, asset, byte_cache)
    h = attach(model, asset, byte_cache, layers=[0, 1, 2], in_memory=False, cache_mb=4)
    with torch.no_grad():
        model(input_ids=batch)
    st = h.stats()
    assert st["reads"] == st["misses"] == len(need) and st["hits"] == 0
    assert st["bytes_read"] == len(need) * asset.geometry.chunk_bytes
    with torch.no_grad():
        model(input_ids=batch)
    st2 = h.stats()
    assert st2["reads"] == len(need) and st2["hits"] == len(need)
    h.detach()


def test_cache_never_exceeds_its_size(byte_cache, ids, assets):
    asset = assets["float16"]
    cb = asset.geometry.chunk_bytes
    cache_mb = 10 * cb / 2**20  # ten chunks
    model = llama()
    h = attach(model, asset, byte_cache, layers=[1], in_memory=True, value_init="orthogonal")
    with torch.no_grad():
        refs = [model(input_ids=ids[:, i: i + 6]).logits for i in range(0, 40, 3)]
    h.detach()
    h = attach(model, asset, byte_cache, layers=[1], in_memory=False, cache_mb=cache_mb, value_init="orthogonal")
    peaks = []
    with torch.no_grad():
        for j, i in enumerate(range(0, 40, 3)):
            assert torch.equal(model(input_ids=ids[:, i: i + 6]).logits, refs[j])
            st = h.stats()
            peaks.append(st["cache_bytes"])
            assert st["cache_bytes"] <= st["capacity_bytes"] == int(cache_mb * 2**20)
    assert st["cache_peak_bytes"] <= st["capacity_bytes"] and max(peaks) == 10 * cb
    assert st["evictions"] > 0 and st["cache_chunks"] == 10
    h.detach()
    # a cache of size 0 caches nothing and still serves every row
    h = attach(model, asset, byte_cache, layers=[1], in_memory=False, cache_mb=0, value_init="orthogonal")
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids[:, :6]).logits, refs[0])
    assert h.stats()["cache_peak_bytes"] == 0 and h.stats()["hits"] == 0
    h.detach()


def test_tables_on_one_asset_share_one_cache(byte_cache, ids, assets):
    asset = assets["nf4"]
    m1, m2 = llama(), llama(seed=2)
    h1 = attach(m1, asset, byte_cache, layers=[1], in_memory=False, cache_mb=1)
    h2 = attach(m2, asset, byte_cache, layers=[0], in_memory=False, cache_mb=2)
    assert h1.table.service is h2.table.service and h1.stats()["capacity_bytes"] == 2 << 20
    with torch.no_grad():
        m1(input_ids=ids)
        reads = h1.stats()["reads"]
        m2(input_ids=ids)  # same rows: everything is in the shared cache
    assert h2.stats()["reads"] == reads and h2.stats()["hits"] >= reads
    h1.detach()
    assert h2.stats()["cache_chunks"] > 0  # h2 still serves: the cache is kept
    with torch.no_grad():
        m2(input_ids=ids)
    assert h2.stats()["reads"] == reads
    h2.detach()
    assert wait_no_threads() == [] and h2.table.service.stats()["cache_chunks"] == 0


@pytest.mark.parametrize("mode", ["sync"] + READ_MODES)
def test_truncated_or_missing_shard_is_a_clear_error_in_the_forward(byte_cache, ids, assets, tmp_path, mode):
    src = assets["float16"]
    prefetch = mode != "sync"
    asset = MemoryAsset.from_array(tmp_path / "t", src.to_numpy(), HashSpec(), LAYOUT, orders=(1, 2, 3),
                                   dtype="float16", chunks_per_shard=128)
    model = llama()
    h = attach(model, asset, byte_cache, layers=[1], in_memory=False, prefetch=prefetch, cache_mb=0)
    shard = tmp_path / "t" / asset.geometry.shard_key(2)
    with read_mode(h.table.service, mode), torch.no_grad():
        model(input_ids=ids)  # healthy
        os.truncate(shard, 1000)
        with pytest.raises(FormatError, match=r"shard 'pages/c/2/0/0' ended after .* truncated"):
            model(input_ids=ids)
    h.detach()
    os.unlink(shard)
    h = attach(model, asset, byte_cache, layers=[1], in_memory=False, prefetch=prefetch, cache_mb=0)
    with read_mode(h.table.service, mode), torch.no_grad(), \
            pytest.raises(PolymemError, match=r"shard 'pages/c/2/0/0' is missing"):
        model(input_ids=ids)
    assert h.stats()["errors"] >= 1
    h.detach()
    assert wait_no_threads() == []


def test_corrupt_chunk_is_a_clear_error_in_the_forward(byte_cache, ids, assets, tmp_path):
    """A flipped byte inside a stored page fails its crc32c when the page service reads it, in the forward that
    needed it (synchronous and prefetched), and nothing corrupt enters the cache."""
    src = assets["float16"]
    asset = MemoryAsset.from_array(tmp_path / "c", src.to_numpy(), HashSpec(), LAYOUT, orders=(1, 2, 3),
                                   dtype="float16", chunks_per_shard=128)
    g = asset.geometry
    need = sorted(_chunks_of(ids, asset, byte_cache))
    victim = need[len(need) // 2]
    s, i = divmod(victim, g.chunks_per_shard)
    shard = tmp_path / "c" / g.shard_key(s)
    with open(shard, "r+b") as f:
        f.seek(i * g.stride + 7)
        b = f.read(1)
        f.seek(i * g.stride + 7)
        f.write(bytes([b[0] ^ 0x10]))
    model = llama()
    for mode in ["sync", "sync-lane"] + READ_MODES:
        h = attach(model, asset, byte_cache, layers=[1], in_memory=False, prefetch=not mode.startswith("sync"),
                   cache_mb=1)
        with read_mode(h.table.service, mode), torch.no_grad(), \
                pytest.raises(FormatError, match=rf"page {victim} fails its crc32c check"):
            model(input_ids=ids)
        assert h.stats()["errors"] >= 1
        assert not h.table.service.cached(victim)
        h.detach()


@pytest.mark.parametrize("mode", ["io", "sync-lane"])
def test_lane_read_errors_surface_in_the_forward_and_give_their_slots_back(byte_cache, ids, assets, tmp_path, mode):
    """On the lane (reads straight into reserved cache slots): a truncated shard and a missing one are clear
    errors in the forward that needed them; the reserved slots are free again and nothing stays in flight."""
    src = assets["nf4"]
    asset = MemoryAsset.from_array(tmp_path / "t", src.to_numpy(), HashSpec(), LAYOUT, orders=(1, 2, 3),
                                   dtype="nf4", chunks_per_shard=2)
    g = asset.geometry
    s = max(_chunks_of(ids, asset, byte_cache)) // g.chunks_per_shard  # a shard the forward needs
    key = g.shard_key(s)
    model = llama()
    h = attach(model, asset, byte_cache, layers=[1], in_memory=False, prefetch=mode == "io", cache_mb=1)
    svc = h.table.service
    if not svc.lane:
        pytest.skip("no compiled reader here")
    os.truncate(tmp_path / "t" / key, 10)
    with read_mode(svc, mode), torch.no_grad():
        with pytest.raises(FormatError, match=rf"shard '{key}' ended after .* truncated"):
            model(input_ids=ids)
        st = svc.stats()
        assert st["errors"] >= 1 and st["lane_forwards"] >= 1
        assert not (svc._chunk_at == READING).any() and not svc._inflight
        assert not any(svc.cached(s * g.chunks_per_shard + i) for i in range(g.chunks_per_shard))
    h.detach()
    os.unlink(tmp_path / "t" / key)  # (an open shard file stays readable: a new service opens them again)
    h = attach(model, asset, byte_cache, layers=[1], in_memory=False, prefetch=mode == "io", cache_mb=1)
    with read_mode(h.table.service, mode), torch.no_grad():
        with pytest.raises(PolymemError, match=rf"shard '{key}' is missing"):
            model(input_ids=ids)
        assert h.stats()["errors"] >= 1
    h.detach()
    assert wait_no_threads() == []


@pytest.mark.parametrize("mode", LANE_MODES)
def test_lane_evicts_within_its_size_and_stays_bit_identical(byte_cache, ids, assets, mode):
    """A cache a little larger than one forward's chunks: the lane makes room (LRU) forward after forward,
    outputs stay bit-identical and the cache never exceeds its size."""
    asset = assets["float16"]
    cb = asset.geometry.chunk_bytes
    model = llama()
    windows = [ids[:, i: i + 4] for i in range(0, 44, 4)]
    need = max(len(_chunks_of(w, asset, byte_cache)) for w in windows)
    assert len(set().union(*(_chunks_of(w, asset, byte_cache) for w in windows))) > need + 2
    h = attach(model, asset, byte_cache, layers=[1], in_memory=True, value_init="orthogonal")
    with torch.no_grad():
        refs = [model(input_ids=w).logits for w in windows]
    h.detach()
    cache_mb = (need + 2) * cb / 2**20
    h = attach(model, asset, byte_cache, layers=[1], in_memory=False, prefetch=mode != "sync-lane",
               cache_mb=cache_mb, value_init="orthogonal")
    with read_mode(h.table.service, mode), torch.no_grad():
        if not h.table.service.lane:
            pytest.skip("no compiled reader here")
        for _ in range(2):
            for w, ref in zip(windows, refs):
                assert torch.equal(model(input_ids=w).logits, ref)
                st = h.stats()
                assert st["cache_bytes"] <= st["capacity_bytes"]
    assert st["evictions"] > 0 and st["lane_forwards"] >= len(windows) and st["hits"] > 0
    assert st["cache_peak_bytes"] <= st["capacity_bytes"] and st["reads"] == st["misses"]
    h.detach()


def test_two_threads_on_one_small_shared_cache_stay_bit_identical(byte_cache, ids, assets):
    """Two models in two threads read one asset through one shared cache barely larger than a forward's
    chunks: lane forwards, general-path fallbacks, evictions and joins interleave; every output stays
    bit-identical to the in-memory table and no slot is left reserved."""
    asset = assets["float16"]
    cb = asset.geometry.chunk_bytes
    windows = [ids[:, i: i + 5] for i in range(0, 40, 5)]
    need = max(len(_chunks_of(w, asset, byte_cache)) for w in windows)
    models = [llama(), llama(seed=2)]
    refs = []
    for m in models:
        h = attach(m, asset, byte_cache, layers=[1], in_memory=True, value_init="orthogonal")
        with torch.no_grad():
            refs.append([m(input_ids=w).logits for w in windows])
        h.detach()
    hs = [attach(m, asset, byte_cache, layers=[1], in_memory=False, cache_mb=(need + 1) * cb / 2**20,
                 value_init="orthogonal") for m in models]
    bad: list = []

    def run(k: int) -> None:
        try:
            with torch.no_grad():
                for _ in range(3):
                    for w, ref in zip(windows, refs[k]):
                        if not torch.equal(models[k](input_ids=w).logits, ref):
                            bad.append(k)
        except BaseException as e:  # noqa: BLE001 - reported by the assert below
            bad.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    svc = hs[0].table.service
    st = svc.stats()
    assert bad == [] and st["errors"] == 0 and st["cache_bytes"] <= st["capacity_bytes"]
    assert st["evictions"] > 0 and st["lane_forwards"] > 0 and st["reads"] == st["misses"]
    assert not (svc._chunk_at == READING).any() and not svc._inflight
    for h in hs:
        h.detach()
    assert wait_no_threads() == []


def test_a_lane_read_in_flight_is_joined_by_the_general_path(assets):
    """Chunks the lane handed to the I/O thread are in flight for every consumer: a general-path request for
    them joins that read (one read), and the lane then decodes its rows out of the cache."""
    asset = assets["float16"]
    g = asset.geometry
    svc = PageService(asset, cache_mb=1, workers=1)
    if not svc.lane:
        pytest.skip("no compiled reader here")
    svc.reader.nowait = False  # as if the chunks had to come from storage: all go to the I/O thread
    rpc = g.rows_per_page * g.pages_per_chunk
    rows = np.array([[3 * rpc + 1, -1, 7 * rpc, 3 * rpc + 2], [11 * rpc + 5, 7 * rpc + 1, -1, 11 * rpc]])
    rd = svc.lane_begin(rows, background=True)
    assert isinstance(rd, IORead) and sorted(rd.chunks.tolist()) == [3, 7, 11]
    out = np.zeros((3, g.chunk_bytes), np.uint8)
    pending = svc.fetch_into(np.array([11, 3]), out[:2], background=True)
    assert pending is not None
    pending.wait()
    want = _direct(asset, np.array([3, 7, 11]))
    assert np.array_equal(out[:2], want[[2, 0]])
    rd.settle()
    dec = np.empty((rows.size, g.head_dim), np.float32)
    assert svc.lane_rows(rows, dec, torch_pages._PAIRS, torch_pages._half_table())
    full = asset.to_numpy()
    safe = np.where(rows < 0, 0, rows).reshape(-1)
    assert np.array_equal(dec, np.where((rows.reshape(-1) < 0)[:, None], 0, full[safe]))
    st = svc.stats()
    assert st["reads"] == st["misses"] == 3 and st["joined"] == 2 and st["read_calls"] == 1 and st["errors"] == 0
    assert all(svc.cached(c) for c in (3, 7, 11)) and not svc._inflight
    svc.close()
    assert wait_no_threads() == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="preadv2 is Linux's")
def test_the_compiled_reader_and_lane_are_there_on_linux(assets):
    """Where the lane can run it does (else the lane tests above would pass without exercising it): the
    kernels link to libc's preadv2 and google-crc32c's crc32c_value and load from numba's cache (and so do the
    asset reader's)."""
    from polymem.asset import _shards

    assert _load.kernels(io=True) is not None and _shards._kernels() is not None
    svc = PageService(assets["nf4"], cache_mb=1)
    assert svc.io_thread and svc.lane
    svc.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "del"]), st.integers(0, 40)), max_size=200),
       st.sampled_from([8, 16, 64]))
def test_chunk_index_behaves_like_a_dict(ops, cap):
    """The cache's compiled open-addressing index (linear probing, deletion by backward shift) maps chunks to
    slots exactly like a dict under any sequence of inserts and deletes (kept at most half full)."""
    from polymem.serve import _kernels as K

    keys, vals = np.full(cap, -1, np.int64), np.zeros(cap, np.int64)
    ref: dict[int, int] = {}
    for i, (op, c) in enumerate(ops):
        if op == "put" and (c in ref or len(ref) < cap // 2):
            K.idx_put(keys, vals, c, i)
            ref[c] = i
        elif op == "del":
            K.idx_del(keys, vals, c)
            ref.pop(c, None)
        probe = np.arange(41, dtype=np.int64)
        got = K.idx_get_many(keys, vals, probe, np.empty(41, np.int64))
        assert got.tolist() == [ref.get(k, -1) for k in range(41)]
    assert int((keys >= 0).sum()) == len(ref)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pool", "io", "nowait"])
def test_workers_stop_on_detach_and_on_garbage_collection(byte_cache, ids, assets, mode):
    """Reader threads (the pool, the I/O thread) and the shard files stop / close on detach, and when the
    handle and model are garbage-collected without a detach."""
    assert wait_no_threads() == []
    gc.collect()
    fds = open_fds()
    model = llama()
    h = attach(model, assets["nf4"], byte_cache, layers=[1], in_memory=False, read_workers=3)
    with read_mode(h.table.service, mode), torch.no_grad():
        model(input_ids=ids)
    assert 1 <= len(pages_threads()) <= 3 if mode == "pool" else len(pages_threads()) == (mode == "io")
    h.detach()
    assert pages_threads() == []  # detach waits for the workers
    assert open_fds() == fds
    h = attach(model, assets["nf4"], byte_cache, layers=[1], in_memory=False, read_workers=3)
    with read_mode(h.table.service, mode), torch.no_grad():
        model(input_ids=ids)
    assert bool(pages_threads()) == (mode != "nowait") and open_fds() > fds
    del h, model
    gc.collect()
    assert wait_no_threads() == [] and open_fds() == fds


def test_bad_serving_options_are_refused(byte_cache, assets):
    model = llama()
    for bad in (-1, float("inf"), 1e30, float("nan")):
        with pytest.raises(PolymemError, match=r"cache_mb=.* must be a number in \[0, 1,073,741,824\]"):
            attach(model, assets["nf4"], byte_cache, in_memory=False, cache_mb=bad)
    with pytest.raises(PolymemError, match=r"read_workers=0 must be a positive integer"):
        attach(model, assets["nf4"], byte_cache, in_memory=False, read_workers=0)


@pytest.fixture()
def memfs():
    fs = fsspec.filesystem("memory")
    yield fs
    fs.rm("/", recursive=True) if fs.exists("/served") else None
    fs.store.clear()


def upload(fs, asset: MemoryAsset, name: str) -> str:
    fs.put(str(asset.path), f"/served/{name}", recursive=True)
    return f"memory://served/{name}"


@pytest.mark.parametrize("dtype", ["float16", "nf4"])
def test_remote_asset_is_served_through_range_requests(byte_cache, ids, assets, memfs, dtype):
    url = upload(memfs, assets[dtype], dtype)
    remote = MemoryAsset.open(url)
    model = llama()
    h = attach(model, assets[dtype], byte_cache, layers=[1], value_init="orthogonal")
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    h.detach()
    h = attach(model, remote, byte_cache, layers=[1], in_memory=False, value_init="orthogonal", cache_mb=1)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)
    st = h.stats()
    assert st["source"] == "fsspec" and st["reads"] == len(_chunks_of(ids, remote, byte_cache))
    # a missing object surfaces in the forward that needs it
    h.detach()
    h = attach(model, remote, byte_cache, layers=[1], in_memory=False, value_init="orthogonal", cache_mb=0)
    memfs.rm(f"/served/{dtype}/" + remote.geometry.shard_key(0))
    with torch.no_grad(), pytest.raises(FormatError, match=r"object .*pages/c/0/0.* is missing"):
        model(input_ids=ids)
    h.detach()


# ------------------------------------------------------------------------------------------------- pull
def test_pull_stages_a_remote_asset_verified_and_atomically(assets, memfs, tmp_path):
    from polymem.ops.pull import pull

    src = assets["nf4"]
    url = upload(memfs, src, "p")
    got = pull(url, tmp_path / "local" / "p.pmem")
    assert got.path == str(tmp_path / "local" / "p.pmem") and got.backend == "fast"
    assert np.array_equal(got.to_numpy(), src.to_numpy()) and got.problems() == []
    with pytest.raises(PolymemError, match="already exists; pass overwrite=True"):
        pull(url, tmp_path / "local" / "p.pmem")
    # a corrupt byte in a remote shard: refused, nothing written, no temporary copy left
    key = f"/served/p/{src.geometry.shard_key(0)}"
    data = bytearray(memfs.cat_file(key))
    data[100] ^= 0xFF
    memfs.pipe_file(key, bytes(data))
    with pytest.raises(FormatError, match=r"shard 'pages/c/0/0' checksum mismatch .* nothing was written"):
        pull(url, tmp_path / "local" / "q.pmem")
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["p.pmem"]
    # --overwrite replaces a good copy only with a verified one: the corrupt source leaves it as it was
    with pytest.raises(FormatError, match="checksum mismatch"):
        pull(url, tmp_path / "local" / "p.pmem", overwrite=True)
    assert MemoryAsset.open(tmp_path / "local" / "p.pmem").problems() == []
    # a missing object is refused before anything is copied
    memfs.rm(key)
    with pytest.raises(FormatError, match=r"shard 'pages/c/0/0' is missing"):
        pull(url, tmp_path / "local" / "r.pmem")
    assert not (tmp_path / "local" / "r.pmem").exists()


def test_pull_cli(assets, tmp_path):
    from typer.testing import CliRunner

    from polymem.cli.app import app

    runner = CliRunner()
    src = assets["float16"]
    out = tmp_path / "copy.pmem"
    r = runner.invoke(app, ["pull", f"file://{src.path}", str(out)])
    assert r.exit_code == 0, r.output
    assert "OK" in r.output and "match their sha256" in r.output
    assert np.array_equal(MemoryAsset.open(out).to_numpy(), src.to_numpy())
    r = runner.invoke(app, ["pull", str(src.path), str(out)])
    assert r.exit_code != 0 and isinstance(r.exception, PolymemError) and "already exists" in str(r.exception)
    r = runner.invoke(app, ["pull", str(src.path), str(out), "--overwrite", "--workers", "2"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["pull", str(tmp_path / "nothing"), str(tmp_path / "x")])
    assert r.exit_code != 0 and "no asset directory here" in str(r.exception)


def test_pull_cli_errors_exit_2_with_one_line(assets, tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "from polymem.cli.app import main; main()", "pull",
                        str(tmp_path / "nothing"), str(tmp_path / "x")], capture_output=True, text=True)
    assert r.returncode == 2 and "no asset directory here" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------------ the page service
def _direct(asset: MemoryAsset, chunks) -> np.ndarray:
    """Stored chunk bytes read without the service (the asset's own verified reader)."""
    from polymem.asset._reader import FastReader

    ids = np.asarray(chunks, dtype=np.int64)
    out = np.empty((ids.size, asset.geometry.chunk_bytes), np.uint8)
    return FastReader(Path(asset.path), asset.geometry).read_chunks_into(ids, out)


def test_pages_in_the_os_cache_are_read_in_the_callers_thread(byte_cache, ids, assets):
    """Prefetch with every page in the OS page cache (the asset was just written): the pre-hook reads them
    itself (RWF_NOWAIT), no reader thread starts; where the file system refuses RWF_NOWAIT the pool reads."""
    asset = assets["nf4"]
    model = llama()
    assert wait_no_threads() == []
    h = attach(model, asset, byte_cache, layers=[1], in_memory=False, cache_mb=1)
    with torch.no_grad():
        model(input_ids=ids)
    st = h.stats()
    assert st["reads"] == st["misses"] == len(_chunks_of(ids, asset, byte_cache))
    if h.table.service.reader.nowait:
        assert st["nowait_reads"] == st["reads"] and pages_threads() == []
    else:
        assert st["nowait_reads"] == 0 and pages_threads()
    h.detach()


@pytest.mark.parametrize("reader", ["io", "pool"])
def test_pages_not_in_the_os_cache_go_to_the_reader_threads(byte_cache, ids, assets, tmp_path, reader):
    """Pages the OS has to fetch from the disk are not read in the caller's thread: they go to the service's
    I/O thread (or, without it, to the pool), all the forward's reads at once, and the site waits for them;
    the result is the same. A forward that found most chunks missing makes the next ones skip the
    non-blocking attempt (which would start each read in the caller's thread)."""
    big = Layout(pages=16384, heads=4, slots=4, head_dim=8)  # ~390 chunks: the rows' chunks lie far apart
    w = np.random.default_rng(5).standard_normal((big.num_rows, big.head_dim)).astype(np.float32)
    asset = MemoryAsset.from_array(tmp_path / "e", w, HashSpec(), big, orders=(1, 2, 3), dtype="nf4",
                                   chunks_per_shard=256)
    g = asset.geometry
    shards = [tmp_path / "e" / g.shard_key(s) for s in range(g.num_shards)]
    for p in shards:  # write back, then drop the shards from the OS page cache
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    fd = os.open(shards[0], os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(16)], 0, os.RWF_NOWAIT)
        pytest.skip("this file system keeps the pages cached after POSIX_FADV_DONTNEED (tmpfs?)")
    except BlockingIOError:
        pass
    except OSError:
        pytest.skip("RWF_NOWAIT is not supported here")
    finally:
        os.close(fd)
    model = llama()
    other = MemoryAsset.open(tmp_path / "e")  # its in-memory copy maps the shards: a separate object, dropped
    h = attach(model, other, byte_cache, layers=[1], in_memory=True, value_init="orthogonal")
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    h.detach()
    del h, other
    gc.collect()
    for p in shards:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    assert wait_no_threads() == []
    h = attach(model, asset, byte_cache, layers=[1], in_memory=False, cache_mb=1, value_init="orthogonal")
    svc = h.table.service
    svc.io_thread = svc.io_thread and reader == "io"
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)
    st = h.stats()
    assert st["reads"] == len(_chunks_of(ids, asset, byte_cache))
    if st["nowait_reads"] == st["reads"]:  # seen once under heavy load: the OS had the pages back already
        h.detach()
        pytest.skip("every page was in the OS page cache again by the forward")
    names = {t.name for t in pages_threads()}
    assert names == ({THREAD_PREFIX + "-io"} if svc.io_thread else names - {THREAD_PREFIX + "-io"}) and names
    if svc.io_thread and svc.reader.nowait and 2 * st["nowait_reads"] < st["reads"]:
        assert svc._nowait_skip == service_mod.NOWAIT_BACKOFF
    h.detach()
    assert wait_no_threads() == []


def test_cache_evicts_the_least_recently_used_chunks(assets):
    asset = assets["float16"]
    cb = asset.geometry.chunk_bytes
    svc = PageService(asset, cache_mb=10 * cb / 2**20, workers=1)  # ten chunks
    out = np.empty((10, cb), np.uint8)
    A, B, C = np.arange(0, 5), np.arange(5, 10), np.arange(10, 15)
    for chunks in (A, B, A, C):  # A is used again after B: C replaces B
        assert svc.fetch_into(chunks, out, background=False) is None
        assert np.array_equal(out[:5], _direct(asset, chunks))
    assert [svc.cached(c) for c in range(15)] == [True] * 5 + [False] * 5 + [True] * 5
    st = svc.stats()
    assert st["hits"] == 5 and st["reads"] == st["misses"] == 15 and st["evictions"] == 5
    assert st["cache_bytes"] == st["capacity_bytes"] == 10 * cb == st["cache_peak_bytes"]
    svc.close()


def test_a_chunk_in_flight_is_joined_not_read_twice(assets):
    """Two consumers asking for the same chunks while their read is still queued: one read, both served."""
    asset = assets["nf4"]
    cb = asset.geometry.chunk_bytes
    svc = PageService(asset, cache_mb=1, workers=1)
    svc.reader.nowait = False  # the reads go to the (single, busy) pool worker
    svc.io_thread = False
    gate = threading.Event()
    with svc._lock:  # the pool a background read starts (fetch_into), started here to keep its worker busy
        pool = svc._pool or svc._start_pool()
    busy = pool.submit(gate.wait)
    chunks = np.array([3, 7, 11], dtype=np.int64)
    a, b = np.zeros((3, cb), np.uint8), np.zeros((3, cb), np.uint8)
    pa = svc.fetch_into(chunks, a, background=True)
    pb = svc.fetch_into(chunks, b, background=True)
    assert pa is not None and pb is not None and not pa.done()
    gate.set()
    busy.result()
    pa.wait()
    pb.wait()
    want = _direct(asset, chunks)
    assert np.array_equal(a, want) and np.array_equal(b, want)
    st = svc.stats()
    assert st["reads"] == st["misses"] == 3 and st["joined"] == 3 and st["read_calls"] == 1
    svc.close()
    assert wait_no_threads() == []


def test_a_chunk_read_by_the_io_thread_is_joined_and_read_once(assets):
    """Two consumers asking for the same chunks before either has waited: the second joins the first's read
    on the I/O thread; whoever waits first counts and caches them, the other copies them."""
    asset = assets["nf4"]
    cb = asset.geometry.chunk_bytes
    svc = PageService(asset, cache_mb=1, workers=1)
    if not svc.io_thread:
        pytest.skip("no compiled reader here")
    svc.reader.nowait = False  # as if the chunks had to come from storage
    chunks = np.array([3, 7, 11], dtype=np.int64)
    a, b = np.zeros((3, cb), np.uint8), np.zeros((3, cb), np.uint8)
    pa = svc.fetch_into(chunks, a, background=True)
    pb = svc.fetch_into(chunks[::-1].copy(), b, background=True)
    assert pa is not None and pb is not None
    pb.wait()
    pa.wait()
    want = _direct(asset, chunks)
    assert np.array_equal(a, want) and np.array_equal(b, want[::-1])
    st = svc.stats()
    assert st["reads"] == st["misses"] == 3 and st["joined"] == 3 and st["read_calls"] == 1 and st["errors"] == 0
    assert all(svc.cached(c) for c in chunks.tolist())
    assert {t.name for t in pages_threads()} == {THREAD_PREFIX + "-io"}
    assert svc.fetch_into(chunks, a, background=True) is None and svc.stats()["hits"] == 3  # cached now
    svc.close()
    assert wait_no_threads() == []


def test_a_larger_request_grows_the_shared_cache_and_keeps_its_chunks(assets):
    asset = assets["float16"]
    cb = asset.geometry.chunk_bytes
    svc = service_mod.service_for(asset, cache_mb=4 * cb / 2**20)
    svc.acquire()
    out = np.empty((4, cb), np.uint8)
    svc.fetch_into(np.arange(4), out, background=False)
    assert service_mod.service_for(asset, cache_mb=8 * cb / 2**20) is svc
    assert svc.stats()["capacity_bytes"] == 8 * cb and all(svc.cached(c) for c in range(4))
    big = np.empty((8, cb), np.uint8)
    svc.fetch_into(np.arange(8), big, background=False)
    assert np.array_equal(big, _direct(asset, np.arange(8))) and svc.stats()["evictions"] == 0
    svc.release()
    assert svc.stats()["cache_chunks"] == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_io_thread(assets):
    """A child forked after the I/O thread started (e.g. a DataLoader worker) inherits no thread: its first
    background read starts one instead of queueing to nobody."""
    asset = assets["nf4"]
    cb = asset.geometry.chunk_bytes
    svc = PageService(asset, cache_mb=0, workers=1)
    if not svc.io_thread:
        pytest.skip("no compiled reader here")
    svc.reader.nowait = False
    out = np.zeros((2, cb), np.uint8)
    chunks = np.array([1, 5], dtype=np.int64)
    svc.fetch_into(chunks, out, background=True).wait()
    want = _direct(asset, chunks)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 = served right; a hang is killed by the alarm
        code = 1
        try:
            import signal

            signal.alarm(30)
            got = np.zeros((2, cb), np.uint8)
            svc.fetch_into(chunks, got, background=True).wait()
            code = 0 if np.array_equal(got, want) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    svc.close()
    assert wait_no_threads() == []
