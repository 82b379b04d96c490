"""`WorkerPool`, the pool's public face: submit, poll, process, aprocess, cancel, stats, close; it wires the parts.

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
(ipc.channels). No image or video byte crosses a socket: the Job carries where a job's input bytes
(input_ids, images, videos) are, and the worker copies them straight out of this process's memory
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
holding views into the old ring keep it mapped until released. A mistake of the calling code
(submit after close(), a request id still in flight, an argument of the wrong type that is not
the request's content) raises UsageError at the call instead, and no reply is owed for it.

Memory: an accepted reply holds its worker's ring (a lease, mmworker.pool.slots) until
`release()`, or, after `release_on_drop()`, until nothing sees its arrays (mmworker.pool.drops);
a worker whose ring stays full `memory_wait_s` fails the job with kind MEMORY_FULL, and the
message says which replies hold the ring and since when.

Repeats: with the feature cache (mmworker.pool.cache; `cache_mib`, on by default) an image sent
again is not computed again. A request whose images are all cached (and which has no video) is
answered inside `submit` (ready for the next `poll()`, no fd wake-up), one with some cached sends
only the others' bytes, and one whose image another request is computing waits for that job.
Videos are never cached: every video is computed by a worker, beside the request's cached images.

Videos (`videos=`): items after the images, through the same path: the I/O process fetches a
URL's or file's stream under the video cap (MAX_VIDEO_FETCH_BYTES), a worker computes the feature
into its ring under `video_cpu_s` of CPU each, and the reply carries each item's `modality` and
placeholder `runs`. A family that serves no videos has the request rejected at submit
(UNSUPPORTED, naming why), before anything is fetched.

The parts, one concept each: `inflight` (the requests and their states, one reply each),
`dispatch` (the queue and the idle workers), `supervisor` (the children: start, Hello, crash and
deadline checks, restarts), `engine` (the turn: wait, receive, check, dispatch; Done -> Reply),
`slots` (the workers' slots and the memory replies hold), `cache` (the feature cache), `inputs`
(a request's inputs), `answers` (the order replies are handed out in), `aio` (`aprocess`'s driver).
Every OS resource (processes, sockets, segments, the runtime directory) belongs to one
`PoolResources` object (mmworker.pool.resources), closed by `close()`, by garbage collection or at
interpreter exit.
"""

import asyncio
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ipc.errors import ChannelClosed, IpcError
from ipc.wire import Job
from mmworker.driver import check_capabilities
from mmworker.errors import MmError, Outcome, UsageError
from mmworker.pool.aio import PoolDriver
from mmworker.pool.cache import FeatureCache
from mmworker.pool.config import PoolConfig
from mmworker.pool.dispatch import Dispatcher
from mmworker.pool.engine import FROM_ANY, Engine
from mmworker.pool.inflight import CANCELLED, InFlight, State
from mmworker.pool.inputs import InputStaging, check_inputs, hashes_of
from mmworker.pool.protocol import IO_IDENTITY
from mmworker.pool.reply import Reply
from mmworker.pool.resources import PoolResources
from mmworker.pool.slots import Leases
from mmworker.pool.supervisor import Supervisor
from mmworker.registry import pipeline_from_spec, spec_mapping, worker_spec


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
    # The feature cache (mmworker.pool.cache); all 0 without one (cache_mib = 0).
    cache_hits: int = 0  # images served from the cache
    cache_misses: int = 0  # images computed (cache on: admitted and not found)
    cache_deduplicated: int = 0  # requests that waited for an identical image another request was computing
    cache_evictions: int = 0
    cache_entries: int = 0
    cache_bytes: int = 0  # partition space the entries take
    cache_capacity_bytes: int = 0


class WorkerPool:
    """Preprocess requests on pinned worker processes; see the module docstring.

    `spec`: a bundled spec's name (mmworker.registry.NAMED_SPECS), a mapping or a JSON string naming
    its family (mmworker.registry). `config`: a PoolConfig, a mapping or a TOML path (mmworker.pool.config).
    """

    def __init__(self, spec: Mapping[str, Any] | str, config: PoolConfig | Mapping[str, Any] | str | None = None):
        spec = spec_mapping(spec)
        self.family = pipeline_from_spec(spec)  # a bad spec fails here, before any process starts
        self.config = PoolConfig.from_any(config)
        self.plan = self.config.plan()
        self._res = res = PoolResources()
        # asyncio drivers, one per event loop (mmworker.pool.aio); they hold this pool weakly, so
        # the finalizer, which must not reference the pool, can take their readers off the loops.
        self._drivers: dict[asyncio.AbstractEventLoop, PoolDriver] = {}
        self._finalizer = weakref.finalize(self, _teardown, res, self._drivers)
        self._inflight = InFlight(self.config.ordered)
        self._staging = InputStaging(res)
        spec_for_workers = worker_spec(spec)
        config = self.config
        self._cache = None
        if config.cache_mib:
            self._cache = FeatureCache(res, config.cache_mib, len(self.plan.workers), spec_for_workers,
                                       config.trust_content_hashes)  # fmt: skip
            self._inflight.on_leave = self._cache.forget
        self._leases = Leases(res, config, weakref.ref(self), self._cache)
        self._dispatcher = Dispatcher(res, config, self._inflight, self._staging, self._leases, self._cache)
        self._supervisor = Supervisor(res, config, self.plan, spec_for_workers, self._inflight,
                                      self._dispatcher, self._leases, self._cache)  # fmt: skip
        try:
            res.open(config.request_ring_mib << 20)
            if self._cache is not None:
                self._cache.open()
            self._engine = Engine(res, self.family, self._inflight, self._dispatcher, self._supervisor, self._leases,
                                  self._cache)  # fmt: skip
            self._supervisor.start(lambda: self._engine.receive(FROM_ANY))
        except IpcError as exc:  # e.g. /dev/shm too small for the rings: a start-up failure, said clearly
            self.close()
            raise MmError(f"pool start-up: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def submit(
        self,
        input_ids: Sequence[int] | np.ndarray,
        images: Sequence[str | bytes | bytearray | memoryview],
        *,
        videos: Sequence[str | bytes | bytearray | memoryview] = (),
        request_id: Any = None,
        mm_hashes: Sequence[str] | None = None,
        content_hashes: Sequence[str | None] | None = None,
    ) -> Any:
        """Queue one request and return its id; never blocks. Every request gets exactly one Reply.

        `input_ids` hold one placeholder per image and per video. `videos`: their sources, as for
        images (bytes, a path, a file:// or http(s) URL, a data: URL, base64); the reply's items are
        the images, then the videos. `input_ids` are copied here. Source bytes are not: they are
        read when the request reaches a worker, so a bytearray or memoryview source must stay
        unchanged until its reply arrives. `mm_hashes`: hex strings that replace the replies'
        hashes, one per item (SGLang's rule). `content_hashes`: the caller's own hash of each
        image's content (None for one it has none for; videos have none: they are never cached),
        which keys the feature cache instead of hashing the bytes, only if the config says
        `trust_content_hashes`. Raises only on misuse (UsageError): after close(), with a request
        id still in flight or not hashable, with `mm_hashes` or `content_hashes` not a list; then
        nothing was submitted.
        """
        return self._submit(input_ids, images, request_id, mm_hashes, None, content_hashes, videos)

    def _submit(self, input_ids, images, request_id: Any, mm_hashes, deliver, content_hashes=None, videos=()) -> Any:
        """`submit`; with `deliver`, the reply goes straight to deliver(reply) when it is given
        (possibly before this returns), never to `poll`."""
        res = self._res
        if res.closed:
            raise UsageError("pool closed: submit after close()")
        hashes = hashes_of(mm_hashes)  # misuse is found before anything is owed
        content = hashes_of(content_hashes, "content_hashes")
        if res.drops.posted:  # memory the caller let go of since the last turn: before it is wanted
            self._leases.apply_drops()
        inflight = self._inflight
        req = inflight.open(request_id, deliver)
        in_flight = len(inflight.table)
        if in_flight >= self.config.queue_depth:
            why = f"queue full: {in_flight} requests in flight (queue_depth {self.config.queue_depth})"
            inflight.reject(req, why, Outcome.QUEUE_FULL)
            return req.request_id
        try:
            req.inputs = check_inputs(input_ids, images, hashes, content, videos)
            check_capabilities(self.family, req.inputs.videos)  # before a video is fetched for nothing
        except MmError as exc:
            inflight.reject(req, str(exc), exc.kind)
            return req.request_id
        io_job = req.inputs.io_job()
        if io_job is not None:
            inflight.enter(req, State.FETCHING)
            try:
                res.router.send(IO_IDENTITY, Job(req.rid, 0, 0, io_job))
            except ChannelClosed:
                inflight.reject(req, "I/O process unavailable", Outcome.WORKER_CRASHED)
        else:
            inflight.enter(req, State.QUEUED)
            self._engine.admit(req)
            self._dispatcher.dispatch()
        return req.request_id

    def poll(self, timeout: float = 0) -> list[Reply]:
        """Finished replies (submission order unless `ordered=False`), waiting up to `timeout` seconds for one."""
        deadline = time.monotonic() + max(0.0, timeout)
        engine, answers, res = self._engine, self._inflight.answers, self._res
        arrived = engine.arrived(0.0) if not res.closed else 0  # what is waiting already
        while True:
            engine.pump(arrived)
            ready = answers.ready()
            remaining = deadline - time.monotonic()
            if ready or remaining <= 0 or res.closed:
                return ready
            # The next pump receives only from what the wait found ready (nothing, if it timed out).
            arrived = engine.arrived(min(remaining, 0.05))

    def process(
        self, input_ids, images, *, videos=(), request_id: Any = None, mm_hashes=None, content_hashes=None,
        timeout: float | None = None,
    ) -> Reply:  # fmt: skip
        """Submit and wait for this request's reply (other requests' replies stay for `poll`)."""
        answers, engine = self._inflight.answers, self._engine
        submitted = self.submit(input_ids, images, videos=videos, request_id=request_id, mm_hashes=mm_hashes,
                                content_hashes=content_hashes)  # fmt: skip
        rid = answers.rid_of(submitted)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not answers.has(rid):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no reply within {timeout} s")
            engine.pump()
            if not answers.has(rid):
                engine.arrived(0.05)
        return answers.take(rid)

    async def aprocess(
        self, input_ids, images, *, videos=(), request_id: Any = None, mm_hashes=None, content_hashes=None
    ) -> Reply:
        """`process` for asyncio: submit, then await this request's reply without blocking the loop.

        Any number may be in flight at once: the loop's one driver for this pool
        (mmworker.pool.aio) resolves each from the pool's fd. The await always returns the reply,
        a rejection included ("pool closed" if the pool closes meanwhile); it raises only on
        misuse (UsageError), as `submit` does. Cancelling the awaiting task cancels the request,
        and a reply that still arrives is released.
        """
        driver = self._drivers.get(asyncio.get_running_loop())
        if driver is None:
            driver = self._driver()
        return await driver.process(input_ids, images, request_id, mm_hashes, content_hashes, videos)

    def _driver(self) -> PoolDriver:
        """The running loop's driver for this pool, made now (the first `aprocess` on that loop)."""
        if self._res.closed:  # before a reader goes on a closed fd
            raise UsageError("pool closed: submit after close()")
        for loop in [loop for loop in self._drivers if loop.is_closed()]:
            del self._drivers[loop]  # asyncio.run closes its loop: nothing to detach from any more
        loop = asyncio.get_running_loop()
        driver = self._drivers[loop] = PoolDriver(self, loop)
        return driver

    def cancel(self, request_id: Any) -> bool:
        """Reject a pending request with "aborted" and free what it held; False if unknown or delivered.

        Whatever its state: queued, it leaves the queue; fetching or running, the I/O process's or
        the worker's answer is dropped (and its memory freed) when it comes; finished but not yet
        handed out, its reply is released. Cancelling it again changes nothing (True until delivered).
        """
        answers = self._inflight.answers
        rid = answers.rid_of(request_id)
        if rid is None:
            return False
        req = self._inflight.table.get(rid)
        if req is None:  # finished, not yet handed out
            answers.abort(rid)
        elif req.state not in CANCELLED:
            if req.state is State.QUEUED:
                self._dispatcher.unqueue(req)
            self._inflight.cancel(req)
            self._engine.resume()  # requests that waited for an image it was to compute
        return True

    def fileno(self) -> int:
        """An fd that becomes readable when a message may have arrived or a reply released on drop
        is gone: then call poll()."""
        return self._res.wake.fileno()

    def stats(self) -> PoolStats:
        if self._res.drops.posted and not self._res.closed:  # posted on this thread since the last turn
            self._leases.apply_drops()
        supervisor, inflight, leases = self._supervisor, self._inflight, self._leases
        slots = supervisor.slots
        return PoolStats(
            workers=len(slots), workers_ready=sum(s.ready for s in slots), restarts=supervisor.restarts,
            submitted=inflight.submitted, accepted=inflight.accepted, rejected=inflight.rejected,
            in_flight=len(inflight.table), queued=len(self._dispatcher.queue),
            cold_start_ms=tuple(supervisor.cold_start_ms), shm_held_bytes=leases.held_bytes,
            shm_peak_held_bytes=leases.peak_held_bytes, request_ring_used_bytes=self._staging.used_bytes(),
            workers_reading_in_place=sum(s.ready and s.in_place for s in slots), **self._cache_stats(),
        )  # fmt: skip

    def _cache_stats(self) -> dict[str, int]:
        cache = self._cache
        if cache is None:
            return {}
        return {"cache_hits": cache.hits, "cache_misses": cache.misses, "cache_deduplicated": cache.deduplicated,
                "cache_evictions": cache.evictions, "cache_entries": len(cache), "cache_bytes": cache.bytes_held,
                "cache_capacity_bytes": cache.capacity}  # fmt: skip

    def worker_pids(self) -> list[int]:
        return self._supervisor.worker_pids()

    def io_pid(self) -> int:
        return self._supervisor.io_proc.pid

    def close(self) -> None:
        """Reject everything pending ("pool closed"), stop every process, remove every resource.

        The asyncio drivers' pending awaits get those rejections, and their readers come off
        their loops. Replies still viewing a ring keep it mapped until they are released or dropped;
        releases that come after this are dropped.
        """
        if self._res.closed:
            return
        self._inflight.close()
        self._leases.forget_drops()
        self._finalizer()  # detaches the drivers and terminates the processes
        self._supervisor.close()
        if self._cache is not None:
            self._cache.close()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
