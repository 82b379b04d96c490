"""Shared-memory rings: the writer's allocator over its own segment, and the reader's checked views.

One ring per writer process, one writer per ring, so no cross-process lock exists anywhere:

    writer process                                   reader process
    RingWriter(segment rw) --- allocate, fill ---->  bytes in the segment
            ^                                        RingReader(segment ro).view(desc) -> numpy view
            |                                                  |
            +------- release(offset, seq) message <------------+  (when the consumer is done)

All bookkeeping lives in the writer's private memory; the segment holds payload bytes only, so
correctness never depends on the ordering of stores to shared flag words. An allocation becomes
visible to the reader only through a message sent after the writer finished filling it (the
socket's send and receive are the synchronisation; in mmworker's pool a worker's Done on
ipc.results), and its space is reused only after the reader's release message arrives (there, a
Release, or the `released` field of the worker's next Job, in the worker's inbox: ipc.inbox; for
the client's own request ring, which workers read, the job's answer says it). Nothing is ever
overwritten while live.

Allocation (the writer): 64-byte aligned, contiguous, in ring order. Allocations may be released in
any order; space is reclaimed from the oldest end as soon as the oldest live allocation is released
(so an aborted request's space comes back once everything older is gone too). When the tail of the
segment is too short for an allocation, the allocation starts over at offset 0 and the short tail
stays unused until the ring wraps past it.
"""

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ipc.errors import AllocationTooLarge, IpcError, RingFull
from ipc.segment import Segment

ALIGN = 64
# dtypes a reader accepts in a descriptor; anything else is refused before a view is made.
DTYPES = frozenset({"|u1", "<u2", "<i4", "<i8", "<f2", "<f4", "<f8"})
_DTYPE_OBJECTS = {name: np.dtype(name) for name in DTYPES}  # parsed once: views are made per reply


def aligned_size(nbytes: int) -> int:
    """The space an allocation of `nbytes` takes in a ring or heap: ALIGN-rounded, at least ALIGN."""
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


@dataclass(frozen=True)
class Allocation:
    """One live region of a ring: where it is, how big, and its sequence number (for releases)."""

    ring: int
    offset: int
    nbytes: int
    seq: int


@dataclass(frozen=True)
class RingStats:
    """A snapshot of a ring's occupancy."""

    capacity: int
    used: int
    live: int
    peak_used: int
    allocations: int
    full_waits: int


class _Entry:
    __slots__ = ("freed", "offset", "seq", "size")

    def __init__(self, offset: int, size: int, seq: int) -> None:
        self.offset, self.size, self.seq, self.freed = offset, size, seq, False


class RingWriter:
    """The single writer's allocator over a writable segment."""

    def __init__(self, segment: Segment, ring: int) -> None:
        if not segment.writable:
            raise IpcError(f"ring {ring}: the writer needs a writable mapping of {segment.name}")
        self.ring = ring
        self.capacity = segment.size
        self._bytes = np.frombuffer(segment.buffer, np.uint8)
        self._raw = segment.buffer  # a writable memoryview: plain byte copies without numpy
        self._live: collections.deque[_Entry] = collections.deque()
        self._by_offset: dict[int, _Entry] = {}
        self._head = 0
        self._seq = 0
        self._used = 0
        self._peak = 0
        self._full_waits = 0

    def try_allocate(self, nbytes: int) -> Allocation | None:
        """A fresh allocation of at least nbytes, or None if the ring has no room right now."""
        size = aligned_size(nbytes)
        if size > self.capacity:
            raise AllocationTooLarge(
                f"ring {self.ring}: an allocation of {nbytes} bytes is larger than the ring ({self.capacity} bytes)"
            )
        offset = self._place(size)
        if offset is None:
            return None
        self._seq += 1
        entry = _Entry(offset, size, self._seq)
        self._live.append(entry)
        self._by_offset[offset] = entry
        self._head = offset + size
        self._used += size
        self._peak = max(self._peak, self._used)
        return Allocation(self.ring, offset, nbytes, self._seq)

    def _place(self, size: int) -> int | None:
        if not self._live:
            self._head = 0
            return 0
        tail = self._live[0].offset
        if self._head > tail:  # live data is [tail, head): room after head, then before tail
            if self._head + size <= self.capacity:
                return self._head
            return 0 if size <= tail else None
        # wrapped: live data is [tail, capacity) and [0, head); room only in [head, tail)
        return self._head if self._head + size <= tail else None

    def allocate(self, nbytes: int, deadline: float, wait: Callable[[float], None]) -> Allocation:
        """Allocate, calling `wait(seconds)` (which should apply incoming releases) while the ring is full.

        Raises RingFull ("shared memory full") at `deadline` (a time.monotonic() value).
        """
        allocation = self.try_allocate(nbytes)
        if allocation is not None:
            return allocation
        self._full_waits += 1
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RingFull(
                    f"shared memory full: ring {self.ring} has no room for {nbytes} bytes "
                    f"({self._used} of {self.capacity} bytes held by {len(self._live)} live allocation(s))"
                )
            wait(remaining)
            allocation = self.try_allocate(nbytes)
            if allocation is not None:
                return allocation

    def release(self, offset: int, seq: int) -> bool:
        """Free an allocation; False (nothing changes) if (offset, seq) names no live allocation."""
        entry = self._by_offset.get(offset)
        if entry is None or entry.seq != seq or entry.freed:
            return False
        entry.freed = True
        while self._live and self._live[0].freed:
            done = self._live.popleft()
            del self._by_offset[done.offset]
            self._used -= done.size
        if not self._live:
            self._head = 0
        return True

    def write(self, allocation: Allocation, at: int, data: bytes | bytearray | memoryview | np.ndarray) -> int:
        """Copy C-contiguous `data` to `at` bytes into `allocation`; returns the bytes written."""
        raw = memoryview(data).cast("B")
        start = allocation.offset + at
        if at < 0 or at + raw.nbytes > allocation.nbytes:
            raise IpcError(
                f"ring {self.ring}: {raw.nbytes} bytes at {at} do not fit a {allocation.nbytes}-byte allocation"
            )
        self._raw[start : start + raw.nbytes] = raw
        return raw.nbytes

    def array(self, allocation: Allocation, dtype: np.dtype | str, shape: tuple[int, ...]) -> np.ndarray:
        """A writable C-contiguous array over an allocation (the writer fills its output here)."""
        return allocation_array(self._bytes, allocation, dtype, shape, f"ring {self.ring}")

    def stats(self) -> RingStats:
        return RingStats(self.capacity, self._used, len(self._live), self._peak, self._seq, self._full_waits)


def allocation_array(
    memory: np.ndarray, allocation: Allocation, dtype: np.dtype | str, shape: tuple[int, ...], owner: str
) -> np.ndarray:
    """A writable C-contiguous `dtype[shape]` array over `allocation` of a writer's `memory` (its
    segment as uint8); IpcError naming `owner` if it does not fit the allocation."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count * dt.itemsize > allocation.nbytes:
        raise IpcError(f"{owner}: {shape} {dt} does not fit a {allocation.nbytes}-byte allocation")
    return np.frombuffer(memory, dt, count, allocation.offset).reshape(shape)


class RingReader:
    """A reader's read-only mapping of a ring, handing out bounds-checked zero-copy views.

    Each view stands on an anchor of its own: `view.base`, a flat array over a memoryview of the
    mapping that no other view shares. numpy points every array derived from a view (slices,
    reshapes, views of views) at that anchor, never past it to the mapping (a chain of array bases
    stops at the first base that is not an array), and the anchor's memoryview pins the mapping.
    So the anchor lives exactly as long as something still sees the view's bytes, and a weak
    reference to it tells when the last of them is gone (mmworker's `Reply.release_on_drop`).
    """

    def __init__(self, segment: Segment, ring: int) -> None:
        self.ring = ring
        self.capacity = segment.size
        self.segment = segment
        self._buffer = segment.buffer
        self._read_only = self._buffer.readonly  # then every view of it is read-only too

    def view(self, offset: int, nbytes: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        """A read-only view of `nbytes` at `offset` as `dtype[shape]`; IpcError if anything is off.

        Checks, before any view exists: the dtype is allowed, the shape is non-negative and its
        byte size is exactly nbytes, and [offset, offset + nbytes) lies inside the segment.
        """
        dt = _DTYPE_OBJECTS.get(dtype) if isinstance(dtype, str) else None
        if dt is None:
            raise IpcError(f"ring {self.ring}: dtype {dtype!r} is not allowed")
        count = 1
        for dim in shape:
            if dim < 0:
                raise IpcError(f"ring {self.ring}: negative dimension in shape {shape}")
            count *= dim
        if count * dt.itemsize != nbytes:
            raise IpcError(f"ring {self.ring}: shape {shape} of {dtype} is not {nbytes} bytes")
        if offset < 0 or offset % ALIGN or nbytes < 0 or offset + nbytes > self.capacity:
            raise IpcError(
                f"ring {self.ring}: region [{offset}, {offset + nbytes}) is outside the {self.capacity}-byte ring"
            )
        anchor = np.frombuffer(self._buffer, dt, count, offset)  # a fresh memoryview of its own as its base
        if not self._read_only:
            anchor.flags.writeable = False
        return anchor.reshape(shape)
