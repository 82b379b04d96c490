"""The I/O process: resolves a request's URLs and file paths before it reaches a CPU worker.

Started by the pool as `python -m mmworker.pool.iostage '<json>'` with {"endpoint", "parent",
"cores", "nice", "sched", "concurrency", "media"}, every one given (the defaults live in
PoolConfig only). One thread, libcurl's multi interface: every transfer of every request runs at
once up to a global cap (`io_concurrency`), so a request's images download concurrently and a slow
host or a hung mount never occupies a CPU worker. It serves until the pool ends it (SIGTERM) or
its parent dies.

    C -> IO  Job(rid, args={"sources": [str, ...], "indices": [int, ...], "budget": int,
                            "caps": [int, ...], "images": int})    ("caps", "images" optional)
    IO -> C  Done(rid, frames=n, meta={}) with the n sources' bytes in order, or Failed(rid, reason, kind)

"indices" gives each source's index among the request's items and "images" how many of those items
are images (absent: all), for messages ("image k", "video k"); "budget" the bytes
these sources may pull in together, "caps" each source's per-stream byte cap (absent or null: every
source MAX_FETCH_BYTES; a video's is MAX_VIDEO_FETCH_BYTES). A job of another shape (a list not as
long as "sources", an entry of another type, a negative budget or image count, a cap outside 1 ..
2**63 - 1) is
answered Failed(rid, "malformed I/O job", kind "internal") and nothing of it is fetched.

Every URL and path passes the pool's media policy (mmworker.common.policy: schemes, domains,
resolved addresses on every connection, local roots). Each request's sources share one ByteBudget
(what the client could not already charge to raw bytes), each stream has its cap, REQUEST_TIMEOUT
bounds each transfer (all inside mmworker.common.http / fetch). If several sources fail, the lowest
index is reported, as the inline driver would.
"""

import collections
import logging
import os
import sys

import pycurl
import zmq

from ipc.channels import Dealer, new_context
from ipc.wire import WIRE_VERSION, Done, Failed, Hello, Job
from mmworker.common.budget import MAX_FETCH_BYTES, ByteBudget, check_cap
from mmworker.common.fetch import REMOTE_PREFIXES, fetch_bytes
from mmworker.common.http import Transfer, timeout_from_env
from mmworker.common.policy import MediaPolicy
from mmworker.errors import MmError, Outcome, item_name
from mmworker.pool.child import run_child
from mmworker.pool.protocol import IO_IDENTITY

log = logging.getLogger("mmworker.io")


class _Request:
    __slots__ = ("budget", "caps", "errors", "images", "indices", "pending", "results", "rid")

    def __init__(self, rid: int, indices: list[int], budget: int, caps: list[int], images: int | None) -> None:
        n = len(indices)
        self.rid = rid
        self.indices = indices  # each source's index among the request's items, for messages
        self.images = images  # how many of the request's items are images (None: all)
        self.caps = caps  # each source's per-stream byte cap
        self.budget = ByteBudget(budget)
        self.results: list[bytes | None] = [None] * n
        self.errors: dict[int, MmError] = {}
        self.pending = n


class IoStage:
    def __init__(self, args: dict) -> None:
        self.context = new_context()
        self.channel = Dealer(self.context, args["endpoint"], IO_IDENTITY)
        self.concurrency = int(args["concurrency"])
        self.multi = pycurl.CurlMulti()
        self.active: dict[pycurl.Curl, tuple[_Request, int, Transfer]] = {}
        self.waiting: collections.deque[tuple[_Request, int, str]] = collections.deque()
        self.timeout_s = timeout_from_env()
        self.policy = MediaPolicy.from_mapping(args["media"])
        self.channel.send(Hello(WIRE_VERSION, -1, os.getpid(), -1, "", 0))

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.channel.sock, zmq.POLLIN)
        registered: set[int] = set()
        while True:
            for fd in registered:
                poller.unregister(fd)
            reads, writes, errors = self.multi.fdset()
            registered = set(reads) | set(writes) | set(errors)
            for fd in registered:
                flags = (zmq.POLLIN if fd in reads else 0) | (zmq.POLLOUT if fd in writes else 0)
                poller.register(fd, flags or zmq.POLLERR)
            wait = self.multi.timeout()
            if wait < 0:
                wait = 100 if self.active else -1
            events = dict(poller.poll(wait))
            if self.channel.sock in events:
                while (got := self.channel.recv(0)) is not None:
                    self._on_message(got[0])
            self._drive()

    def _on_message(self, message) -> None:
        if isinstance(message, Job):
            sources = message.args.get("sources") or []
            indices = message.args.get("indices") or []
            budget = message.args.get("budget", 0)
            caps = message.args.get("caps")  # absent (or null): every source has the default cap
            images = message.args.get("images")  # absent (or null): every item is an image
            if (
                not isinstance(sources, list)
                or not all(isinstance(s, str) for s in sources)
                or not isinstance(indices, list)
                or len(indices) != len(sources)
                or not all(isinstance(i, int) for i in indices)
                or not isinstance(budget, int)
                or budget < 0  # ByteBudget would raise here, ending this process
                or not (caps is None or _valid_caps(caps, len(sources)))
                or not (images is None or (type(images) is int and images >= 0))
            ):
                self.channel.send(Failed(message.rid, "malformed I/O job", kind=Outcome.INTERNAL.value))
                return
            request = _Request(message.rid, indices, budget, caps or [MAX_FETCH_BYTES] * len(sources), images)
            for index, source in enumerate(sources):
                if source.startswith(REMOTE_PREFIXES):  # downloads run concurrently; files are read now
                    self.waiting.append((request, index, source))
                else:
                    self._resolve_now(request, index, source)
            self._finish_if_done(request)

    def _resolve_now(self, request: _Request, index: int, source: str) -> None:
        # Local files: a blocking read here, never on a CPU worker (bounded by the budget and the cap).
        try:
            request.results[index] = fetch_bytes(source, request.budget, policy=self.policy, cap=request.caps[index])
        except MmError as exc:
            request.errors[index] = exc
        request.pending -= 1

    def _drive(self) -> None:
        while self.waiting and len(self.active) < self.concurrency:
            request, index, url = self.waiting.popleft()
            if request.errors:  # it has failed already: do not start more of its transfers
                request.pending -= 1
                self._finish_if_done(request)
                continue
            try:
                transfer = Transfer(url, request.budget, self.timeout_s, self.policy, cap=request.caps[index])
            except MmError as exc:
                request.errors[index] = exc
                request.pending -= 1
                self._finish_if_done(request)
                continue
            self.active[transfer.curl] = (request, index, transfer)
            self.multi.add_handle(transfer.curl)
        while True:
            status, _ = self.multi.perform()
            if status != pycurl.E_CALL_MULTI_PERFORM:
                break
        while True:
            queued, ok, failed = self.multi.info_read()
            for curl in ok:
                self._complete(curl, None)
            for curl, code, message in failed:
                self._complete(curl, pycurl.error(code, message))
            if not queued:
                break

    def _complete(self, curl: pycurl.Curl, err: pycurl.error | None) -> None:
        request, index, transfer = self.active.pop(curl)
        self.multi.remove_handle(curl)
        try:
            request.results[index] = transfer.finish(err)
        except MmError as exc:
            request.errors[index] = exc
        request.pending -= 1
        self._finish_if_done(request)

    def _finish_if_done(self, request: _Request) -> None:
        if request.pending:
            return
        if request.errors:
            index = min(request.errors)
            error = request.errors[index]
            item = request.indices[index]
            what = item_name(item, item + 1 if request.images is None else request.images)
            self.channel.send(Failed(request.rid, f"{what}: {error}", kind=error.kind.value))
        else:
            self.channel.send(Done(request.rid, {}, {}, frames=len(request.results)), tuple(request.results))

    def close(self) -> None:
        for curl, (_, _, transfer) in list(self.active.items()):
            self.multi.remove_handle(curl)
            transfer.abandon()
        self.multi.close()
        self.channel.close()
        self.context.term()


def _valid_caps(caps: object, n: int) -> bool:
    """Whether a job's "caps" gives each of its `n` sources a cap the fetch accepts (check_cap)."""
    if not isinstance(caps, list) or len(caps) != n:
        return False
    try:
        for cap in caps:
            check_cap(cap)
    except MmError:
        return False
    return True


def main(argv: list[str]) -> int:
    return run_child(argv, "io", IoStage)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
