"""The load test's HTTP media server: serves one directory on 127.0.0.1, in its own process.

    python -m mmworker.loadtest.mediaserver DIRECTORY PARENT_PID

Prints the port on stdout when listening. `/NAME` is the file NAME of the directory; `/v/TAG/NAME`
is its variant TAG (mmworker.loadtest.variants), made here per request, so that URL sources are
distinct images without files of their own; 404 for anything else. Its own process, so serving
images never competes with the load generator for the GIL.
"""

import re
import sys
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote

from ipc.lifeline import die_with_parent
from mmworker.common.decode import sniff_format
from mmworker.errors import MmError
from mmworker.loadtest.variants import Variants

_VARIANT = re.compile(r"/v/(\d+)/([^/?#]+)")


class _Handler(SimpleHTTPRequestHandler):
    variants: ClassVar[dict[str, Variants]] = {}  # by file name: the corpus is small, read once

    def log_message(self, format, *args):  # the load test's output is the report, not access logs
        pass

    def do_GET(self) -> None:
        match = _VARIANT.fullmatch(self.path)
        if match is None:
            super().do_GET()
            return
        tag, name = int(match[1]), unquote(match[2])
        variants = self.variants.get(name)
        if variants is None:
            try:
                data = (Path(self.directory) / name).read_bytes() if "/" not in name and name[:1] != "." else None
                variants = Variants(data, sniff_format(data)) if data else None
            except (OSError, MmError, ValueError):
                variants = None
            if variants is None:
                self.send_error(404, "File not found")
                return
            self.variants[name] = variants
        body = variants.bytes(tag)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    # The pool's I/O process opens up to io_concurrency connections at once; socketserver's default
    # backlog of 5 drops the SYNs beyond it, which cost a second each (TCP's first retransmission).
    request_queue_size = 128


def main(argv: list[str]) -> int:
    die_with_parent(int(argv[2]))
    server = _Server(("127.0.0.1", 0), partial(_Handler, directory=argv[1]))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
