"""polymem's row-sharded table against TorchRec's, the table layer alone: lookups, backward and the row-wise update
of one table sharded by rows over N processes (gloo, one thread each), the same ids in both.

    python benchmarks/bench_torchrec.py [--params 64M] [--head-dim 64] [--lookups 16384] [--steps 20] [--rounds 5]
                                        [--nproc 2] [--json docs/benchmarks/torchrec.json]

polymem: :class:`polymem.torch.sharded.ShardedTable` (two all-to-alls per lookup, a sparse gradient) and
:class:`polymem.torch.optim.SparseRowRMS`, the rule `polymem train` applies to a table. TorchRec: an
``EmbeddingCollection`` row-wise sharded by its planner under ``DistributedModelParallel``, FBGEMM's fused
``EXACT_ROWWISE_ADAGRAD`` (the update runs inside backward; the nearest of its CPU optimizers, not the same rule).
Ids are Zipf-distributed (a = 1.1) over the rows, as n-gram rows are read; each process looks up its half.
Needs ``pip install torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0`` (the versions that load with torch 2.13.0; keep the
GPU ``fbgemm-gpu`` uninstalled on a CPU machine). Each round starts both arms as fresh torchrun groups,
alternating which goes first; figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _ids(rows: int, n: int, step: int, rank: int, world: int):
    import numpy as np

    rng = np.random.default_rng(1000 + step)
    z = rng.zipf(1.1, size=n * world)
    ids = (z - 1) % rows  # rank 0 of the Zipf law is row 0; a permutation would not change the work
    perm = np.random.default_rng(7).permutation(rows)  # spread the popular rows over every shard
    return perm[ids[rank * n:(rank + 1) * n]].astype(np.int64)


def _worker(args: argparse.Namespace) -> None:
    import resource

    import numpy as np
    import torch
    import torch.distributed as dist

    from polymem.hash import Layout
    from polymem.torch.sharded import init_from_env

    torch.set_num_threads(1)
    init_from_env("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    layout = Layout.for_params(args.params, head_dim=args.head_dim)
    rows, d, n = layout.num_rows, layout.head_dim, args.lookups // world
    grads = [torch.from_numpy(np.random.default_rng(s).standard_normal((n, d), dtype=np.float32))
             for s in range(4)]

    if args.worker == "polymem":
        from polymem.hash import HashSpec
        from polymem.torch.optim import SparseRowRMS
        from polymem.torch.sharded import ShardedTable

        table = ShardedTable(spec=HashSpec(), layout=layout)
        opt = SparseRowRMS([table.weight], lr=0.01)
        local_rows = table.hi - table.lo

        def step(ids: torch.Tensor, g: torch.Tensor) -> None:
            (table.gather(ids) * g).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        def local_weight() -> torch.Tensor:
            return table.weight.detach()

        def state_bytes() -> int:
            st = opt.state[table.weight]
            return table.local_bytes() + sum(v.numel() * v.element_size() for v in st.values())
    else:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
        from torchrec.distributed.embedding import EmbeddingCollectionSharder
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
        from torchrec.distributed.types import ShardingEnv, ShardingType

        ec = EmbeddingCollection(tables=[EmbeddingConfig(name="t", embedding_dim=d, num_embeddings=rows,
                                                         feature_names=["f"])], device=torch.device("meta"))
        sharder = EmbeddingCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                           "learning_rate": 0.01})
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=world, compute_device="cpu"),
            constraints={"t": ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value])})
        pg = dist.group.WORLD
        plan = planner.collective_plan(ec, [sharder], pg)
        model = DistributedModelParallel(ec, device=torch.device("cpu"), plan=plan, sharders=[sharder],  # type: ignore[list-item]
                                         env=ShardingEnv.from_process_group(pg))
        shard = plan.plan[""]["t"].sharding_spec.shards[rank]  # type: ignore[index,union-attr]
        local_rows = int(shard.shard_sizes[0])
        lengths = torch.tensor([n], dtype=torch.int32)

        def step(ids: torch.Tensor, g: torch.Tensor) -> None:
            kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=ids, lengths=lengths)
            (model(kjt)["f"].values() * g).sum().backward()  # the fused optimizer updates in backward

        def local_weight() -> torch.Tensor:
            return model.state_dict()["embeddings.t.weight"].local_shards()[0].tensor.detach()

        def state_bytes() -> int:
            return local_rows * d * 4 + local_rows * 4  # rows + one row-wise Adagrad sum per row

    batches = [torch.from_numpy(_ids(rows, n, s, rank, world)) for s in range(args.steps + 3)]
    before = local_weight().clone()
    for s in range(3):  # warm up
        step(batches[s], grads[s % 4])
    dist.barrier()
    t0 = time.perf_counter()
    for s in range(3, args.steps + 3):
        step(batches[s], grads[s % 4])
    dist.barrier()
    secs = time.perf_counter() - t0
    changed = torch.tensor(int((local_weight() != before).any(1).sum()))  # both arms must move the rows read
    dist.all_reduce(changed)
    read = np.unique(np.concatenate([_ids(rows, n, s, r, world) for s in range(args.steps + 3) for r in range(world)]))
    out = {"arm": args.worker, "rank": rank, "world": world, "rows": rows, "local_rows": local_rows,
           "lookups_per_s": args.lookups * args.steps / secs, "rows_changed": int(changed), "rows_read": len(read), "state_bytes": state_bytes(),
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    os.write(1, (json.dumps(out) + "\n").encode())
    dist.barrier()
    dist.destroy_process_group()


def _run(arm: str, args: argparse.Namespace) -> list[dict]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(port), __file__, "--worker", arm, "--params", str(args.params),
           "--head-dim", str(args.head_dim), "--lookups", str(args.lookups), "--steps", str(args.steps)]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise SystemExit(f"{arm} failed:\n{r.stderr[-4000:]}")
    return sorted((json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")), key=lambda d: d["rank"])


def main() -> None:
    from polymem.cli._options import parse_count

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", choices=("polymem", "torchrec"))
    ap.add_argument("--params", type=parse_count, default=64_000_000)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--lookups", type=int, default=16384, help="lookups per step over all processes")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.worker:
        _worker(args)
        return
    import statistics

    from bench_sharded import cpu_flags  # the script's folder is on sys.path

    rounds = []
    for k in range(args.rounds):
        arms = ("polymem", "torchrec") if k % 2 == 0 else ("torchrec", "polymem")
        got = {arm: _run(arm, args) for arm in arms}
        ratio = got["polymem"][0]["lookups_per_s"] / got["torchrec"][0]["lookups_per_s"]
        rounds.append({"ratio": ratio, **got})
        for arm in arms:
            if got[arm][0]["rows_changed"] != got[arm][0]["rows_read"]:
                raise SystemExit(f"{arm} changed {got[arm][0]['rows_changed']:,} rows of the "
                                 f"{got[arm][0]['rows_read']:,} read: its update did not run as set up")
        print(f"round {k + 1}: polymem {got['polymem'][0]['lookups_per_s']:,.0f} lookups/s, torchrec "
              f"{got['torchrec'][0]['lookups_per_s']:,.0f} lookups/s, {ratio:.2f}×", flush=True)
    ratios = sorted(r["ratio"] for r in rounds)
    last = rounds[-1]
    summary = {
        "command": "python benchmarks/bench_torchrec.py " + " ".join(sys.argv[1:]),
        "cpu": cpu_flags(), "nproc": args.nproc, "params": args.params, "head_dim": args.head_dim,
        "lookups_per_step": args.lookups, "steps": args.steps,
        "lookups_per_s": {arm: statistics.median(r[arm][0]["lookups_per_s"] for r in rounds)
                          for arm in ("polymem", "torchrec")},
        "ratio_polymem_over_torchrec": {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]},
        "local_rows": {arm: [p["local_rows"] for p in last[arm]] for arm in ("polymem", "torchrec")},
        "state_bytes": {arm: [p["state_bytes"] for p in last[arm]] for arm in ("polymem", "torchrec")},
        "peak_rss_bytes": {arm: [p["peak_rss_bytes"] for p in last[arm]] for arm in ("polymem", "torchrec")},
        "rounds": rounds,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
