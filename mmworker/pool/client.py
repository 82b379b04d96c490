"""WorkerPool: the client embedded in the scheduler process; owns the workers, the I/O process and their rings.

    caller --submit--> [queue] --(URLs / files)--> I/O process --bytes--> [queue]
                         |                                                  |
                         '------------- dispatch to an idle worker <--------'
                                               |
                      worker k (pinned, ring k) -- Done(descriptors) --> Reply(views into ring k)
                                                       (results channel)
    caller <--poll-- replies in submission order (or completion order), one per request

The pool does nothing on its own thread (it has none): every step happens inside `poll()` (and
`process()`/`aprocess()`, which call it): receive messages, notice dead workers (process handles)
and overdue requests (deadlines), restart workers, dispatch queued requests to idle workers, hand
out finished replies. A caller should call `poll()` at least every ~100 ms while requests are in
flight; `fileno()` becomes readable when a message arrives.

Channels: jobs and releases go to each worker through its inbox (ipc.inbox), and its Hello and
answers come back on the results channel (ipc.results): socket pairs this thread writes and reads
itself, with no libzmq thread in between; the I/O process's traffic goes through ZeroMQ
(ipc.channels). No image byte crosses a socket: the Job carries where a job's input bytes
(input_ids, images) are, and the worker copies them straight out of this process's memory
(ipc.peer_memory: no per-byte work here) where the kernel lets it, which each worker checks on a
probe at start-up (`inputs_in_place`). Elsewhere they are copied once into this process's request
ring, which every worker maps read-only, and a job whose inputs do not fit there now gets a
one-off nameless segment (memfd) of its own instead, whose descriptor travels with the Job and
which ends with the worker's mapping. Either way they stay where they are, unchanged, until the
job's answer arrives (or its worker is gone).

Exactly one reply per request, whatever happens: rejected at submit ("queue full", budgets), by a
worker (its MmError), by the I/O process (fetch errors), "worker crashed", "deadline exceeded",
"aborted" (cancel) or "pool closed", each with its kind (`Reply.kind`, mmworker.errors.Outcome):
the worker's and the I/O process's come with their Failed message, the pool sets its own. A
worker that crashed or overran is replaced on the same core with a fresh ring; replies still
holding views into the old ring keep it mapped until released.

Memory: an accepted reply holds its worker's ring (a lease) until `release()`, or, after
`release_on_drop()`, until nothing sees its arrays (mmworker.pool.drops). Rings are FIFO, so one
reply held long stops the reuse of everything after it: a worker that finds its ring full waits
`memory_wait_s` for releases, then fails the job with kind MEMORY_FULL, and the pool adds to its
message what only this side knows: how many of that worker's replies are held and since when.

asyncio: `aprocess` goes through one driver per event loop (mmworker.pool.aio): one reader on
`fileno()`, one future per request, each reply delivered to its future as it is given.

Ownership: every OS resource (processes, sockets, segments, the runtime directory) belongs to one
`PoolResources` object (mmworker.pool.resources), closed by `close()`, by garbage collection or at interpreter exit.
"""

import asyncio
import collections
import itertools
import logging
import os
import subprocess
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ipc.errors import ChannelClosed, IpcError
from ipc.peer_memory import places_of
from ipc.ring import RingReader
from ipc.segment import Segment
from ipc.wire import Done, Failed, Hello, Job, Release
from mmworker.errors import MmError, Outcome
from mmworker.pool.aio import PoolDriver
from mmworker.pool.answers import Answers
from mmworker.pool.config import PoolConfig
from mmworker.pool.inputs import Held, InputStaging, RequestInputs, check_inputs, override_hashes
from mmworker.pool.protocol import IO_IDENTITY
from mmworker.pool.reply import Reply, ReplyItem
from mmworker.pool.resources import PoolResources
from mmworker.registry import pipeline_from_spec, spec_mapping

log = logging.getLogger("mmworker.pool")

_COLD_STARTS_KEPT = 64  # stats keep the latest worker start-up times; a pool that runs for weeks must not grow
# How often poll() looks for ended children (one poll(2) over their pidfds; waitpid only when one
# ended) and overdue requests: often enough that a crash is answered within a few ms.
_CHECK_INTERVAL_S = 0.01
# Releases per inbox record (a Job's or a Release's): ~20 bytes each, well inside ipc.records.MAX_RECORD_BYTES.
_RELEASES_PER_RECORD = 1024
# Where a wake-up found something: the router's socket, the results channel, the drops' eventfd
# (releases posted by finalizers, applied whenever there are any; the bit says to reset the fd).
_FROM_ROUTER, _FROM_RESULTS, _FROM_DROPS = 1, 2, 4
_FROM_ANY = _FROM_ROUTER | _FROM_RESULTS
_OUTCOMES = {outcome.value: outcome for outcome in Outcome}  # a Failed's kind, as it travels


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of the pool's counters."""

    workers: int
    workers_ready: int
    restarts: int
    submitted: int
    accepted: int
    rejected: int
    in_flight: int
    queued: int
    cold_start_ms: tuple[float, ...]  # the latest 64 worker start-up times, oldest first
    shm_held_bytes: int
    shm_peak_held_bytes: int
    request_ring_used_bytes: int  # the request ring's space held by the inputs of running jobs
    workers_reading_in_place: int  # ready workers that read job inputs straight from this process's memory


class _Slot:
    """One worker position (a core); its process and ring change when it is restarted."""

    __slots__ = ("core", "holds", "identity", "in_place", "incarnation", "index", "inputs", "pending", "proc",
                 "reader", "rid", "segment", "started")  # fmt: skip

    def __init__(self, index: int, core: int | None) -> None:
        self.index, self.core = index, core
        self.incarnation = 0
        self.proc: subprocess.Popen | None = None
        self.segment: Segment | None = None
        self.reader: RingReader | None = None
        self.identity = b""
        self.rid: int | None = None
        self.started = 0.0
        self.pending: list[tuple[int, int]] = []  # released allocations not yet sent (see WorkerPool._release)
        # Its running job's inputs: their request-ring allocation, or the exports that keep them in place.
        self.inputs: Held = None
        self.in_place = False  # it reads job inputs from this process's memory (its Hello said so)
        self.holds: dict[int, _Lease] = {}  # rid -> the lease of each unreleased reply of this incarnation

    @property
    def ready(self) -> bool:
        """Its worker said Hello and its ring is mapped here (reset when the worker is restarted)."""
        return self.reader is not None


class _Lease:
    """An accepted reply's hold on its worker's ring: which allocations, how many bytes, since when
    the caller has it, and how it ends (`Reply.release` / `Reply.release_on_drop` call these)."""

    __slots__ = ("allocations", "handed_out", "incarnation", "nbytes", "pool", "rid", "slot")

    def __init__(self, pool: "WorkerPool", slot: _Slot, rid: int, allocations: list[tuple[int, int]],
                 nbytes: int) -> None:  # fmt: skip
        self.pool, self.slot, self.rid = pool, slot, rid
        self.incarnation = slot.incarnation
        self.allocations, self.nbytes = allocations, nbytes
        self.handed_out = 0.0  # set by Answers when the caller gets the reply

    def release(self) -> None:
        self.pool._end_lease(self)

    def release_on_drop(self, views: list[np.ndarray]) -> None:
        self.pool._end_lease_on_drop(self, views)


class _Request:
    __slots__ = ("cancelled", "deadline", "dispatched", "inputs", "request_id", "rid", "state", "submitted")

    def __init__(self, rid: int, request_id: Any, submitted: float) -> None:
        self.rid, self.request_id, self.submitted = rid, request_id, submitted
        self.state = "new"
        self.cancelled = False
        self.inputs: RequestInputs | None = None  # once checked
        self.deadline = 0.0
        self.dispatched = 0.0


class WorkerPool:
    """Preprocess requests on pinned worker processes; see the module docstring.

    `spec`: a bundled name ("qwen2_vl", ...), a mapping or a JSON string (SGLang's qwen_vl spec).
    `config`: a PoolConfig, a mapping or a TOML path (mmworker.pool.config).
    """

    def __init__(self, spec: Mapping[str, Any] | str, config: PoolConfig | Mapping[str, Any] | str | None = None):
        spec = spec_mapping(spec)
        self.family = pipeline_from_spec(spec)  # a bad spec fails here, before any process starts
        names = {"im_token_id": "image_token_id", "im_start_id": "vision_start_token_id",
                 "im_end_id": "vision_end_token_id", "video_token_id": "video_token_id"}  # fmt: skip
        self._token_ids = {key: getattr(self.family.spec, attr) for key, attr in names.items()
                           if getattr(self.family.spec, attr, None) is not None}  # fmt: skip
        self._spec = spec
        self.config = PoolConfig.from_any(config)
        self.plan = self.config.plan()
        self._res = PoolResources()
        # asyncio drivers, one per event loop (mmworker.pool.aio); they hold this pool weakly, so
        # the finalizer, which must not reference the pool, can take their readers off the loops.
        self._drivers: dict[asyncio.AbstractEventLoop, PoolDriver] = {}
        self._finalizer = weakref.finalize(self, _teardown, self._res, self._drivers)
        self._rids = itertools.count(1)
        self._auto_ids = itertools.count(1)
        self._requests: dict[int, _Request] = {}
        self._queue: collections.deque[_Request] = collections.deque()
        self._idle: collections.OrderedDict[int, _Slot] = collections.OrderedDict()  # longest idle first
        self._answers = Answers(self.config.ordered)
        self._staging = InputStaging(self._res)
        self._stats = dict(submitted=0, accepted=0, rejected=0, restarts=0)
        self._cold_start: collections.deque[float] = collections.deque(maxlen=_COLD_STARTS_KEPT)
        self._io_ready = False
        self._io_proc: subprocess.Popen | None = None
        self._next_check = 0.0
        self._deadline_ms = int(self.config.deadline_s * 1000)
        self._held_bytes = 0  # shared memory held by replies not yet released
        self._peak_held_bytes = 0
        self._dropping: dict[int, _Lease] = {}  # rid -> the lease of a reply released on drop, until then
        # What each worker reads back at start-up to learn whether it can read this process's memory.
        self._probe = os.urandom(32) if self.config.inputs_in_place else None
        try:
            self._start()
        except IpcError as exc:  # e.g. /dev/shm too small for the rings: a start-up failure, said clearly
            self.close()
            raise MmError(f"pool start-up: {exc}") from exc
        except BaseException:
            self.close()
            raise

    # --- start-up ------------------------------------------------------------------------------

    def _start(self) -> None:
        res = self._res
        res.open(self.config.request_ring_mib << 20)
        self._results_fd = res.results.fileno()  # told apart from the router's in each wake-up
        self._drops_fd = res.drops.fileno()
        self._slots = [_Slot(k, core) for k, core in enumerate(self.plan.workers)]
        self._by_identity: dict[bytes, _Slot] = {}
        self._start_io()
        for slot in self._slots:
            self._start_worker(slot)
        deadline = time.monotonic() + self.config.start_timeout_s
        while not (self._io_ready and all(s.ready for s in self._slots)):
            for slot in self._slots:
                if slot.proc.poll() is not None:
                    raise MmError(f"pool start-up: worker {slot.index} exited with code {slot.proc.returncode}")
            if self._io_proc.poll() is not None:
                raise MmError(f"pool start-up: the I/O process exited with code {self._io_proc.returncode}")
            if time.monotonic() > deadline:
                raise MmError(f"pool start-up: workers not ready within {self.config.start_timeout_s} s")
            res.router.poll(50)
            self._receive(_FROM_ANY)

    def _start_io(self) -> None:
        args = {"endpoint": self._res.router.endpoint, "parent": os.getpid(), "cores": list(self.plan.io),
                "concurrency": self.config.io_concurrency,
                "media": self.config.media_policy().to_mapping()}  # fmt: skip
        self._io_ready = False
        self._io_proc = self._res.spawn("mmworker.pool.iostage", args)

    def _start_worker(self, slot: _Slot) -> None:
        slot.incarnation += 1
        # Not ready until its Hello; replies still viewing the old ring keep that (read-only) mapping alive.
        slot.reader, slot.rid, slot.pending, slot.in_place, slot.holds = None, None, [], False, {}
        self._by_identity.pop(slot.identity, None)
        slot.identity = f"w{slot.index}.{slot.incarnation}".encode()
        self._by_identity[slot.identity] = slot
        slot.segment = self._res.new_segment(f"w{slot.index}", self.config.ring_mib << 20)
        inbox = self._res.new_inbox(slot.index)
        results_fd, requests_fd, inbox_fd = self._res.results.sender_fd, self._res.requests_fd, inbox.worker_fd
        args = {"inbox_fd": inbox_fd, "results_fd": results_fd, "requests_fd": requests_fd,
                "worker": slot.index, "incarnation": slot.incarnation,
                "ring": slot.segment.name, "cores": [slot.core] if slot.core is not None else None,
                "spec": self._spec, "parent": os.getpid(), "image_cpu_s": self.config.image_cpu_s,
                "memory_wait_s": self.config.memory_wait_s,
                "nice": self.config.worker_nice, "sched": self.plan.worker_sched, "probe": None}  # fmt: skip
        if self._probe is not None:
            _, [(address, _)] = places_of([self._probe])
            args["probe"] = [address, self._probe.hex()]
        slot.started = time.monotonic()
        slot.proc = self._res.spawn("mmworker.pool.worker", args, pass_fds=(results_fd, requests_fd, inbox_fd))
        inbox.handed_over()  # only the worker holds its end now: its exit shows as ChannelClosed

    # --- the public face ---------------------------------------------------------------------------

    def submit(
        self,
        input_ids: Sequence[int] | np.ndarray,
        images: Sequence[str | bytes | bytearray | memoryview],
        *,
        request_id: Any = None,
        mm_hashes: Sequence[str] | None = None,
    ) -> Any:
        """Queue one request and return its id; never blocks. Every request gets exactly one Reply.

        `input_ids` are copied here. Image bytes are not: they are read when the request reaches a
        worker, so a bytearray or memoryview source must stay unchanged until its reply arrives.
        Raises (MmError) only on misuse: after close(), or with a request id still in flight.
        """
        return self._submit(input_ids, images, request_id, mm_hashes, None)

    def _submit(self, input_ids, images, request_id: Any, mm_hashes, deliver) -> Any:
        """`submit`; with `deliver`, the reply goes straight to deliver(reply) when it is given
        (possibly before this returns), never to `poll`."""
        if self._res.closed:
            raise MmError("pool closed: submit after close()", kind=Outcome.POOL_CLOSED)
        if self._res.drops.posted:  # memory the caller let go of since the last turn: before it is wanted
            self._apply_drops()
        if request_id is None:
            request_id = next(self._auto_ids)
        req = _Request(next(self._rids), request_id, time.monotonic())
        self._answers.owe(req.rid, request_id, deliver)
        self._requests[req.rid] = req
        self._stats["submitted"] += 1
        in_flight = len(self._requests) - 1
        if in_flight >= self.config.queue_depth:
            why = f"queue full: {in_flight} requests in flight (queue_depth {self.config.queue_depth})"
            self._reject(req, why, Outcome.QUEUE_FULL)
            return request_id
        try:
            req.inputs = check_inputs(input_ids, images, mm_hashes)
        except MmError as exc:
            self._reject(req, str(exc), exc.kind)
            return request_id
        io_job = req.inputs.io_job()
        if io_job is not None:
            req.state = "io"
            try:
                self._res.router.send(IO_IDENTITY, Job(req.rid, 0, 0, io_job))
            except ChannelClosed:
                self._reject(req, "I/O process unavailable", Outcome.WORKER_CRASHED)
        else:
            req.state = "queued"
            self._queue.append(req)
            self._dispatch()
        return request_id

    def poll(self, timeout: float = 0) -> list[Reply]:
        """Finished replies (submission order unless `ordered=False`), waiting up to `timeout` seconds for one."""
        deadline = time.monotonic() + max(0.0, timeout)
        arrived = self._arrived(0.0) if not self._res.closed else 0  # what is waiting already
        while True:
            self._pump(arrived)
            ready = self._answers.ready()
            remaining = deadline - time.monotonic()
            if ready or remaining <= 0 or self._res.closed:
                return ready
            # The next pump receives only from what the wait found ready (nothing, if it timed out).
            arrived = self._arrived(min(remaining, 0.05))

    def process(
        self, input_ids, images, *, request_id: Any = None, mm_hashes=None, timeout: float | None = None
    ) -> Reply:
        """Submit and wait for this request's reply (other requests' replies stay for `poll`)."""
        rid = self._answers.rid_of(self.submit(input_ids, images, request_id=request_id, mm_hashes=mm_hashes))
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._answers.has(rid):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no reply within {timeout} s")
            self._pump()
            if not self._answers.has(rid):
                self._arrived(0.05)
        return self._answers.take(rid)

    async def aprocess(self, input_ids, images, *, request_id: Any = None, mm_hashes=None) -> Reply:
        """`process` for asyncio: submit, then await this request's reply without blocking the loop.

        Any number may be in flight at once: the loop's one driver for this pool
        (mmworker.pool.aio) resolves each from the pool's fd. The await always returns the reply,
        a rejection included ("pool closed" if the pool closes meanwhile); it raises only on
        misuse, as `submit` does. Cancelling the awaiting task cancels the request, and a reply
        that still arrives is released.
        """
        driver = self._drivers.get(asyncio.get_running_loop())
        if driver is None:
            driver = self._driver()
        return await driver.process(input_ids, images, request_id, mm_hashes)

    def _driver(self) -> PoolDriver:
        """The running loop's driver for this pool, made now (the first `aprocess` on that loop)."""
        if self._res.closed:  # before a reader goes on a closed fd
            raise MmError("pool closed: submit after close()", kind=Outcome.POOL_CLOSED)
        for loop in [loop for loop in self._drivers if loop.is_closed()]:
            del self._drivers[loop]  # asyncio.run closes its loop: nothing to detach from any more
        loop = asyncio.get_running_loop()
        driver = self._drivers[loop] = PoolDriver(self, loop)
        return driver

    def cancel(self, request_id: Any) -> bool:
        """Reject a pending request with "aborted" and free what it held; False if unknown or delivered."""
        rid = self._answers.rid_of(request_id)
        if rid is None:
            return False
        req = self._requests.get(rid)
        if req is None:  # finished, not yet delivered
            self._answers.abort(rid)
            return True
        if req.state == "queued":
            self._queue.remove(req)
        req.cancelled = True  # a running or fetching request's result is dropped (and freed) on arrival
        self._reject(req, "aborted", Outcome.ABORTED, keep_tracking=req.state in ("running", "io"))
        return True

    def fileno(self) -> int:
        """An fd that becomes readable when a message may have arrived or a reply released on drop
        is gone: then call poll()."""
        return self._res.wake.fileno()

    def stats(self) -> PoolStats:
        if self._res.drops.posted and not self._res.closed:  # posted on this thread since the last turn
            self._apply_drops()
        return PoolStats(
            workers=len(self._slots), workers_ready=sum(s.ready for s in self._slots),
            restarts=self._stats["restarts"], submitted=self._stats["submitted"], accepted=self._stats["accepted"],
            rejected=self._stats["rejected"], in_flight=len(self._requests), queued=len(self._queue),
            cold_start_ms=tuple(self._cold_start), shm_held_bytes=self._held_bytes,
            shm_peak_held_bytes=self._peak_held_bytes,
            request_ring_used_bytes=self._staging.used_bytes(),
            workers_reading_in_place=sum(s.ready and s.in_place for s in self._slots),
        )  # fmt: skip

    def worker_pids(self) -> list[int]:
        return [s.proc.pid for s in self._slots if s.proc is not None]

    def io_pid(self) -> int:
        return self._io_proc.pid

    def close(self) -> None:
        """Reject everything pending ("pool closed"), stop every process, remove every resource.

        The asyncio drivers' pending awaits get those rejections, and their readers come off
        their loops. Replies still viewing a ring keep it mapped until they are released or dropped;
        releases that come after this are dropped.
        """
        if self._res.closed:
            return
        for req in list(self._requests.values()):
            if not req.cancelled:
                self._reject(req, "pool closed", Outcome.POOL_CLOSED)
        self._requests.clear()
        self._dropping.clear()
        self._finalizer()  # detaches the drivers and terminates the processes
        for slot in getattr(self, "_slots", ()):  # absent if start-up failed early
            # Unmapped now, or when the last reply still viewing the ring lets go of it.
            slot.reader = None

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the engine (runs inside poll) ---------------------------------------------------------------

    def _step(self) -> None:
        """One turn of the engine over whatever is waiting, without waiting or handing replies out
        (the asyncio driver's turn: replies go to their futures as they are given)."""
        if not self._res.closed:
            self._pump(self._arrived(0.0))

    def _pump(self, receive: int = _FROM_ANY) -> None:
        """One turn of the engine; `receive` says where to look (_FROM_ROUTER, _FROM_RESULTS, _FROM_DROPS)."""
        if self._res.closed:
            return
        self._res.drops.owner = threading.get_ident()
        if receive & _FROM_DROPS or self._res.drops.posted:
            self._apply_drops()
        if receive & ~_FROM_DROPS:
            self._receive(receive)
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + _CHECK_INTERVAL_S
            self._check_processes()
        self._dispatch()

    def _arrived(self, timeout: float) -> int:
        """Wait up to `timeout` s for a message; which channels to receive from (_FROM_ROUTER, _FROM_RESULTS).

        One epoll_wait(2) on the wake-up fd: a zmq_poll over the same two would cost the caller
        three or four system calls more per wait (a first pass that does not block, and ZeroMQ's
        own checks of its mailbox, getpid(2) included). The router's fd says nothing about
        messages that came before its last send or poll (`Router.settled`): then it is read
        first, without waiting.
        """
        res = self._res
        where, wait = (0, timeout) if res.router.settled else (_FROM_ROUTER, 0.0)
        for fd, _ in res.wake.poll(wait):
            if fd == self._results_fd:
                where |= _FROM_RESULTS
            else:
                where |= _FROM_DROPS if fd == self._drops_fd else _FROM_ROUTER
        return where

    def _receive(self, where: int) -> None:
        results = self._res.results
        while where & _FROM_RESULTS and (got := results.recv()) is not None:
            peer, message = got
            slot = self._worker(peer)
            if slot is None:
                continue
            if isinstance(message, (Done, Failed)):
                self._on_result(slot, message)
            elif isinstance(message, Hello) and not slot.ready:
                self._on_hello(slot, message)
        router = self._res.router
        while where & _FROM_ROUTER and (got := router.recv()) is not None:
            peer, message, payload = got
            if peer == IO_IDENTITY:
                self._on_io(message, payload)
            else:  # only the I/O process has business on the router
                log.warning("message from unknown peer %r dropped", peer)

    def _worker(self, peer: bytes) -> _Slot | None:
        slot = self._by_identity.get(peer)
        if slot is None:
            log.warning("message from unknown or replaced peer %r dropped", peer)
        return slot

    def _on_hello(self, slot: _Slot, hello: Hello) -> None:
        slot.reader = RingReader(Segment.attach(slot.segment.name, writable=False), slot.index)
        slot.in_place = hello.reads_in_place  # only a worker given the probe can say so
        self._retire(slot)  # both sides have mapped it: from now on it cannot leak
        self._cold_start.append((time.monotonic() - slot.started) * 1e3)
        self._idle[slot.index] = slot

    def _on_result(self, slot: _Slot, message: Done | Failed) -> None:
        if message.rid != slot.rid:  # a worker answers only the job it runs: this one is stale
            log.warning("worker %d answered request %d while running %s; answer dropped", slot.index, message.rid,
                        slot.rid)  # fmt: skip
            if isinstance(message, Done):
                self._release(slot, _allocations(message))
            return
        self._free_inputs(slot)  # the worker has finished reading them
        req = self._answered(message.rid)
        slot.rid = None
        self._idle[slot.index] = slot
        if req is None:  # aborted meanwhile: free and drop
            if isinstance(message, Done):
                self._release(slot, _allocations(message))
            return
        if isinstance(message, Failed):
            kind = _OUTCOMES.get(message.kind, Outcome.INTERNAL)
            why = self._memory_full(slot, message.error) if kind is Outcome.MEMORY_FULL else message.error
            self._reject(req, why, kind)
            return
        try:
            reply = self._accept(req, slot, message)
        except (IpcError, IndexError, KeyError, TypeError, ValueError) as exc:  # a descriptor that does not check out
            self._release(slot, _allocations(message))
            self._reject(req, f"internal error: bad result from worker {slot.index}: {exc}", Outcome.INTERNAL)
            return
        self._finish(req, reply)
        self._stats["accepted"] += 1

    def _accept(self, req: _Request, slot: _Slot, done: Done) -> Reply:
        meta, view = done.meta, slot.reader.view
        # Every tensor is a view into the worker's ring, its aux tensors too: with caches cold a
        # fourth view costs a few us, numpy's conversion of a list ~30 (measured on the dev VM).
        arrays, held = {}, 0
        for name, d in done.tensors.items():
            arrays[name] = view(d.offset, d.nbytes, d.dtype, d.shape)
            held += d.nbytes
        allocations = _allocations(done)
        n_items = len(meta["offsets"])
        hashes = override_hashes([int(h) for h in meta["hashes"]], req.inputs.mm_hashes, req.request_id)
        auxes: list[dict[str, np.ndarray]] = [{} for _ in range(n_items)]
        for name, array in arrays.items():
            if name.startswith("aux."):  # "aux.<item>.<name>"
                _, i, key = name.split(".", 2)
                auxes[int(i)][key] = array
        items = [ReplyItem(feature=arrays[f"feature.{i}"], aux=auxes[i], hash=hashes[i]) for i in range(n_items)]
        lease = slot.holds[req.rid] = _Lease(self, slot, req.rid, allocations, held)
        self._held_bytes += held
        self._peak_held_bytes = max(self._peak_held_bytes, self._held_bytes)
        return Reply(
            request_id=req.request_id, ok=True, input_ids=arrays["input_ids"],
            offsets=[(int(s), int(e)) for s, e in meta["offsets"]], items=items,
            positions=arrays.get("positions"),
            delta=meta.get("delta"), busy_ms=done.busy_ms, queued_ms=(req.dispatched - req.submitted) * 1e3,
            to_worker_ms=(done.started - req.dispatched) * 1e3,
            worker=slot.index, nbytes=held, token_ids=self._token_ids, _lease=lease,
        )  # fmt: skip

    def _on_io(self, message, payload) -> None:
        if isinstance(message, Hello):
            self._io_ready = True
            return
        req = self._answered(getattr(message, "rid", -1))
        if req is None:
            return
        if isinstance(message, Failed):
            self._reject(req, message.error, _OUTCOMES.get(message.kind, Outcome.INTERNAL))
            return
        req.inputs.fetched(payload)
        req.state = "queued"
        self._queue.append(req)

    def _check_processes(self) -> None:
        ended = self._res.any_ended()  # one syscall; process handles are asked only then
        now = time.monotonic()
        for slot in self._slots:
            req = self._requests.get(slot.rid) if slot.rid is not None else None
            if ended and slot.proc.poll() is not None:
                why = f"worker crashed (worker {slot.index}, exit code {slot.proc.returncode})"
                self._restart(slot, req, why, Outcome.WORKER_CRASHED)
            elif req is not None and now > req.deadline:
                slot.proc.kill()  # it may be hung or stopped: its ring and its job are abandoned
                slot.proc.wait()
                why = f"deadline exceeded ({self.config.deadline_s:g} s, worker {slot.index})"
                self._restart(slot, req, why, Outcome.DEADLINE_EXCEEDED)
            elif slot.pending and slot.rid is not None:  # releases its inbox had no room for before
                self._flush_releases(slot)
        if ended and self._io_proc.poll() is not None:
            code = self._io_proc.returncode
            for req in [r for r in self._requests.values() if r.state == "io"]:
                self._reject(req, f"I/O process crashed (exit code {code})", Outcome.WORKER_CRASHED)
            self._stats["restarts"] += 1
            self._start_io()

    def _restart(self, slot: _Slot, req: _Request | None, why: str, kind: Outcome) -> None:
        self._idle.pop(slot.index, None)
        self._free_inputs(slot)  # its process has ended (or was killed and reaped): nothing reads them
        if req is not None and not req.cancelled:
            self._reject(req, why, kind)
        elif req is not None:
            self._forget(req)
        self._retire(slot)  # if it died before mapping its ring, the name is still there
        self._stats["restarts"] += 1
        self._start_worker(slot)

    def _retire(self, slot: _Slot) -> None:
        """Unlink and unmap the creator's handle of a slot's ring; only the reader's mapping remains.

        Without this every restart would keep a full ring mapped (and its memory allocated) for good.
        """
        segment, slot.segment = slot.segment, None
        if segment is not None:
            self._res.retire(segment)

    def _dispatch(self) -> None:
        """Hand queued requests to idle workers, the longest idle first, while there are both."""
        while self._queue and self._idle:
            req = self._queue[0]
            index = next(iter(self._idle))
            slot = self._idle[index]
            handed_over = time.monotonic()  # before the send: the worker may begin before it returns
            try:
                inputs = req.inputs
                staged, fd, places = self._staging.stage(slot.in_place, (inputs.ids, *inputs.frames))
            except IpcError as exc:  # not even a one-off segment could be had
                self._queue.popleft()
                self._reject(req, f"request inputs not staged: {exc}", Outcome.INTERNAL)
                continue
            del self._idle[index]
            released = slot.pending[:_RELEASES_PER_RECORD]
            job = Job(req.rid, 0, self._deadline_ms, {"kinds": "".join(inputs.kinds)}, released, places, slot.in_place)
            try:
                sent = self._res.inboxes[index].send(job, fd)
            except ChannelClosed:  # it died after its last answer; its process handle tells the rest
                sent = None
            finally:
                if fd is not None:
                    os.close(fd)  # the worker has its own copy now (or none is needed)
            if not sent:
                self._staging.free(staged)
                if sent is None:
                    continue
                # Its inbox is full: it has not read the releases sent while it was busy yet (it
                # is about to). The request and the worker stay first in line for the next turn.
                self._idle[index] = slot
                self._idle.move_to_end(index, last=False)
                return
            del slot.pending[: len(released)]
            self._queue.popleft()
            slot.rid, slot.inputs = req.rid, staged
            req.state = "running"
            req.dispatched = handed_over
            req.deadline = handed_over + self.config.deadline_s
            self._flush_releases(slot)  # any the Job had no room for

    def _free_inputs(self, slot: _Slot) -> None:
        self._staging.free(slot.inputs)
        slot.inputs = None

    # --- bookkeeping -----------------------------------------------------------------------------

    def _end_lease(self, lease: _Lease) -> None:
        """A reply is released: its allocations go back to its worker (if it still runs that ring)."""
        if self._res.forked():  # a forked child's copy: the worker's memory is the parent's to release
            return
        self._held_bytes -= lease.nbytes
        slot = lease.slot
        if slot.incarnation != lease.incarnation:  # its worker was replaced: nobody to give it back to
            return
        del slot.holds[lease.rid]
        if not self._res.closed and slot.ready:
            self._release(slot, lease.allocations)

    def _end_lease_on_drop(self, lease: _Lease, views: list[np.ndarray]) -> None:
        """`Reply.release_on_drop`: the lease ends once `views` and all derived from them are gone."""
        if self._res.closed:  # nothing to give back any more; live views keep the mapping themselves
            self._end_lease(lease)
            return
        self._dropping[lease.rid] = lease
        self._res.drops.watch(views, lease.rid)

    def _apply_drops(self) -> None:
        """End the leases whose views are all gone (posted by finalizers on any thread)."""
        for rid in self._res.drops.take():
            lease = self._dropping.pop(rid, None)
            if lease is not None:
                self._end_lease(lease)

    def _memory_full(self, slot: _Slot, error: str) -> str:
        """A worker's "shared memory full", with what only this side knows: which of its replies
        hold its ring, since when the caller has them, and what to do."""
        holds = list(slot.holds.values())
        if not holds:  # the job's own allocations fill the ring
            return f"{error}; worker {slot.index} has no unreleased reply: raise ring_mib (now {self.config.ring_mib})"
        now = time.monotonic()
        ages = [now - lease.handed_out for lease in holds if lease.handed_out]
        text = f"{error}; worker {slot.index}'s unreleased replies: {len(holds)} ({sum(h.nbytes for h in holds)} bytes)"
        if ages:
            text += f", the oldest handed out {max(ages):.1f} s ago"
        if len(ages) < len(holds):
            text += f", {len(holds) - len(ages)} not yet taken by poll()"
        return f"{text}: release replies sooner, or raise ring_mib (now {self.config.ring_mib})"

    def _release(self, slot: _Slot, allocations: list[tuple[int, int]]) -> None:
        """Give allocations back to a worker: at once if it is busy (it may be waiting for space),
        else with its next Job (it allocates nothing before that), which saves a message each way."""
        slot.pending += allocations
        if slot.rid is not None:
            self._flush_releases(slot)

    def _flush_releases(self, slot: _Slot) -> None:
        """Send a busy worker what is pending for it, as far as its inbox has room now; the rest
        waits for the next release, the next Job or the next process check."""
        if not slot.pending:
            return
        inbox = self._res.inboxes[slot.index]
        try:
            while slot.pending and inbox.send(Release(slot.index, slot.pending[:_RELEASES_PER_RECORD])):
                del slot.pending[:_RELEASES_PER_RECORD]
        except ChannelClosed:  # it is gone; its process handle tells the rest, and its ring goes
            slot.pending = []

    def _reject(self, req: _Request, error: str, kind: Outcome, *, keep_tracking: bool = False) -> None:
        """Answer `req` with `error` of `kind`; `keep_tracking` keeps a cancelled request known until its
        worker's or the I/O process's answer arrives (and is then dropped and freed)."""
        self._stats["rejected"] += 1
        latency = (time.monotonic() - req.submitted) * 1e3
        self._answers.give(req.rid, Reply(req.request_id, False, error, kind, latency_ms=latency))
        if not keep_tracking:
            self._forget(req)

    def _finish(self, req: _Request, reply: Reply) -> None:
        reply.latency_ms = (time.monotonic() - req.submitted) * 1e3
        self._answers.give(req.rid, reply)
        self._forget(req)

    def _forget(self, req: _Request) -> None:
        self._requests.pop(req.rid, None)

    def _answered(self, rid: int) -> _Request | None:
        """The live request a worker or the I/O process answers; None if it is gone or was cancelled
        meanwhile (then it is forgotten here: its reply, "aborted", was given at cancel time)."""
        req = self._requests.get(rid)
        if req is not None and req.cancelled:
            self._forget(req)
            return None
        return req


def _teardown(resources: PoolResources, drivers: dict[asyncio.AbstractEventLoop, PoolDriver]) -> None:
    """The pool's end (close() or its garbage collection): the drivers' readers come off their
    loops while the fd is still open (a closed fd's number may be reused at once), then the OS
    resources go. Nothing in a forked child's copy: the loops' epoll instances are shared with the
    parent, whose registrations a removal there would delete."""
    if not resources.forked():
        for driver in drivers.values():
            driver.detach()
    drivers.clear()
    resources.close()


def _allocations(done: Done) -> list[tuple[int, int]]:
    """(offset, seq) of every tensor a Done holds in its worker's ring: what a Release gives back."""
    return [(d.offset, d.seq) for d in done.tensors.values()]
