"""The pool's engine: each turn over what has arrived (answers, Hellos, drops), the child checks, Done into Reply.

The pool has no thread of its own: every turn runs inside the caller's `poll()`, `process()`, or
the asyncio driver's callbacks. A turn takes the releases that finalizers posted, receives from
where the wake-up said (the results channel: workers' Hellos and answers; the router: the I/O
process's), checks the children every `CHECK_INTERVAL_S`, and dispatches what is queued.

A worker's Done becomes a `Reply` of views into its ring, the aux tensors too: nothing is copied,
and it is checked first (a descriptor outside the ring, a name for an item the request lacks, runs
that do not span the offsets, modalities other than the request's images then videos: "internal
error", never a view into the wrong memory). An answer for a job its worker no longer
runs, or for a cancelled request, is dropped, its memory given back.

With the feature cache (mmworker.pool.cache) a request whose inputs are all here is admitted
(`admit`): answered at once from the cache if every image of it is there (the prompt's layout
and positions computed here, by the driver's `assemble`), held while an identical image is being
computed for another request (`resume` admits it again when that job ends), or queued. A Done's
features that the worker put in its cache partition become entries before anything else, so a
cancelled request's work is kept too; the reply shows cached images as views of their entries.
"""

import logging
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from ipc.errors import IpcError
from ipc.wire import Done, Failed, Hello
from mmworker.driver import assemble, spans
from mmworker.errors import MmError, Outcome
from mmworker.pipeline import IMAGE, VIDEO, Family, MRope
from mmworker.pool import naming
from mmworker.pool.cache import ADMIT_HIT, ADMIT_WAIT, FeatureCache, frozen
from mmworker.pool.dispatch import Dispatcher
from mmworker.pool.inflight import InFlight, Request, State
from mmworker.pool.inputs import override_hashes
from mmworker.pool.protocol import IO_IDENTITY
from mmworker.pool.reply import Reply, ReplyItem
from mmworker.pool.slots import Leases, Slot
from mmworker.pool.supervisor import Supervisor

if TYPE_CHECKING:
    from mmworker.pool.resources import PoolResources

log = logging.getLogger("mmworker.pool")

# How often a turn looks for ended children (one poll(2) over their pidfds; waitpid only when one
# ended) and overdue requests: often enough that a crash is answered within a few ms.
CHECK_INTERVAL_S = 0.01
# Where a wake-up found something: the router's socket, the results channel, the drops' eventfd
# (releases posted by finalizers, applied whenever there are any; the bit says to reset the fd).
FROM_ROUTER, FROM_RESULTS, FROM_DROPS = 1, 2, 4
FROM_ANY = FROM_ROUTER | FROM_RESULTS
_OUTCOMES = {outcome.value: outcome for outcome in Outcome}  # a Failed's kind, as it travels


class Engine:
    """Turns the pool: waits on its wake-up fd, receives, checks the children, dispatches, builds replies."""

    def __init__(self, resources: "PoolResources", family: Family, inflight: InFlight, dispatcher: Dispatcher,
                 supervisor: Supervisor, leases: Leases, cache: FeatureCache | None) -> None:  # fmt: skip
        self._res = resources
        self._cache = cache
        self._family = family
        self._inflight = inflight
        self._dispatcher = dispatcher
        self._supervisor = supervisor
        self._leases = leases
        self._results_fd = resources.results.fileno()  # told apart from the router's in each wake-up
        self._drops_fd = resources.drops.fileno()
        self._next_check = 0.0

    def step(self) -> None:
        """One turn over whatever is waiting, without waiting or handing replies out (the asyncio
        driver's turn: replies go to their futures as they are given)."""
        if not self._res.closed:
            self.pump(self.arrived(0.0))

    def pump(self, receive: int = FROM_ANY) -> None:
        """One turn; `receive` says where to look (FROM_ROUTER, FROM_RESULTS, FROM_DROPS)."""
        res = self._res
        if res.closed:
            return
        res.drops.owner = threading.get_ident()
        if receive & FROM_DROPS or res.drops.posted:
            self._leases.apply_drops()
        if receive & ~FROM_DROPS:
            self.receive(receive)
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + CHECK_INTERVAL_S
            self._supervisor.check()
        self.resume()
        self._dispatcher.dispatch()

    def admit(self, req: Request) -> None:
        """`req`'s inputs are all here: queue it for a worker, or, with the cache, answer it from
        there, or hold it while another request computes one of its images (module docstring)."""
        cache = self._cache
        if cache is not None:
            verdict = cache.admit(req)
            if verdict is ADMIT_WAIT:
                req.state = State.WAITING
                return
            if verdict is ADMIT_HIT:
                self._answer_from_cache(req)
                return
        self._dispatcher.enqueue(req)

    def resume(self) -> None:
        """Admit again the requests whose wait for an image computed elsewhere is over."""
        cache = self._cache
        if cache is None:
            return
        table, resumable = self._inflight.table, cache.resumable
        while resumable:
            req = resumable.popleft()
            if table.get(req.rid) is req and req.state is State.WAITING:
                self.admit(req)

    def arrived(self, timeout: float) -> int:
        """Wait up to `timeout` s for a message; which channels to receive from (FROM_ROUTER, FROM_RESULTS).

        One epoll_wait(2) on the wake-up fd: a zmq_poll over the same two would cost the caller
        three or four system calls more per wait (a first pass that does not block, and ZeroMQ's
        own checks of its mailbox, getpid(2) included). The router's fd says nothing about
        messages that came before its last send or poll (`Router.settled`): then it is read
        first, without waiting.
        """
        res = self._res
        where, wait = (0, timeout) if res.router.settled else (FROM_ROUTER, 0.0)
        for fd, _ in res.wake.poll(wait):
            if fd == self._results_fd:
                where |= FROM_RESULTS
            else:
                where |= FROM_DROPS if fd == self._drops_fd else FROM_ROUTER
        return where

    def receive(self, where: int = FROM_ANY) -> None:
        """Take every message waiting on the channels `where` names."""
        results = self._res.results
        by_identity = self._supervisor.by_identity
        while where & FROM_RESULTS and (got := results.recv()) is not None:
            peer, message = got
            slot = by_identity.get(peer)
            if slot is None:
                log.warning("message from unknown or replaced peer %r dropped", peer)
            elif isinstance(message, (Done, Failed)):
                self._on_result(slot, message)
            elif isinstance(message, Hello) and not slot.ready:
                self._supervisor.on_hello(slot, message)
        router = self._res.router
        while where & FROM_ROUTER and (got := router.recv()) is not None:
            peer, message, payload = got
            if peer == IO_IDENTITY:
                self._on_io(message, payload)
            else:  # only the I/O process has business on the router
                log.warning("message from unknown peer %r dropped", peer)

    def _on_result(self, slot: Slot, message: Done | Failed) -> None:
        if message.rid != slot.rid:  # a worker answers only the job it runs: this one is stale
            log.warning("worker %d answered request %d while running %s; answer dropped", slot.index, message.rid,
                        slot.rid)  # fmt: skip
            if isinstance(message, Done):
                self._drop(slot, message)
            return
        self._dispatcher.job_over(slot)  # the worker has finished reading the inputs
        entries = {}
        if isinstance(message, Done) and self._cache is not None:  # kept even if the request was cancelled
            entries = self._commit(slot, message)
        req = self._inflight.answered(message.rid)
        if req is None:  # cancelled meanwhile: free and drop
            if isinstance(message, Done):
                self._leases.release(slot, _allocations(slot, message))
            return
        if isinstance(message, Failed):
            kind = _OUTCOMES.get(message.kind, Outcome.INTERNAL)
            why = self._leases.memory_full(slot, message.error) if kind is Outcome.MEMORY_FULL else message.error
            self._inflight.reject(req, why, kind)
            return
        try:
            reply = self._reply(req, slot, message, entries)
        except (IpcError, IndexError, KeyError, TypeError, ValueError) as exc:  # a descriptor that does not check out
            self._leases.release(slot, _allocations(slot, message))
            self._inflight.reject(req, f"internal error: bad result from worker {slot.index}: {exc}", Outcome.INTERNAL)
            return
        self._inflight.accept(req, reply)

    def _commit(self, slot: Slot, done: Done) -> dict:
        """The features `done` put in `slot`'s cache partition, as entries (by item); any there that
        cannot be one go back to the worker at once."""
        cache = self._cache
        entries = cache.commit(slot, self._inflight.table.get(done.rid), done)
        cache.flush(slot)
        return entries

    def _drop(self, slot: Slot, done: Done) -> None:
        """Give back everything `done` holds: its ring allocations, and its cache partition's."""
        if self._cache is not None:
            self._cache.commit(slot, None, done)  # keeps none of them: they go back to the worker
            self._cache.flush(slot)
        self._leases.release(slot, _allocations(slot, done))

    def _reply(self, req: Request, slot: Slot, done: Done, entries: dict) -> Reply:
        """The accepted reply: views into `slot`'s ring for every tensor of `done` (or into its cache
        partition, for the features it cached), the cached images' entries, and their lease."""
        meta, ring = done.meta, slot.index
        plan = req.cache
        hits = plan.hits if plan is not None else {}
        cached = {naming.feature_name(item) for item in entries}  # in the partition, and entries now
        arrays, held = {}, 0
        for name, d in done.tensors.items():
            if d.ring == ring:
                arrays[name] = slot.reader.view(d.offset, d.nbytes, d.dtype, d.shape)
                held += d.nbytes
            elif name in cached:  # never a view of partition space that is no entry (it goes back)
                arrays[name] = self._cache.partitions[ring].reader.view(d.offset, d.nbytes, d.dtype, d.shape)
            else:
                raise IpcError(f"tensor {name!r} names ring {d.ring}, not worker {ring}'s ring or cached feature")
        offsets = [(int(s), int(e)) for s, e in meta[naming.OFFSETS]]
        n_items = len(offsets)
        runs = naming.runs_of(meta[naming.RUNS], n_items)
        if list(spans(runs)) != offsets:
            raise ValueError(f"runs {runs} do not span offsets {offsets}")
        inputs = req.inputs
        modalities = [IMAGE] * inputs.images + [VIDEO] * inputs.videos
        if meta[naming.MODALITIES] != modalities:
            raise ValueError(f"modalities {meta[naming.MODALITIES]!r} for a request of {inputs.images} image(s) "
                             f"and {inputs.videos} video(s)")  # fmt: skip
        input_ids, positions, features, auxes = naming.unpack(arrays, n_items, hits)
        for i, entry in hits.items():
            features[i], auxes[i] = self._cache.view(entry), self._cache.aux(entry)
        hashes = override_hashes([int(h) for h in meta[naming.HASHES]], inputs.mm_hashes, req.request_id)
        items = [ReplyItem(features[i], auxes[i], hashes[i], modalities[i]) for i in range(n_items)]
        pins = []
        if plan is not None:  # the request's pins go to the lease, with the entries made from this job
            self._cache.pin(list(entries.values()))
            pins, plan.pins = plan.pins + list(entries.values()), []
        lease = self._leases.grant(slot, req.rid, _allocations(slot, done), held, pins)  # nothing after this can fail
        return Reply(
            request_id=req.request_id, ok=True, input_ids=input_ids, offsets=offsets, items=items, runs=runs,
            positions=positions, delta=meta.get(naming.DELTA), busy_ms=done.busy_ms,
            queued_ms=(req.dispatched - req.submitted) * 1e3, to_worker_ms=(done.started - req.dispatched) * 1e3,
            worker=slot.index, nbytes=held, family=self._family, cache_hits=len(hits), _lease=lease,
        )  # fmt: skip

    def _answer_from_cache(self, req: Request) -> None:
        """Answer a request whose images are all cached (it has no video: videos are never cached):
        the prompt laid out here, features viewed in place, no worker involved."""
        plan, cache = req.cache, self._cache
        entries = [plan.hits[i] for i in range(len(plan.keys))]
        ids = req.inputs.ids
        if isinstance(ids, bytes):
            ids = np.frombuffer(ids, "<i8")
        try:
            input_ids, runs, positions = assemble(self._family, ids, [e.grid for e in entries])
        except MmError as exc:  # the prompt does not place the images: what the worker would say
            self._inflight.reject(req, str(exc), exc.kind)
            return
        hashes = override_hashes([e.hash for e in entries], req.inputs.mm_hashes, req.request_id)
        items = [ReplyItem(cache.view(e), cache.aux(e), h) for e, h in zip(entries, hashes, strict=True)]
        mrope = positions if isinstance(positions, MRope) else None
        pins, plan.pins = plan.pins, []
        lease = self._leases.grant(None, req.rid, [], 0, pins)
        reply = Reply(
            request_id=req.request_id, ok=True, input_ids=frozen(input_ids), offsets=list(spans(runs)), items=items,
            runs=list(runs),
            positions=frozen(mrope.positions) if mrope else None, delta=mrope.delta if mrope else None,
            family=self._family, cache_hits=len(entries), _lease=lease,
        )  # fmt: skip
        self._inflight.accept(req, reply)

    def _on_io(self, message, payload) -> None:
        if isinstance(message, Hello):
            self._supervisor.io_ready = True
            return
        req = self._inflight.answered(getattr(message, "rid", -1))
        if req is None:
            return
        if isinstance(message, Failed):
            self._inflight.reject(req, message.error, _OUTCOMES.get(message.kind, Outcome.INTERNAL))
            return
        req.inputs.fetched(payload)
        self.admit(req)


def _allocations(slot: Slot, done: Done) -> list[tuple[int, int]]:
    """(offset, seq) of every tensor a Done holds in its worker's ring: what a Release gives back
    (what it holds in the cache partition is the cache's)."""
    return [(d.offset, d.seq) for d in done.tensors.values() if d.ring == slot.index]
