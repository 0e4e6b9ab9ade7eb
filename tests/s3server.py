"""A local S3 server for the tests: moto's ThreadedMotoServer on 127.0.0.1 (a free port) with dummy credentials,
reached through s3fs over HTTP; nothing leaves the machine. Import the ``endpoint`` fixture into a test module."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

BUCKET = "polymem-test"
_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    old = {k: os.environ.get(k) for k in (*_ENV, "AWS_ENDPOINT_URL")}
    os.environ.update(_ENV)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        fs = s3fs.S3FileSystem(endpoint_url=url)
        try:
            fs.mkdir(BUCKET)
        except FileExistsError:  # moto keeps one in-process state: another module's server already made it
            pass
        yield url
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
