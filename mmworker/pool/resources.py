"""The OS resources of one pool (child processes, sockets, shared-memory segments, its runtime
directory): the one place that creates them and the one teardown that destroys them all.

Only the process that created them tears them down. A process that forks (SGLang's
ProcessPoolExecutor workers, with the fork start method) gives its child a copy of this object,
whose teardown (at the child's exit, or when its copy of the pool is collected) would otherwise
signal the parent's workers, unlink the parent's segments still linked and remove its socket
directory. In the child it does nothing: its copies of descriptors and mappings go with it.
"""

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from ipc.channels import Router, RuntimeDir, new_context
from ipc.inbox import Inbox
from ipc.results import ResultsChannel
from ipc.ring import RingWriter
from ipc.segment import Segment, new_name, sweep_stale
from mmworker.pool.drops import Drops
from mmworker.pool.protocol import REQUEST_RING
from mmworker.runtime import tuned_environ

log = logging.getLogger("mmworker.pool")

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_STOP_GRACE_S = 2.0


class PoolResources:
    """Everything a pool holds from the OS, closable from a finalizer (it holds no reference to the pool).

    `open` creates the channels and the request ring; `spawn`, `new_segment` and `new_inbox` create
    the rest as the pool needs it. `close` (idempotent) stops every child and removes everything,
    also after an `open` that failed half-way.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()  # the creator: the only process whose teardown touches anything
        self.rundir: RuntimeDir | None = None
        self.context = None
        self.router: Router | None = None
        self.results: ResultsChannel | None = None
        self.inboxes: dict[int, Inbox] = {}  # per worker slot; replaced when its worker is
        self.wake: select.epoll | None = None  # its fd is readable when the router, the results or the drops are
        self.drops: Drops | None = None  # releases posted by finalizers (mmworker.pool.drops)
        self.pidfds: dict[subprocess.Popen, int] = {}  # every live child -> an fd readable once it has ended
        self.exits = select.poll()  # over the pidfds
        self.segments: list[Segment] = []
        self.anonymous: list[tuple[Segment, int]] = []  # nameless segments and their descriptors (the cache's)
        self.requests: RingWriter | None = None  # the request ring (its segment is in `segments`)
        self.requests_fd: int | None = None  # its read-only descriptor, inherited by every worker
        self.closed = False

    def open(self, request_ring_bytes: int) -> None:
        """The runtime directory, the ZeroMQ router (for the I/O process), the results channel, the
        drops' eventfd, the wake-up fd over those three, and the request ring, which workers map
        through an inherited descriptor; first, the segments and runtime directories that pools
        killed before their teardown left."""
        removed = sweep_stale()
        if removed:
            log.warning("removed %d shared-memory segment(s) left by dead pools", len(removed))
        removed = RuntimeDir.sweep_stale()
        if removed:
            log.warning("removed %d socket directory(ies) left by dead pools", len(removed))
        self.rundir = RuntimeDir()
        self.context = new_context()
        self.router = Router(self.context, self.rundir.endpoint("work"))
        self.results = ResultsChannel()
        self.router.watch(self.results.fileno())
        self.drops = Drops()
        self.wake = select.epoll()
        self.wake.register(self.router.fileno(), select.EPOLLIN)
        self.wake.register(self.results.fileno(), select.EPOLLIN)
        self.wake.register(self.drops.fileno(), select.EPOLLIN)
        requests = self.new_segment("req", request_ring_bytes)
        self.requests_fd = requests.reader_fd()
        requests.unlink()  # workers map the inherited descriptor: the name is not needed
        self.requests = RingWriter(requests, REQUEST_RING)

    def spawn(self, module: str, args: dict, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
        """Exec a fresh interpreter for a child (never a fork of this process); it pins itself."""
        env = tuned_environ()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        command = [sys.executable, "-m", module, json.dumps(args)]
        # Its own process group: a terminal's Ctrl-C (SIGINT to the foreground group) must reach
        # only the embedding process, which decides when children stop; they die with it anyway.
        proc = subprocess.Popen(command, env=env, close_fds=True, pass_fds=pass_fds, process_group=0)
        # Reaped children (replaced after a crash) are dropped, so restarts do not pile up Popen objects.
        for gone in [p for p in self.pidfds if p.returncode is not None]:
            fd = self.pidfds.pop(gone)
            self.exits.unregister(fd)
            os.close(fd)
        # Not reaped yet, so the pid cannot have been reused.
        self.pidfds[proc] = os.pidfd_open(proc.pid)
        self.exits.register(self.pidfds[proc], select.POLLIN)
        return proc

    def any_ended(self) -> bool:
        """Whether a child has ended since it was last reaped: one poll(2) over the pidfds."""
        return bool(self.exits.poll(0))

    def new_segment(self, prefix: str, nbytes: int) -> Segment:
        segment = Segment.create(new_name(prefix), nbytes)
        self.segments.append(segment)
        return segment

    def new_anonymous(self, tag: str, nbytes: int) -> tuple[Segment, int]:
        """A nameless segment (memfd) kept for the pool's life, and its descriptor for children to inherit."""
        segment, fd = Segment.anonymous(tag, nbytes)
        self.anonymous.append((segment, fd))
        return segment, fd

    def retire(self, segment: Segment) -> None:
        """Unlink and unmap a segment now; mappings made elsewhere (a reader's, a worker's) stay."""
        segment.unlink()
        segment.close()
        self.segments.remove(segment)

    def new_inbox(self, index: int) -> Inbox:
        """A fresh inbox for worker slot `index`, closing the one its previous worker had."""
        old = self.inboxes.pop(index, None)
        if old is not None:
            old.close()
        inbox = self.inboxes[index] = Inbox()
        return inbox

    def forked(self) -> bool:
        """Whether this is a forked child's copy (then nothing here is this process's to touch)."""
        return os.getpid() != self.pid

    def close(self) -> None:
        """Stop every child and remove everything (idempotent); in a forked child's copy, nothing."""
        if self.closed:
            return
        self.closed = True
        if self.forked():
            return
        for proc in self.pidfds:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        for proc in self.pidfds:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for fd in self.pidfds.values():
            os.close(fd)
        self.pidfds.clear()
        if self.wake is not None:
            self.wake.close()
        if self.drops is not None:
            self.drops.close()
        for inbox in self.inboxes.values():
            inbox.close()
        if self.results is not None:
            self.results.close()
        if self.router is not None:
            self.router.close()
        if self.context is not None:
            self.context.term()
        if self.requests_fd is not None:
            os.close(self.requests_fd)
        self.requests = None  # its array views the segment's memory, which close() then unmaps
        for segment in self.segments:
            segment.unlink()  # idempotent: a retired ring is unlinked already
            segment.close()
        for segment, fd in self.anonymous:
            os.close(fd)
            segment.close()  # or, while its owner's views or replies still view it, once they are gone
        self.anonymous.clear()
        if self.rundir is not None:
            self.rundir.close()
