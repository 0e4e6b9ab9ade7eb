"""A small `train_donor` run, in one process or as one rank under torchrun (tests/recipes/test_sharded.py starts
it): ``python tests/dist_train.py CORPUS OUT STEPS [BATCH]``. Prints each rank's figures as a JSON line. ``--check NAME``: each rank
claims another corpus (the start-of-run check must stop them all)."""

from __future__ import annotations

import json
import os
import sys

import torch


def check(what: str) -> None:
    """Each rank claims another corpus: every rank must stop with the same one line."""
    import torch.distributed as dist

    from polymem.errors import PolymemError
    from polymem.torch.sharded import check_same_everywhere

    dist.init_process_group("gloo")
    try:
        check_same_everywhere({"--steps": 20, "--corpus": f"{what}-{dist.get_rank()}.jsonl.gz"})
        print(json.dumps({"rank": dist.get_rank(), "error": None}))
    except PolymemError as e:
        print(json.dumps({"rank": dist.get_rank(), "error": str(e)}))
    from polymem.torch.sharded import finish

    finish()


def main() -> None:
    if sys.argv[1] == "--check":
        check(sys.argv[2])
        return
    corpus, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    torch.set_num_threads(1)
    rank = 0
    if "WORLD_SIZE" in os.environ:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
    from polymem.recipes.train import MemoryConfig, TrainConfig, train_donor

    cfg = TrainConfig(steps=steps, batch_size=batch, block_size=32, n_layer=2, n_head=2, d_model=32, precision="fp32")
    mem = MemoryConfig(params=61 * 4 * 4 * 8, heads=4, slots=4, head_dim=8)  # 61 pages: no world size divides them
    s = train_donor("bytes", [corpus], out, cfg=cfg, mem=mem, heldout_every=3, return_model=True)
    t = s["handle"].table
    print(json.dumps({"rank": rank, "local_rows": int(t.weight.shape[0]), "rows": t.layout.num_rows,
                      **{k: s[k] for k in ("heldout_bpb", "heldout_bpb_memory_off", "rows_touched", "final_loss")}}))
    from polymem.torch.sharded import finish

    finish()


if __name__ == "__main__":
    main()
