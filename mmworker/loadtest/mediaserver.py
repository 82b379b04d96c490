"""The load test's HTTP media server: serves the corpus (and the video clips) on 127.0.0.1, in its own process.

    python -m mmworker.loadtest.mediaserver DIRECTORY PARENT_PID [VIDEO_DIRECTORY]

Prints the port on stdout when listening. `/NAME` is the file NAME of the directory; `/v/TAG/NAME`
is its variant TAG (mmworker.loadtest.variants), made here per request, so that URL sources are
distinct images without files of their own; `/videos/NAME` is the file NAME of VIDEO_DIRECTORY (the
video clips, sent as they are); 404 for anything else. Its own process, so serving
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
_VIDEO = re.compile(r"/videos/([^/?#]+)")


class _Handler(SimpleHTTPRequestHandler):
    variants: ClassVar[dict[str, Variants]] = {}  # by file name: the corpus is small, read once
    videos: ClassVar[dict[str, bytes]] = {}  # the clips by file name (a few MB), read once
    video_directory: ClassVar[Path | None] = None

    def log_message(self, format, *args):  # the load test's output is the report, not access logs
        pass

    def do_GET(self) -> None:
        video = _VIDEO.fullmatch(self.path)
        if video is not None:
            self._send_video(unquote(video[1]))
            return
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
        self._send(variants.bytes(tag))

    def _send_video(self, name: str) -> None:
        body = self.videos.get(name)
        if body is None and self.video_directory is not None and "/" not in name and name[:1] != ".":
            try:
                body = self.videos[name] = (self.video_directory / name).read_bytes()
            except OSError:
                body = None
        if body is None:
            self.send_error(404, "File not found")
            return
        self._send(body)

    def _send(self, body: bytes) -> None:
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
    if len(argv) > 3:
        _Handler.video_directory = Path(argv[3])
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
