"""A small `train_donor` run, in one process or as one rank under torchrun (tests/recipes/test_sharded.py starts
it): ``python tests/dist_train.py CORPUS OUT STEPS [BATCH [CHECKPOINT_EVERY [PAUSE_S [HASH]]]]``. Prints each rank's figures as a JSON line. ``--check NAME``: each rank
claims another corpus (the start-of-run check must stop them all)."""

from __future__ import annotations

import json
import os
import sys
import time

import torch


def _say(d: dict) -> None:
    """One JSON line in one write: the processes share the pipe, and a write under 4 KiB is never interleaved."""
    os.write(1, (json.dumps(d) + "\n").encode())


def check(what: str) -> None:
    """Each rank claims another corpus: every rank must stop with the same one line."""
    import torch.distributed as dist

    from polymem.errors import PolymemError
    from polymem.torch.sharded import check_same_everywhere, init_from_env

    init_from_env("cpu")
    try:
        check_same_everywhere({"--steps": 20, "--corpus": f"{what}-{dist.get_rank()}.jsonl.gz"})
        _say({"rank": dist.get_rank(), "error": None})
    except PolymemError as e:
        _say({"rank": dist.get_rank(), "error": str(e)})
    from polymem.torch.sharded import finish

    finish(exit_process=True)


def main() -> None:
    if sys.argv[1] == "--check":
        check(sys.argv[2])
        return
    corpus, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    every = int(sys.argv[5]) if len(sys.argv) > 5 else 0  # checkpoint every this many steps
    pause = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0  # seconds after each step (time for a test to kill)
    hash_kind = sys.argv[7] if len(sys.argv) > 7 else "bytes"
    torch.set_num_threads(1)
    rank = 0
    if "WORLD_SIZE" in os.environ:
        import torch.distributed as dist

        from polymem.torch.sharded import init_from_env

        init_from_env("cpu")  # as `polymem train` joins: a restarted group gets store keys of its own
        rank = dist.get_rank()
    from polymem.recipes.train import MemoryConfig, TrainConfig, train_donor

    cfg = TrainConfig(steps=steps, batch_size=batch, block_size=32, n_layer=2, n_head=2, d_model=32, precision="fp32")
    mem = MemoryConfig(params=61 * 4 * 4 * 8, heads=4, slots=4, head_dim=8)  # 61 pages: no world size divides them
    with open(f"{out}.pid{rank}", "w") as f:  # the test that kills a process finds it here
        f.write(str(os.getpid()))
    s = train_donor("bytes", [corpus], out, cfg=cfg, mem=mem, heldout_every=3, return_model=True,
                    checkpoint_every=every, on_step=lambda i, loss: time.sleep(pause), hash=hash_kind)
    t = s["handle"].table
    _say({"rank": rank, "local_rows": int(t.weight.shape[0]), "rows": t.layout.num_rows,
          "resumed_at_step": s["resumed_at_step"],
          **{k: s[k] for k in ("heldout_bpb", "heldout_bpb_memory_off", "rows_touched", "final_loss")}})
    from polymem.torch.sharded import finish

    finish(exit_process=True)


if __name__ == "__main__":
    main()
