"""The feature cache: finished images in shared memory by content, the replies pinning them, LRU eviction, dedupe.

A repeated image costs no decode, resize or patchify: its features, aux tensors, content hash and
patch grid are kept from the first time and handed out again, zero-copy. The pool owns the cache;
the workers only write into it. Videos are never cached, nor keyed (their bytes are not hashed
here: the worker hashes them for the reply's `hash`); a request with videos always goes to a
worker, which takes its cached images as known and computes the rest.

Keys. An image's key is the blake3 digest (128 bits) of its source as the worker would get it (the
encoded bytes, as given or as the I/O process fetched them; a data: URL or base64 text as its
text, under another tag, so the two never meet), after a fingerprint of every setting that changes
the output (the worker spec: family, checkpoint settings, resample mode, feature dtype). Distinct
bytes never share an entry. A caller's own content hash keys it instead, unhashed, only when the
pool's config says to trust them (`trust_content_hashes`), again under a tag of its own.

Memory. `cache_mib` is split evenly into one partition per worker slot: a nameless segment (memfd)
this process creates once and keeps for the pool's life, mapped read-only here and writable by
each incarnation of that slot's worker, which allocates the features of the items it is told to
cache there (ipc.heap: space comes back in any order) instead of in its ring. The worker's Done
says where each tensor is (its ring id), and this side turns the features found in the partition
into entries. A partition outlives its worker: after a crash the next incarnation is handed the
partition and the list of its live entries (`claims`), which it marks taken; whatever the crashed
job had allocated there was never an entry, so it is free again. Nothing committed is lost or
overwritten.

Eviction. Least recently used first, per partition (a worker can only use its own), and never an
entry that a live reply views: each reply pins the entries it shows (its lease unpins them on
release, or once its views are all gone). Space is made when it is needed: before a job that is
to cache n images goes to a worker, its partition is given contiguous room for n of the largest
features seen there (the client knows every extent the worker's heap holds: an idle worker holds
only the entries), and the evictions go into the worker's inbox ahead of the job. A feature that still
finds no room (everything pinned, a larger image, fragmentation) goes to the worker's ring: that
reply is just as correct, its image simply not cached.

Dedupe. An image whose computation is in flight (another request produces it) is not computed
again: the later request waits (State.WAITING) until that job ends, then is admitted afresh (now
a hit; or, if the first failed, it computes it itself). A request whose images all hit is answered
here, by the caller's thread, with no worker involved.
"""

import bisect
import collections
import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from blake3 import blake3

from ipc.errors import ChannelClosed, IpcError
from ipc.ring import ALIGN, RingReader, aligned_size
from ipc.segment import Segment
from ipc.wire import Done, Release
from mmworker.pipeline import Grid
from mmworker.pool import naming
from mmworker.pool.protocol import ARG_CACHE, ARG_HASHES, ARG_KNOWN, KIND_BYTES, cache_heap

if TYPE_CHECKING:
    from mmworker.pool.inflight import Request
    from mmworker.pool.resources import PoolResources
    from mmworker.pool.slots import Slot

log = logging.getLogger("mmworker.pool")

KEY_BYTES = 16
FINGERPRINT_BYTES = 8
# Releases per inbox record, as for ring releases (mmworker.pool.slots).
EVICTIONS_PER_RECORD = 1024
_TAG_BYTES, _TAG_TEXT, _TAG_CALLER = b"b", b"s", b"c"


class Entry:
    """One cached image: where its feature lies (partition, offset, seq, dtype, shape), its aux tensors
    (small copies here), content hash and patch grid, and how many live replies pin it."""

    __slots__ = ("aux", "dtype", "grid", "hash", "key", "nbytes", "offset", "pins", "seq", "shape", "worker")

    def __init__(self, key: bytes, worker: int, offset: int, seq: int, nbytes: int, dtype: str,
                 shape: tuple[int, ...], aux: dict[str, np.ndarray], content_hash: int,
                 grid: Grid) -> None:  # fmt: skip
        self.key, self.worker, self.offset, self.seq, self.nbytes = key, worker, offset, seq, nbytes
        self.dtype, self.shape, self.aux, self.hash, self.grid = dtype, shape, aux, content_hash, grid
        self.pins = 0

    @property
    def span(self) -> int:
        """The partition space it takes (allocations are ALIGN-rounded)."""
        return aligned_size(self.nbytes)


class Partition:
    """One worker slot's share of the cache: its segment and descriptor, this side's read-only view,
    its entries oldest-used first, the bytes they take, and the releases owed to its worker."""

    def __init__(self, index: int, segment: Segment, fd: int) -> None:
        self.index, self.heap = index, cache_heap(index)
        self.segment, self.fd = segment, fd
        self.reader = RingReader(segment, self.heap)  # views made here are read-only
        self.capacity = segment.size
        self.entries: collections.OrderedDict[bytes, Entry] = collections.OrderedDict()  # least recently used first
        self.starts: list[int] = []  # the entries' offsets, ascending: where the free gaps are
        self.spans: dict[int, int] = {}  # offset -> span
        self.used = 0
        self.largest = 0  # the largest entry (or uncached feature) seen: what the next one may need
        self.evicted: list[tuple[int, int]] = []  # (offset, seq) not yet sent to the worker

    def add(self, entry: Entry) -> None:
        self.entries[entry.key] = entry
        bisect.insort(self.starts, entry.offset)
        self.spans[entry.offset] = entry.span
        self.used += entry.span

    def evict(self, entry: Entry) -> None:
        del self.entries[entry.key]
        del self.starts[bisect.bisect_left(self.starts, entry.offset)], self.spans[entry.offset]
        self.used -= entry.span
        self.evicted.append((entry.offset, entry.seq))

    def fits(self, sizes: list[int]) -> bool:
        """Whether features of `sizes` bytes would all find room in the free gaps between the
        entries, placed largest first, best fit, as the worker's heap (ipc.heap) places them."""
        gaps, at = [], 0
        for start in self.starts:
            if start > at:
                gaps.append(start - at)
            at = start + self.spans[start]
        if self.capacity > at:
            gaps.append(self.capacity - at)
        gaps.sort()
        for size in sorted(map(aligned_size, sizes), reverse=True):
            where = bisect.bisect_left(gaps, size)
            if where == len(gaps):
                return False
            rest = gaps.pop(where) - size
            if rest:
                bisect.insort(gaps, rest)
        return True


class Plan:
    """What the cache decided for one request: every item's key, the entries it shows (pinned),
    the items it computes for the cache, the keys it waits for."""

    __slots__ = ("hits", "keys", "pins", "produce", "waited", "waits")

    def __init__(self, keys: list[bytes], waited: bool = False) -> None:
        self.keys = keys
        self.waited = waited  # it has waited for another request's image (counted once)
        self.hits: dict[int, Entry] = {}
        self.produce: dict[int, bytes] = {}
        self.waits: set[bytes] = set()
        self.pins: list[Entry] = []  # pinned for this request; its reply's lease takes them over

    def frames(self, frames: Sequence) -> tuple:
        """The request's frames as its job carries them: a hit's bytes are not sent."""
        return tuple(b"" if i in self.hits else frame for i, frame in enumerate(frames))

    def kinds(self, kinds: Sequence[str]) -> str:
        return "".join(KIND_BYTES if i in self.hits else kind for i, kind in enumerate(kinds))

    def job_args(self) -> dict[str, Any]:
        known = [[i, e.grid.t, e.grid.h, e.grid.w, e.hash] for i, e in self.hits.items()]
        # A key of raw bytes holds their blake3 digest, whose first 8 bytes are the content hash
        # (mmworker.common.hashing): the worker need not hash those bytes again.
        tag = FINGERPRINT_BYTES  # keys are fingerprint + tag + digest
        hashes = [[i, int.from_bytes(key[tag + 1 : tag + 9], "big")] for i, key in enumerate(self.keys)
                  if i not in self.hits and key[tag : tag + 1] == _TAG_BYTES]  # fmt: skip
        return {ARG_KNOWN: known, ARG_CACHE: sorted(self.produce), ARG_HASHES: hashes}


ADMIT_RUN, ADMIT_WAIT, ADMIT_HIT = "run", "wait", "hit"


class FeatureCache:
    """The cache's index and partitions; see the module docstring. Lives on the pool's thread."""

    def __init__(self, resources: "PoolResources", cache_mib: int, workers: int, spec: Mapping[str, Any],
                 trust_content_hashes: bool) -> None:  # fmt: skip
        self._res = resources
        self._trust = trust_content_hashes
        self.fingerprint = blake3(json.dumps(spec, sort_keys=True).encode(), max_threads=1).digest(FINGERPRINT_BYTES)
        self._share = (cache_mib << 20) // max(1, workers) // ALIGN * ALIGN
        self._workers = workers
        self.partitions: list[Partition] = []
        self._where: dict[bytes, Entry] = {}  # every entry by key
        self._producing: dict[bytes, int] = {}  # key -> rid of the request whose job computes it
        self._waiting: dict[bytes, list[Request]] = {}  # key -> requests waiting for it
        self.resumable: collections.deque[Request] = collections.deque()  # their wait is over: admit again
        self.hits = self.misses = self.evictions = self.deduplicated = 0

    def open(self) -> None:
        """Create the partitions (the pool's resources own them; IpcError if memory is short)."""
        res = self._res
        self.partitions = [Partition(k, *res.new_anonymous(f"cache{k}", self._share)) for k in range(self._workers)]

    # --- admission -------------------------------------------------------------------------------

    def keys(self, req: "Request") -> list[bytes]:
        """Each image's key (see the module docstring); a video has none (never cached, never hashed here)."""
        inputs, fingerprint = req.inputs, self.fingerprint
        caller = inputs.content_hashes if self._trust else None
        keys = []
        images = inputs.images
        for i, (frame, kind) in enumerate(zip(inputs.frames[:images], inputs.kinds[:images], strict=True)):
            text = caller[i] if caller is not None else None
            if isinstance(text, str) and text:
                keys.append(fingerprint + _TAG_CALLER + text.encode())
                continue
            tag = _TAG_BYTES if kind == KIND_BYTES else _TAG_TEXT
            keys.append(fingerprint + tag + blake3(memoryview(frame), max_threads=1).digest(KEY_BYTES))
        return keys

    def admit(self, req: "Request") -> str:
        """Decide `req`'s plan (req.cache): ADMIT_HIT (every image cached and no video: pinned, answer
        it here), ADMIT_WAIT (an image of it is being computed for another request: it waits), or
        ADMIT_RUN (a worker computes its misses and its videos, caching the images no other request
        computes)."""
        plan = req.cache
        plan = req.cache = Plan(self.keys(req)) if plan is None else Plan(plan.keys, plan.waited)
        for i, key in enumerate(plan.keys):
            entry = self._where.get(key)
            if entry is not None:
                plan.hits[i] = entry
            elif key in self._producing:
                plan.waits.add(key)
            elif key not in plan.produce.values():  # the same image twice in one request: cached once
                plan.produce[i] = key
        if plan.waits:
            for key in plan.waits:
                self._waiting.setdefault(key, []).append(req)
            plan.hits.clear()
            plan.produce.clear()
            self.deduplicated += not plan.waited
            plan.waited = True
            return ADMIT_WAIT
        for entry in plan.hits.values():
            self._pin(entry)
            plan.pins.append(entry)
        for key in plan.produce.values():
            self._producing[key] = req.rid
        self.hits += len(plan.hits)
        self.misses += len(plan.keys) - len(plan.hits)
        # A request without images goes to a worker, whose driver rejects it in its own words (or
        # computes its videos).
        whole = plan.keys and len(plan.hits) == len(plan.keys) and not req.inputs.videos
        return ADMIT_HIT if whole else ADMIT_RUN

    def forget(self, req: "Request") -> None:
        """`req` left the table (answered, rejected, cancelled, its worker gone): unpin what it still
        pins, stop its waits, and end the computations it was producing (their waiters resume)."""
        plan = req.cache
        if plan is None:
            return
        for entry in plan.pins:
            self._unpin(entry)
        plan.pins = []
        for key in plan.waits:
            waiters = self._waiting.get(key)
            if waiters is not None and req in waiters:
                waiters.remove(req)
        plan.waits = set()
        self._settle(req.rid, plan.produce.values())

    def _settle(self, rid: int, keys) -> None:
        for key in keys:
            if self._producing.get(key) == rid:
                del self._producing[key]
                for waiter in self._waiting.pop(key, ()):
                    waiter.cache.waits.discard(key)
                    if not waiter.cache.waits:
                        self.resumable.append(waiter)

    # --- results ---------------------------------------------------------------------------------

    def commit(self, slot: "Slot", req: "Request | None", done: Done) -> dict[int, Entry]:
        """Turn the features `done` left in `slot`'s partition into entries (the items `req` was
        producing); frees any there that cannot be one. Returns the new entries by item."""
        partition = self.partitions[slot.index]
        plan = req.cache if req is not None else None
        committed: dict[int, Entry] = {}
        grids = done.meta.get(naming.GRIDS) or []
        hashes = done.meta.get(naming.HASHES) or []
        for name, desc in done.tensors.items():
            if desc.ring != partition.heap:
                continue
            item = naming.feature_item(name)
            key = plan.produce.get(item) if plan is not None and item is not None else None
            try:
                if key is None or key in self._where:
                    raise IpcError(f"tensor {name!r} is not a feature this job was to cache")
                partition.reader.view(desc.offset, desc.nbytes, desc.dtype, desc.shape)  # checks the descriptor
                aux = {}
                prefix = naming.aux_name(item, "")
                for aux_name, aux_desc in done.tensors.items():
                    if aux_name.startswith(prefix):
                        view = slot.reader.view(aux_desc.offset, aux_desc.nbytes, aux_desc.dtype, aux_desc.shape)
                        aux[aux_name[len(prefix) :]] = frozen(view.copy())
                t, h, w = (int(v) for v in grids[item])
                entry = Entry(key, slot.index, desc.offset, desc.seq, desc.nbytes, desc.dtype, tuple(desc.shape),
                              aux, int(hashes[item]), Grid(t, h, w))  # fmt: skip
            except (IpcError, IndexError, KeyError, TypeError, ValueError) as exc:
                log.warning("worker %d: cache tensor %r not kept: %s", slot.index, name, exc)
                partition.evicted.append((desc.offset, desc.seq))
                continue
            self._where[key] = committed[item] = entry
            partition.add(entry)
            partition.largest = max(partition.largest, entry.span)
        if plan is not None:  # a feature it was to cache that found no room went to the ring
            for item in set(plan.produce) - set(committed):
                desc = done.tensors.get(naming.feature_name(item))
                if desc is not None and desc.nbytes <= partition.capacity:  # else it never fits anyway
                    partition.largest = max(partition.largest, desc.nbytes)
        return committed

    def view(self, entry: Entry) -> np.ndarray:
        """A fresh read-only view of an entry's feature (an anchor of its own, as a ring view has)."""
        reader = self.partitions[entry.worker].reader
        return reader.view(entry.offset, entry.nbytes, entry.dtype, entry.shape)

    @staticmethod
    def aux(entry: Entry) -> dict[str, np.ndarray]:
        """An entry's aux tensors for one reply: copies of its own (tiny), so that a reply's views
        end with the reply, never with the entry (mmworker.pool.drops)."""
        return {name: frozen(value.copy()) for name, value in entry.aux.items()}

    def pin(self, entries: list[Entry]) -> None:
        for entry in entries:
            self._pin(entry)

    def unpin(self, entries: list[Entry]) -> None:
        for entry in entries:
            self._unpin(entry)

    def _pin(self, entry: Entry) -> None:
        entry.pins += 1
        partition = self.partitions[entry.worker]
        if entry.key in partition.entries:  # most recently used last
            partition.entries.move_to_end(entry.key)

    def _unpin(self, entry: Entry) -> None:
        entry.pins -= 1

    def prepare(self, slot: "Slot", plan: Plan) -> None:
        """Before `slot`'s worker gets a job that caches `plan.produce`: evict the least recently
        used unpinned entries of its partition until that many of the largest feature seen there
        would find room in its free gaps (contiguous room: evicting just enough bytes would leave
        them scattered, and large features would miss the cache), and send the worker the
        evictions (its inbox gives them to it before the job). The worker is idle, so the entries
        are all it holds there."""
        partition = self.partitions[slot.index]
        need = [partition.largest] * len(plan.produce) if partition.largest else []
        if need and not partition.fits(need):
            for entry in list(partition.entries.values()):
                if entry.pins:
                    continue
                partition.evict(entry)
                del self._where[entry.key]
                self.evictions += 1
                if partition.fits(need):
                    break
        self.flush(slot)

    def flush(self, slot: "Slot") -> None:
        """Send `slot`'s worker the partition space evicted since (as far as its inbox has room)."""
        partition = self.partitions[slot.index]
        if not partition.evicted or not slot.ready:
            return
        inbox = self._res.inboxes[slot.index]
        try:
            while partition.evicted and inbox.send(Release(partition.heap, partition.evicted[:EVICTIONS_PER_RECORD])):
                del partition.evicted[:EVICTIONS_PER_RECORD]
        except ChannelClosed:  # it is gone: its next incarnation is told what is live instead
            pass

    def claims(self, index: int) -> tuple[int, int, list[tuple[int, int, int]]]:
        """For a new worker of slot `index`: its partition's descriptor, ring id, and (offset, nbytes,
        seq) of every live entry, which it must not reuse. Evictions not yet sent are moot now."""
        partition = self.partitions[index]
        partition.evicted = []
        live = [(e.offset, e.nbytes, e.seq) for e in partition.entries.values()]
        return partition.fd, partition.heap, live

    def close(self) -> None:
        """After the pool's resources are closed: drop this side's views of the partitions, so that
        they are unmapped now (or when the last reply still viewing one lets go of it)."""
        self.partitions = []
        self._where.clear()

    # --- reporting -------------------------------------------------------------------------------

    @property
    def bytes_held(self) -> int:  # 0 once closed
        return sum(p.used for p in self.partitions)

    @property
    def capacity(self) -> int:
        return sum(p.capacity for p in self.partitions)

    def __len__(self) -> int:
        return len(self._where)


def frozen(array: np.ndarray) -> np.ndarray:
    """`array`, made read-only (what a reply hands out)."""
    array.flags.writeable = False
    return array
