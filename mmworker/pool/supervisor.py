"""Process supervision: starts the workers and the I/O process, takes their Hellos, notices ends and overruns, restarts.

Every child is a fresh interpreter (never a fork of the client) given its settings as JSON, all
of them: PoolConfig is the one place defaults live, so a child reads what it is given and never
restates one. A worker gets its spec with the family resolved to its class's import path
(`registry.worker_spec`), so a family registered in this process at run time reaches it too.

A worker that ended (its pidfd says so: one poll(2) for all of them) or whose request overran its
deadline (then it is killed: it may be hung or stopped) is replaced on the same core with a fresh
ring, and its request answered "worker crashed" or "deadline exceeded". Replies still viewing the
old ring keep it mapped until they are released. An I/O process that ended is replaced too, and
the requests it was fetching answered "worker crashed".
"""

import collections
import os
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ipc.peer_memory import places_of
from ipc.ring import RingReader
from ipc.segment import Segment
from ipc.wire import Hello
from mmworker.errors import MmError, Outcome
from mmworker.pool.dispatch import Dispatcher
from mmworker.pool.inflight import InFlight, Request, State
from mmworker.pool.slots import Leases, Slot

if TYPE_CHECKING:
    from mmworker.pool.cache import FeatureCache
    from mmworker.pool.config import CorePlan, PoolConfig
    from mmworker.pool.resources import PoolResources

COLD_STARTS_KEPT = 64  # stats keep the latest worker start-up times; a pool that runs for weeks must not grow
_FETCHING = (State.FETCHING, State.CANCELLED_FETCHING)


class Supervisor:
    """The pool's children: the worker slots (`slots`, by identity in `by_identity`) and the I/O process."""

    def __init__(self, resources: "PoolResources", config: "PoolConfig", plan: "CorePlan", spec: dict[str, Any],
                 inflight: InFlight, dispatcher: Dispatcher, leases: Leases,
                 cache: "FeatureCache | None") -> None:  # fmt: skip
        self._res = resources
        self._cache = cache
        self._config = config
        self._plan = plan
        self._spec = spec  # as workers get it (registry.worker_spec)
        self._inflight = inflight
        self._dispatcher = dispatcher
        self._leases = leases
        self.slots = [Slot(k, core) for k, core in enumerate(plan.workers)]
        self.by_identity: dict[bytes, Slot] = {}
        self.io_proc: subprocess.Popen | None = None
        self.io_ready = False
        self.restarts = 0
        self.cold_start_ms: collections.deque[float] = collections.deque(maxlen=COLD_STARTS_KEPT)
        # What each worker reads back at start-up to learn whether it can read this process's memory.
        self._probe = os.urandom(32) if config.inputs_in_place else None

    # --- start-up --------------------------------------------------------------------------------

    def start(self, receive: Callable[[], None]) -> None:
        """Start every child and wait for their Hellos, calling `receive` as messages arrive; MmError
        names a child that exited or the timeout (`start_timeout_s`)."""
        self.start_io()
        for slot in self.slots:
            self.start_worker(slot)
        timeout = self._config.start_timeout_s
        deadline = time.monotonic() + timeout
        while not (self.io_ready and all(s.ready for s in self.slots)):
            for slot in self.slots:
                if slot.proc.poll() is not None:
                    raise MmError(f"pool start-up: worker {slot.index} exited with code {slot.proc.returncode}")
            if self.io_proc.poll() is not None:
                raise MmError(f"pool start-up: the I/O process exited with code {self.io_proc.returncode}")
            if time.monotonic() > deadline:
                raise MmError(f"pool start-up: workers not ready within {timeout} s")
            self._res.router.poll(50)
            receive()

    def start_io(self) -> None:
        args = {"endpoint": self._res.router.endpoint, "parent": os.getpid(), "cores": list(self._plan.io),
                "nice": 0, "sched": "normal",  # fetching is not the workers' business: an ordinary task
                "concurrency": self._config.io_concurrency,
                "media": self._config.media_policy().to_mapping()}  # fmt: skip
        self.io_ready = False
        self.io_proc = self._res.spawn("mmworker.pool.iostage", args)

    def start_worker(self, slot: Slot) -> None:
        config, res = self._config, self._res
        slot.reset()  # replies still viewing the old ring keep that (read-only) mapping alive
        self.by_identity.pop(slot.identity, None)
        slot.identity = f"w{slot.index}.{slot.incarnation}".encode()
        self.by_identity[slot.identity] = slot
        slot.segment = res.new_segment(f"w{slot.index}", config.ring_mib << 20)
        inbox = res.new_inbox(slot.index)
        results_fd, requests_fd, inbox_fd = res.results.sender_fd, res.requests_fd, inbox.worker_fd
        pass_fds = [results_fd, requests_fd, inbox_fd]
        cache, claims = None, None
        if self._cache is not None:  # its partition, and the entries there a previous worker made
            cache_fd, heap, live = self._cache.claims(slot.index)
            claims = _claims_memory(live)
            cache = {"fd": cache_fd, "ring": heap, "claims_fd": claims[1] if claims else None}
            pass_fds += [cache_fd] + ([claims[1]] if claims else [])
        probe = None
        if self._probe is not None:
            _, [(address, _)] = places_of([self._probe])
            probe = [address, self._probe.hex()]
        args = {"inbox_fd": inbox_fd, "results_fd": results_fd, "requests_fd": requests_fd,
                "worker": slot.index, "incarnation": slot.incarnation,
                "ring": slot.segment.name, "cores": [slot.core] if slot.core is not None else None,
                "spec": self._spec, "parent": os.getpid(), "image_cpu_s": config.image_cpu_s,
                "video_cpu_s": config.video_cpu_s, "memory_wait_s": config.memory_wait_s,
                "nice": config.worker_nice, "sched": self._plan.worker_sched, "probe": probe,
                "cache": cache}  # fmt: skip
        slot.started = time.monotonic()
        try:
            slot.proc = res.spawn("mmworker.pool.worker", args, pass_fds=tuple(pass_fds))
        finally:
            if claims is not None:  # the worker has its own descriptor now
                claims[0].close()
                os.close(claims[1])
        inbox.handed_over()  # only the worker holds its end now: its exit shows as ChannelClosed

    def on_hello(self, slot: Slot, hello: Hello) -> None:
        """`slot`'s worker has mapped its ring and is ready for jobs."""
        slot.reader = RingReader(Segment.attach(slot.segment.name, writable=False), slot.index)
        slot.in_place = hello.reads_in_place  # only a worker given the probe can say so
        self._retire(slot)  # both sides have mapped it: from now on it cannot leak
        self.cold_start_ms.append((time.monotonic() - slot.started) * 1e3)
        self._dispatcher.worker_ready(slot)

    # --- while serving -----------------------------------------------------------------------------

    def check(self) -> None:
        """Replace the children that ended and the workers past their request's deadline; send the
        releases a busy worker's inbox had no room for before."""
        ended = self._res.any_ended()  # one syscall; process handles are asked only then
        now = time.monotonic()
        table = self._inflight.table
        for slot in self.slots:
            req = table.get(slot.rid) if slot.rid is not None else None
            if ended and slot.proc.poll() is not None:
                why = f"worker crashed (worker {slot.index}, exit code {slot.proc.returncode})"
                self._restart(slot, req, why, Outcome.WORKER_CRASHED)
            elif req is not None and now > req.deadline:
                slot.proc.kill()  # it may be hung or stopped: its ring and its job are abandoned
                slot.proc.wait()
                why = f"deadline exceeded ({self._config.deadline_s:g} s, worker {slot.index})"
                self._restart(slot, req, why, Outcome.DEADLINE_EXCEEDED)
            else:
                if slot.pending and slot.rid is not None:
                    self._leases.flush(slot)
                if self._cache is not None:
                    self._cache.flush(slot)
        if ended and self.io_proc.poll() is not None:
            why = f"I/O process crashed (exit code {self.io_proc.returncode})"
            for req in [r for r in table.values() if r.state in _FETCHING]:
                self._inflight.ended(req, why, Outcome.WORKER_CRASHED)
            self.restarts += 1
            self.start_io()

    def _restart(self, slot: Slot, req: Request | None, why: str, kind: Outcome) -> None:
        self._dispatcher.worker_gone(slot)
        if req is not None:
            self._inflight.ended(req, why, kind)
        self._retire(slot)  # if it died before mapping its ring, the name is still there
        self.restarts += 1
        self.start_worker(slot)

    def _retire(self, slot: Slot) -> None:
        """Unlink and unmap the creator's handle of a slot's ring; only the reader's mapping remains.

        Without this every restart would keep a full ring mapped (and its memory allocated) for good.
        """
        segment, slot.segment = slot.segment, None
        if segment is not None:
            self._res.retire(segment)

    def worker_pids(self) -> list[int]:
        return [s.proc.pid for s in self.slots if s.proc is not None]

    def close(self) -> None:
        """After the pool's resources are closed: drop the rings' read mappings (unmapped now, or
        when the last reply still viewing one lets go of it)."""
        for slot in self.slots:
            slot.reader = None


def _claims_memory(live: list[tuple[int, int, int]]) -> tuple[Segment, int] | None:
    """The (offset, nbytes, seq) of a partition's live entries as int64 triples in a nameless
    segment, for a new worker to map (it may hold more than fits its command line); None if none."""
    if not live:
        return None
    segment, fd = Segment.anonymous("claims", len(live) * 24)
    try:
        np.frombuffer(segment.buffer, np.int64, len(live) * 3)[:] = np.asarray(live, np.int64).reshape(-1)
    except BaseException:
        segment.close()
        os.close(fd)
        raise
    return segment, fd
