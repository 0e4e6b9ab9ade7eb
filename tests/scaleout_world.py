"""The world of docs/scale-out.md: a local S3 server and a local Dask cluster stand in for the doc's bucket and
cluster, so that its shell blocks run as written.

* moto's ``ThreadedMotoServer`` on 127.0.0.1 (a free port), reached through ``AWS_ENDPOINT_URL`` with dummy
  credentials, and a ``research`` profile in ``HOME/.aws`` (the doc's ``--storage-options '{"profile": …}'``);
* bucket ``corpora``: ``web/shard-00000.jsonl.zst`` … ``web/shard-00003.jsonl.zst``, four zstd JSONL shards of
  four pages each, cut from the shipped sample (``sample:pydocs``);
* bucket ``models``: ``tables/t.pmem``, an asset whose writer died before its group metadata (``zarr.json``) landed
  (the doc's ``polymem verify`` of a half-written asset);
* the doc's scheduler address ``tcp://10.0.0.5:8786`` becomes 127.0.0.1 and a free port; the scheduler and the
  workers listen on 127.0.0.1 only, and the workers keep their spill files under ``home``.

Used by tests/docblocks.py (``WORLDS``): ``scale_out(work, home) -> World``.
"""

from __future__ import annotations

import gzip
import json
import logging
import shlex
import socket
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from docblocks import World

# What the doc names: its scheduler address, its buckets and the half-written asset.
DOC_SCHEDULER = "10.0.0.5:8786"
BUCKETS = ("corpora", "models")
SHARDS, PAGES_PER_SHARD = 4, 4  # 16 of the sample's 43 pages: the cluster run stays short
HALF_WRITTEN = "s3://models/tables/t.pmem"
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _aws_files(home: Path) -> dict[str, str]:
    """``HOME/.aws/config`` and ``credentials`` with a ``research`` profile; the env vars that name them."""
    aws = home / ".aws"
    aws.mkdir(parents=True, exist_ok=True)
    (aws / "config").write_text("[default]\nregion = us-east-1\n\n[profile research]\nregion = us-east-1\n")
    (aws / "credentials").write_text(
        "[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n\n"
        "[research]\naws_access_key_id = research\naws_secret_access_key = research\n"
    )
    return {"AWS_CONFIG_FILE": str(aws / "config"), "AWS_SHARED_CREDENTIALS_FILE": str(aws / "credentials")}


def _shards(fs: Any, count: int, per: int) -> None:
    """The shipped sample's first ``count * per`` pages as ``count`` zstd JSONL shards at ``s3://corpora/web/``."""
    import zstandard

    from polymem.samples import sample_path

    with gzip.open(sample_path("pydocs.jsonl.gz"), "rt", encoding="utf-8") as f:
        lines = [ln if ln.endswith("\n") else ln + "\n" for ln in f if ln.strip()]
    assert count * per <= len(lines), (count, per, len(lines))
    for i in range(count):
        data = "".join(lines[i * per:(i + 1) * per]).encode("utf-8")
        fs.pipe(f"corpora/web/shard-{i:05d}.jsonl.zst", zstandard.ZstdCompressor().compress(data))


def _half_written(url: str, options: dict[str, str]) -> None:
    """An asset at ``url`` as a writer leaves it when it dies right before the last step of a commit: its shard
    object and array metadata uploaded, the group metadata not. The doc's ``python notest`` block writes one like
    it there (4,096 pages; the same two objects: one shard and ``pages/zarr.json``); this one is smaller."""
    from polymem import HashSpec, Layout, MemoryAsset
    from polymem.asset import _remote

    layout = Layout(pages=256, heads=8, slots=8, head_dim=64)
    table = np.zeros((layout.num_rows, layout.head_dim), np.float32)
    MemoryAsset.from_array(url, table, HashSpec(), layout, orders=(1, 2, 3), dtype="float16",
                           storage_options=options)
    fs, root = _remote.filesystem(url, options)
    fs.rm(f"{root}/{_remote.GROUP_META}")


def scale_out(work: Path, home: Path) -> World:
    """Start the S3 server, fill its buckets, pick the scheduler's port; the World stops the server at the end."""
    import s3fs  # type: ignore[import-untyped]
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    http_log = logging.getLogger("werkzeug")  # the server's request log: one line per request, on stderr
    level = http_log.level
    http_log.setLevel(logging.ERROR)
    server.start()
    world = World()
    world.cleanup.append(lambda: http_log.setLevel(level))
    world.cleanup.append(server.stop)
    url = f"http://127.0.0.1:{port}"
    try:
        options = {"endpoint_url": url, "key": "testing", "secret": "testing"}
        fs = s3fs.S3FileSystem(**options)
        for bucket in BUCKETS:  # moto keeps one state per process: empty what an earlier world left
            if fs.exists(bucket):
                fs.rm(bucket, recursive=True)
            fs.mkdir(bucket)
        _shards(fs, SHARDS, PAGES_PER_SHARD)
        _half_written(HALF_WRITTEN, options)
    except BaseException:
        world.close()
        raise
    world.env.update(_CREDENTIALS, AWS_ENDPOINT_URL=url, **_aws_files(home))
    scheduler = f"127.0.0.1:{_free_port()}"
    host, _, sport = scheduler.partition(":")
    world.replace += [
        # more specific first: each replacement sees the line the ones before it made
        # (the HTTP server of a scheduler listens on every interface unless told otherwise, dashboard or not)
        (f"dask scheduler --host {DOC_SCHEDULER.split(':')[0]}",
         f"dask scheduler --host {host} --port {sport} --dashboard-address {host}:0"),
        (f"dask worker tcp://{DOC_SCHEDULER}",
         f"dask worker tcp://{scheduler} --host {host} --dashboard-address {host}:0 "
         f"--local-directory {shlex.quote(str(home / 'dask-worker-space'))}"),
        (f"tcp://{DOC_SCHEDULER}", f"tcp://{scheduler}"),
    ]
    return world


if __name__ == "__main__":  # start the world by hand: python tests/scaleout_world.py
    tmp = Path(tempfile.mkdtemp(prefix="scaleout-"))
    (tmp / "work").mkdir()
    (tmp / "home").mkdir()
    w = scale_out(tmp / "work", tmp / "home")
    print(json.dumps({"env": w.env, "replace": w.replace}, indent=1))
    input("serving; press Enter to stop ")
    w.close()
