"""The worker slots and the memory replies hold in their rings: leases, their ends, the releases owed to each worker.

A slot is one worker position (a core); its process and ring change when it is restarted (each
time a new incarnation). An accepted reply holds its worker's ring through a `Lease` until
`Reply.release()`, or, after `Reply.release_on_drop()`, until nothing sees its arrays
(mmworker.pool.drops). Rings are FIFO, so one reply held long stops the reuse of everything after
it: a worker whose ring stays full fails its job with kind MEMORY_FULL, and `Leases.memory_full`
adds to its message what only the client knows (how many of that worker's replies are held, since
when). A lease of a worker that has since been replaced gives nothing back: its ring is gone once
nothing views it.

Releases travel in the worker's inbox: with its next Job if it is idle (it allocates nothing
before that; a message each way saved), at once if it is busy (it may be waiting for room).
"""

import subprocess
import time
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from ipc.errors import ChannelClosed
from ipc.ring import RingReader
from ipc.segment import Segment
from ipc.wire import Release
from mmworker.pool.inputs import Held

if TYPE_CHECKING:
    from mmworker.pool.cache import Entry, FeatureCache
    from mmworker.pool.config import PoolConfig
    from mmworker.pool.resources import PoolResources

# Releases per inbox record (a Job's or a Release's): ~20 bytes each, well inside ipc.records.MAX_RECORD_BYTES.
RELEASES_PER_RECORD = 1024


class Slot:
    """One worker position (a core); its process and ring change when it is restarted."""

    __slots__ = ("core", "holds", "identity", "in_place", "incarnation", "index", "inputs", "pending", "proc",
                 "reader", "rid", "segment", "started")  # fmt: skip

    def __init__(self, index: int, core: int | None) -> None:
        self.index, self.core = index, core
        self.incarnation = 0
        self.proc: subprocess.Popen | None = None
        self.segment: Segment | None = None  # the ring as created here, until the worker's Hello
        self.reader: RingReader | None = None
        self.identity = b""
        self.rid: int | None = None  # the request it runs
        self.started = 0.0
        self.pending: list[tuple[int, int]] = []  # released allocations not yet sent (see Leases.release)
        # Its running job's inputs: their request-ring allocation, or the exports that keep them in place.
        self.inputs: Held = None
        self.in_place = False  # it reads job inputs from this process's memory (its Hello said so)
        self.holds: dict[int, Lease] = {}  # rid -> the lease of each unreleased reply of this incarnation

    @property
    def ready(self) -> bool:
        """Its worker said Hello and its ring is mapped here (reset when the worker is restarted)."""
        return self.reader is not None

    def reset(self) -> None:
        """A new incarnation: not ready until its Hello; nothing runs, nothing is owed or held."""
        self.incarnation += 1
        self.reader, self.rid, self.pending, self.in_place, self.holds = None, None, [], False, {}


class Lease:
    """An accepted reply's hold on its worker's ring (which allocations, how many bytes) and on the
    cache entries it shows (`pins`), since when the caller has it, and how it ends
    (`Reply.release` / `Reply.release_on_drop` call these). A reply answered from the cache alone
    has no slot and holds no ring."""

    __slots__ = ("allocations", "handed_out", "incarnation", "leases", "nbytes", "owner", "pins", "rid", "slot")

    def __init__(self, leases: "Leases", slot: Slot | None, rid: int, allocations: list[tuple[int, int]],
                 nbytes: int, owner: Any, pins: "list[Entry]") -> None:  # fmt: skip
        self.leases, self.slot, self.rid = leases, slot, rid
        self.incarnation = slot.incarnation if slot is not None else 0
        self.allocations, self.nbytes, self.pins = allocations, nbytes, pins
        self.handed_out = 0.0  # set by Answers when the caller gets the reply
        self.owner = owner  # the pool: a reply not yet released keeps it alive, as the memory it views

    def release(self) -> None:
        self.leases.end(self)

    def release_on_drop(self, views: list[np.ndarray]) -> None:
        self.leases.end_on_drop(self, views)


class Leases:
    """The memory the pool's replies hold: their leases, the bytes held, and the releases owed to each worker."""

    def __init__(self, resources: "PoolResources", config: "PoolConfig", owner: weakref.ref,
                 cache: "FeatureCache | None") -> None:  # fmt: skip
        self._res = resources
        self._cache = cache
        self._ring_mib = config.ring_mib
        self._owner = owner  # the pool, weakly: only leases hold it
        self.held_bytes = 0  # shared memory held by replies not yet released
        self.peak_held_bytes = 0
        self._dropping: dict[int, Lease] = {}  # rid -> the lease of a reply released on drop, until then

    def grant(self, slot: Slot | None, rid: int, allocations: list[tuple[int, int]], nbytes: int,
              pins: "list[Entry]") -> Lease:  # fmt: skip
        """The lease of an accepted reply of `slot`'s worker over `allocations` (`nbytes` in all) and
        the cache entries `pins` (pinned already; the lease unpins them)."""
        lease = Lease(self, slot, rid, allocations, nbytes, self._owner(), pins)
        if slot is not None:
            slot.holds[rid] = lease
        self.held_bytes += nbytes
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        return lease

    def end(self, lease: Lease) -> None:
        """A reply is released: its allocations go back to its worker (if it still runs that ring)."""
        if self._res.forked():  # a forked child's copy: the worker's memory is the parent's to release
            return
        self.held_bytes -= lease.nbytes
        if lease.pins:  # the entries outlive any worker
            self._cache.unpin(lease.pins)
            lease.pins = []
        slot = lease.slot
        if slot is None or slot.incarnation != lease.incarnation:  # none, or replaced: nobody to give it back to
            return
        del slot.holds[lease.rid]
        if not self._res.closed and slot.ready:
            self.release(slot, lease.allocations)

    def end_on_drop(self, lease: Lease, views: list[np.ndarray]) -> None:
        """`Reply.release_on_drop`: the lease ends once `views` and all derived from them are gone."""
        if self._res.closed:  # nothing to give back any more; live views keep the mapping themselves
            self.end(lease)
            return
        self._dropping[lease.rid] = lease
        self._res.drops.watch(views, lease.rid)

    def apply_drops(self) -> None:
        """End the leases whose views are all gone (posted by finalizers on any thread)."""
        for rid in self._res.drops.take():
            lease = self._dropping.pop(rid, None)
            if lease is not None:
                self.end(lease)

    def forget_drops(self) -> None:
        """The pool closes: leases still waiting for their views to go end with nothing to give back."""
        self._dropping.clear()

    def release(self, slot: Slot, allocations: list[tuple[int, int]]) -> None:
        """Give allocations back to a worker: at once if it is busy (it may be waiting for space),
        else with its next Job (it allocates nothing before that), which saves a message each way."""
        slot.pending += allocations
        if slot.rid is not None:
            self.flush(slot)

    def flush(self, slot: Slot) -> None:
        """Send a busy worker what is pending for it, as far as its inbox has room now; the rest
        waits for the next release, the next Job or the next process check."""
        if not slot.pending:
            return
        inbox = self._res.inboxes[slot.index]
        try:
            while slot.pending and inbox.send(Release(slot.index, slot.pending[:RELEASES_PER_RECORD])):
                del slot.pending[:RELEASES_PER_RECORD]
        except ChannelClosed:  # it is gone; its process handle tells the rest, and its ring goes
            slot.pending = []

    def memory_full(self, slot: Slot, error: str) -> str:
        """A worker's "shared memory full", with what only this side knows: which of its replies
        hold its ring, since when the caller has them, and what to do."""
        holds = list(slot.holds.values())
        if not holds:  # the job's own allocations fill the ring
            return f"{error}; worker {slot.index} has no unreleased reply: raise ring_mib (now {self._ring_mib})"
        now = time.monotonic()
        ages = [now - lease.handed_out for lease in holds if lease.handed_out]
        text = f"{error}; worker {slot.index}'s unreleased replies: {len(holds)} ({sum(h.nbytes for h in holds)} bytes)"
        if ages:
            text += f", the oldest handed out {max(ages):.1f} s ago"
        if len(ages) < len(holds):
            text += f", {len(holds) - len(ages)} not yet taken by poll()"
        return f"{text}: release replies sooner, or raise ring_mib (now {self._ring_mib})"
