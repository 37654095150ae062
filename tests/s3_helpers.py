"""The S3 server the object-storage tests talk to, and a fault-injecting proxy in front of it.

- ``s3_server``: a moto S3 server on 127.0.0.1 (bucket ``BUCKET``), with this process and its
  children pointed at it; its request log records every request line.
- ``proxy`` and ``s3``: a threaded HTTP proxy (:class:`FaultProxy`) forwarding to that
  server, which by rule (:func:`on`) answers with a 5xx instead, ignores ``Range``, corrupts
  the body or drops every connection; ``s3`` points every S3 client of this process and its
  children at the proxy, and ``s3.direct`` reaches the server itself.
- ``sharded``: the TF1 Saver checkpoint of two data shards those tests put there.

A test module takes the fixtures it uses by name (``from s3_helpers import s3_server``).
Network traffic stays on 127.0.0.1, with test credentials (no instance-metadata lookups).
"""

from __future__ import annotations

import http.client
import http.server
import logging
import os
import re
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

fsspec = pytest.importorskip("fsspec")

import transform_helpers as th  # noqa: E402

# ================================================================ the S3 server (moto)

BUCKET = "tfckpt-test"


class _RequestLog(logging.Handler):
    """The S3 server's request lines: (method, path, status)."""

    LINE = re.compile(
        r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (\S+) HTTP/[0-9.]+(?:\x1b\[[0-9;]*m)*" '
        r"(\d{3})"
    )

    def __init__(self):
        super().__init__(logging.INFO)
        self.requests: list[tuple[str, str, int]] = []

    def emit(self, record):
        m = self.LINE.search(record.getMessage())
        if m:
            self.requests.append((m[1], m[2], int(m[3])))


@pytest.fixture(scope="module")
def s3_server():
    """A moto S3 server on 127.0.0.1, and this process and its children pointed at it."""
    s3fs = pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    log = _RequestLog()
    wz = logging.getLogger("werkzeug")
    old = (wz.level, wz.propagate)
    wz.addHandler(log)
    wz.setLevel(logging.INFO)
    wz.propagate = False
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    assert host == "127.0.0.1"
    endpoint = f"http://127.0.0.1:{port}"
    mp = pytest.MonkeyPatch()
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        # fsspec reads FSSPEC_<PROTOCOL>_<KWARG> when imported: child processes
        # (CLI runs, Dask workers) get the endpoint from here...
        "FSSPEC_S3_ENDPOINT_URL": endpoint,
    }.items():
        mp.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        mp.delenv(k, raising=False)
    # ...this process imported fsspec already.
    mp.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
    s3fs.S3FileSystem.clear_instance_cache()
    fs = fsspec.filesystem("s3")
    assert fs.endpoint_url == endpoint
    try:
        fs.mkdir(BUCKET)
    except FileExistsError:  # moto keeps its buckets per process: an earlier module's
        pass
    try:
        yield SimpleNamespace(endpoint=endpoint, log=log, s3fs=s3fs)
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        mp.undo()
        server.stop()
        wz.removeHandler(log)
        wz.setLevel(old[0])
        wz.propagate = old[1]


# ================================================================ the fault proxy

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
}
ERROR_BODY = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
    b"<Message>injected by the test proxy</Message></Error>"
)


class FaultProxy:
    """An HTTP proxy to ``upstream``; ``rules`` decide what happens to each request.

    A rule is ``rule(method, path, headers) -> action | None``; the first action wins:
    an int (answer with that status, not forwarded), ``"ignore_range"`` (forward without
    the Range header), ``"corrupt"`` (flip bits of the response body) or ``"die"`` (from
    then on, close every connection without an answer). ``log`` lists
    ``(method, path, action)`` of every request.
    """

    def __init__(self, upstream: str):
        host, port = upstream.rsplit("/", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.rules: list = []
        self.log: list[tuple[str, str, object]] = []
        self.dead = False
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients use it

            def log_message(self, *args):
                pass

            def handle_one_request(self):
                if proxy.dead:
                    self.close_connection = True
                    return
                super().handle_one_request()

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self):
                body = self._body()
                action = next(
                    (
                        a
                        for a in (
                            r(self.command, self.path, self.headers) for r in list(proxy.rules)
                        )
                        if a is not None
                    ),
                    None,
                )
                proxy.log.append((self.command, self.path, action))
                if action == "die":
                    proxy.dead = True
                if proxy.dead:
                    self.close_connection = True  # no answer at all
                    return
                if isinstance(action, int):
                    self.send_response_only(action)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(ERROR_BODY)))
                    self.end_headers()
                    self.wfile.write(ERROR_BODY)
                    return
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in HOP_BY_HOP
                    and not (action == "ignore_range" and k.lower() == "range")
                }
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                if action == "corrupt" and data:
                    data = bytearray(data)
                    data[len(data) // 2] ^= 0x5A
                self.send_response_only(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                length = (
                    resp.getheader("Content-Length", "0") if self.command == "HEAD" else len(data)
                )
                self.send_header("Content-Length", str(length))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(bytes(data))

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        self.rules.clear()
        self.log.clear()
        self.dead = False

    def requests(self, method: str, ending: str) -> list:
        return [a for m, p, a in self.log if m == method and p.split("?")[0].endswith(ending)]

    def stop(self) -> None:
        self.dead = True
        self.server.shutdown()
        self.server.server_close()


def on(method: str, ending: str, action, times: int | None = None):
    """A rule: ``action`` for ``method`` requests of keys ending in ``ending`` (``times`` at
    most, then the request goes through)."""
    left = [times]

    def rule(m, path, headers):
        if m != method or not path.split("?")[0].endswith(ending):
            return None
        if left[0] is not None:
            if left[0] == 0:
                return None
            left[0] -= 1
        return action

    return rule


@pytest.fixture(scope="module")
def proxy(s3_server):
    px = FaultProxy(s3_server.endpoint)
    yield px
    px.stop()


@pytest.fixture
def s3(s3_server, proxy, monkeypatch):
    """Every S3 client of this process and its children goes through the proxy, with one
    retry and 5-second timeouts; ``direct`` reaches the server itself."""
    proxy.reset()
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", proxy.url)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": proxy.url})
    monkeypatch.setenv("TFCKPT_REMOTE_RETRIES", "1")
    monkeypatch.setenv("TFCKPT_REMOTE_TIMEOUT", "5")
    s3_server.s3fs.S3FileSystem.clear_instance_cache()
    direct = fsspec.filesystem("s3", endpoint_url=s3_server.endpoint, skip_instance_cache=True)
    base = f"{BUCKET}/{uuid.uuid4().hex[:12]}"

    def files(sub: str) -> dict[str, bytes]:
        direct.invalidate_cache()
        key = f"{base}/{sub}"
        return {p[len(key) + 1 :]: direct.cat_file(p) for p in direct.find(key)}

    def put(prefix, sub: str) -> str:
        """The checkpoint files of a local ``prefix`` under ``sub``; its URL prefix."""
        for f in th.checkpoint_files(prefix):
            direct.put_file(str(f), f"{base}/{sub}/{f.name}")
        return f"s3://{base}/{sub}/{Path(prefix).name}"

    yield SimpleNamespace(url=f"s3://{base}", files=files, put=put, proxy=proxy, direct=direct)
    proxy.reset()
    s3_server.s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def sharded(tf_checkpoints):
    """Two data shards, written by a TF1 Saver over two devices."""
    return tf_checkpoints("tf1_sharded")
