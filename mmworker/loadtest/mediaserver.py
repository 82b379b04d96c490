"""The load test's HTTP media server: serves one directory on 127.0.0.1, in its own process.

    python -m mmworker.loadtest.mediaserver DIRECTORY PARENT_PID

Prints the port on stdout when listening; 404 for anything else. Its own process, so serving
images never competes with the load generator for the GIL.
"""

import sys
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

from ipc.lifeline import die_with_parent


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # the load test's output is the report, not access logs
        pass


def main(argv: list[str]) -> int:
    die_with_parent(int(argv[2]))
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=argv[1]))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
