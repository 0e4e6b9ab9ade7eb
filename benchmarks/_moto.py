"""A local S3 server for the benchmarks: moto's ThreadedMotoServer on 127.0.0.1, a free port, dummy credentials."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def local_s3(bucket: str) -> Iterator[tuple[str, Any]]:
    """Start the server, point the AWS environment (credentials, ``AWS_ENDPOINT_URL``) at it and make ``bucket``;
    yields (endpoint URL, an s3fs filesystem on it). The server stops on exit."""
    import s3fs
    from moto.server import ThreadedMotoServer

    os.environ.update({"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        fs = s3fs.S3FileSystem(endpoint_url=endpoint)
        fs.mkdir(bucket)
        yield endpoint, fs
    finally:
        server.stop()
