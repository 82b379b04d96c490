"""Test helper: a real HTTP origin server and a tiny forward proxy, both on 127.0.0.1, port 0.

Each runs a ThreadingHTTPServer in its own thread. Handler threads are non-daemon and tracked, so
`stop()` joins every thread it started (server_close() reaps handler threads); slow handlers wait on
a stop event and end as soon as the server stops. `wait_idle()` waits until every accepted connection
has been closed, so fd counts taken afterwards are not racing a handler that is still finishing.
`MediaServer.wait_received(path)` waits until a request for `path` has arrived, so a test can act
while a client is known to be waiting on it (a slow route) instead of sleeping a guessed time.

Origin routes (all responses carry ``Connection: close``):

    /bytes/<n>          n bytes of `pattern(n)` with Content-Length (counted in `body_bytes_sent`)
    /chunked/<n>        the same, Transfer-Encoding: chunked (no Content-Length)
    /gzip/<n>           gzip of pattern(n), Content-Encoding: gzip
    /gzip-bomb/<n>      gzip of n zero bytes, compressed on the fly (never held uncompressed)
    /status/<code>      that status with a short body
    /blob/<name>        bytes published with MediaServer.put(name, data)
    /redirect/<n>       302 to /redirect/<n-1>; /redirect/0 answers b"landed"
    /redirect-to?url=u  302 to u
    /slow/<seconds>     waits, then answers b"late" (gives up early if the client hangs up)

The proxy serves only absolute-URI GETs (``GET http://host:port/path``), records each URI in
`proxy.requests`, forwards to the origin and relays status, selected headers and body.
"""

import contextlib
import functools
import http.client
import select
import socket
import threading
import time
import urllib.parse
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_BLOCK = bytes(range(256)) * 4096  # 1 MiB; bodies are slices of repeats of it


def pattern(n: int) -> bytes:
    """The body /bytes/<n> and /chunked/<n> serve (built in memory only by tests that compare it)."""
    reps, rest = divmod(n, len(_BLOCK))
    return _BLOCK * reps + _BLOCK[:rest]


def _pattern_blocks(n: int, size: int = 64 << 10):
    """pattern(n) as successive blocks, so a 64 MiB body is streamed without being built."""
    sent = 0
    while sent < n:
        start = sent % len(_BLOCK)
        take = min(size, n - sent, len(_BLOCK) - start)
        yield _BLOCK[start : start + take]
        sent += take


@functools.lru_cache(maxsize=4)
def gzip_of_zeros(n: int) -> bytes:
    """gzip stream of n zero bytes, compressed 1 MiB at a time (64 MiB of zeros → ~64 KiB)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    parts = []
    left = n
    while left:
        take = min(left, len(zeros))
        parts.append(comp.compress(zeros[:take]))
        left -= take
    parts.append(comp.flush())
    return b"".join(parts)


class _TrackingServer(ThreadingHTTPServer):
    daemon_threads = False  # handler threads are joined by server_close(), never abandoned
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.stopping = threading.Event()
        self._idle = threading.Condition()
        self._active = 0
        self.body_bytes_sent = 0  # /bytes body bytes the handler managed to write
        self.received: list[str] = []  # the paths of the GETs that arrived, in order

    def process_request(self, request, client_address):
        with self._idle:
            self._active += 1
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        try:
            super().shutdown_request(request)
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def count_sent(self, n: int) -> None:
        with self._idle:
            self.body_bytes_sent += n

    def note_received(self, path: str) -> None:
        with self._idle:
            self.received.append(path)
            self._idle.notify_all()

    def wait_received(self, path: str, timeout: float) -> None:
        with self._idle:
            if not self._idle.wait_for(lambda: path in self.received, timeout):
                raise TimeoutError(f"test HTTP server: no request for {path} within {timeout} s (got {self.received})")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _TrackingServer

    def log_message(self, format, *args):  # keep pytest output clean
        pass

    def handle(self):
        # The client aborting a transfer (our cap, a timeout) is expected; it must not print tracebacks.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    def _head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _body(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self._head(status, {"Content-Length": str(len(body)), **(headers or {})})
        self.wfile.write(body)


class _OriginHandler(_Handler):
    def do_GET(self):
        self.server.note_received(self.path)
        parsed = urllib.parse.urlsplit(self.path)
        parts = parsed.path.strip("/").split("/")
        route, arg = parts[0], parts[1] if len(parts) > 1 else ""
        if route == "bytes":
            n = int(arg)
            self._head(200, {"Content-Length": str(n)})
            for block in _pattern_blocks(n):
                self.wfile.write(block)
                self.server.count_sent(len(block))
        elif route == "chunked":
            self._head(200, {"Transfer-Encoding": "chunked"})
            for block in _pattern_blocks(int(arg)):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
            self.wfile.write(b"0\r\n\r\n")
        elif route == "gzip":
            self._body(200, zlib.compress(pattern(int(arg)), wbits=31), {"Content-Encoding": "gzip"})
        elif route == "gzip-bomb":
            self._body(200, gzip_of_zeros(int(arg)), {"Content-Encoding": "gzip"})
        elif route == "status":
            self._body(int(arg), b"error page\n")
        elif route == "redirect":
            n = int(arg)
            if n > 0:
                self._body(302, b"", {"Location": f"/redirect/{n - 1}"})
            else:
                self._body(200, b"landed")
        elif route == "redirect-to":
            target = urllib.parse.parse_qs(parsed.query)["url"][0]
            self._body(302, b"", {"Location": target})
        elif route == "blob":
            body = self.server.blobs.get(arg)
            self._body(200, body) if body is not None else self._body(404, b"no such blob\n")
        elif route == "slow":
            if self._wait_unless_abandoned(float(arg)):
                self._body(200, b"late")
        else:
            self._body(404, b"no such route\n")

    def _wait_unless_abandoned(self, seconds: float) -> bool:
        """Sleep up to `seconds`; False as soon as the client hangs up or the server stops."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.server.stopping.wait(min(0.02, max(0.0, deadline - time.monotonic()))):
                return False
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable and not self.connection.recv(1, socket.MSG_PEEK):
                return False  # EOF: the client gave up (timed out)
        return True


class _ProxyHandler(_Handler):
    server: "_ProxyServer"

    def do_GET(self):
        if not self.path.startswith("http://"):
            self._body(400, b"not a proxy request\n")
            return
        with self.server.lock:
            self.server.requests.append(self.path)
        target = urllib.parse.urlsplit(self.path)
        conn = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=10)
        try:
            conn.request("GET", urllib.parse.urlunsplit(("", "", target.path or "/", target.query, "")))
            resp = conn.getresponse()
            body = resp.read()
            relay = {k: v for k, v in resp.getheaders() if k.lower() in ("location", "content-encoding")}
            self._body(resp.status, body, {**relay, "Via": "1.1 test-proxy"})
        finally:
            conn.close()


class _ProxyServer(_TrackingServer):
    def __init__(self) -> None:
        super().__init__(_ProxyHandler)
        self.lock = threading.Lock()
        self.requests: list[str] = []


class RunningServer:
    """Start/stop plumbing shared by the origin and the proxy."""

    def __init__(self, server: _TrackingServer) -> None:
        self.server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"httpserver-{self.port}"
        )
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_idle(self, timeout: float = 5.0) -> None:
        if not self.server.wait_idle(timeout):
            raise TimeoutError("test HTTP server still has open connections")

    def stop(self) -> None:
        self.server.stopping.set()
        self.server.shutdown()
        self.server.server_close()  # joins the handler threads
        self._thread.join(5.0)
        if self._thread.is_alive():
            raise RuntimeError("test HTTP server thread did not stop")


class MediaServer(RunningServer):
    """The origin server (routes in the module docstring); `put` publishes bytes at /blob/<name>."""

    def __init__(self) -> None:
        super().__init__(_TrackingServer(_OriginHandler))
        self.server.blobs = {}

    def put(self, name: str, data: bytes) -> str:
        self.server.blobs[name] = data
        return self.url(f"/blob/{name}")

    def wait_received(self, path: str, timeout: float = 10.0) -> None:
        """Return once a GET for `path` (as sent: path and query) has arrived; its handler may still
        be running. TimeoutError, naming what did arrive, if none has within `timeout`."""
        self.server.wait_received(path, timeout)


class ForwardProxy(RunningServer):
    """The forward proxy; `requests` lists the absolute URIs it served, in order."""

    def __init__(self) -> None:
        super().__init__(_ProxyServer())

    @property
    def requests(self) -> list[str]:
        with self.server.lock:
            return list(self.server.requests)


class SilentListener:
    """A listening TCP socket on 127.0.0.1 that never answers; `was_contacted()` tells if anyone connected."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def was_contacted(self) -> bool:
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    def close(self) -> None:
        self.sock.close()
