"""Shared-memory heaps: a writer's any-order allocator over its own segment (best fit, space reusable at once).

A heap is the ring's sibling for long-lived entries freed in any order (mmworker's feature cache:
the client evicts entries in LRU order, and each evicted entry's space must be reusable at once).
A ring (`ipc.ring.RingWriter`) reclaims space only from its oldest end, so one old live entry would
hold back everything allocated after it; a heap reuses any extent as soon as its release arrives.

It keeps the ring's conventions, so the rest of ipc treats both alike:
- one writer per segment, all bookkeeping in the writer's private memory: the segment holds
  payload bytes only, so nothing a reader writes or a crash leaves behind can corrupt the allocator;
- allocations are `ipc.ring.Allocation(ring, offset, nbytes, seq)`, 64-byte aligned, and a reader
  frees one with a release message naming (offset, seq) (a `Release` whose `ring` is the heap's
  id); a release naming no live allocation (unknown, stale or repeated) is refused, changing nothing;
- an allocation becomes visible to a reader only through a message sent after the writer filled it,
  and its space is reused only after the reader's release, so no cross-process lock exists;
- readers map the segment read-only and take checked views with `ipc.ring.RingReader`, whose
  checks (bounds, alignment, dtype, shape) hold for any segment.

Free space is kept as maximal extents, free neighbours merged as soon as a release frees the space
between them, in two sorted lists: offsets (with a size per offset), where `bisect` finds a freed
region's neighbours, and (size, offset) pairs, where `bisect` finds the best fit, the smallest
extent that fits (the lowest offset among equals). Best fit keeps large extents whole for large
features; an allocation takes the start of its extent and leaves the rest free. Inserting into or
deleting from a list of tens of thousands of entries is one memmove of pointers, cheaper than a
balanced tree in Python. The capacity is the segment's size rounded down to ALIGN, so every
extent's offset and size are multiples of ALIGN and no padding ever hides inside the free lists.

Taking over (`claim`): a writer that replaces a dead one on the same segment starts with everything
free; the client, which knows the entries it still holds, lists them and each claim marks one live
again (refused if misaligned, outside the heap, or overlapping anything live). Allocations made
afterwards are numbered above every claimed seq, so a release of a claimed entry never frees a new
allocation at the same offset. Releases the old writer never received, for entries the client did
not claim, must not be passed on to the new writer: their seqs may be numbered anew.
"""

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

import numpy as np

from ipc.errors import AllocationTooLarge, IpcError
from ipc.ring import ALIGN, Allocation, aligned_size, allocation_array
from ipc.segment import Segment


@dataclass(frozen=True)
class HeapStats:
    """A snapshot of a heap's occupancy; `largest_free` is the largest aligned size an allocation could have now."""

    capacity: int
    used: int
    live: int
    peak_used: int
    allocations: int  # made by try_allocate or claim, over the writer's life
    largest_free: int


class HeapWriter:
    """The single writer's any-order allocator over a writable segment."""

    def __init__(self, segment: Segment, ring: int) -> None:
        if not segment.writable:
            raise IpcError(f"heap {ring}: the writer needs a writable mapping of {segment.name}")
        capacity = segment.size - segment.size % ALIGN
        if capacity == 0:
            raise IpcError(
                f"heap {ring}: {segment.name} ({segment.size} bytes) cannot hold one {ALIGN}-byte allocation"
            )
        self.ring = ring
        self.capacity = capacity
        self._bytes = np.frombuffer(segment.buffer, np.uint8)
        self._starts = [0]  # offsets of the free extents, ascending
        self._sizes = {0: capacity}  # free extent's offset -> its size
        self._fits = [(capacity, 0)]  # (size, offset) of every free extent, ascending
        self._live: dict[int, tuple[int, int]] = {}  # live allocation's offset -> (aligned size, seq)
        self._seq = 0
        self._used = 0
        self._peak = 0
        self._allocations = 0

    def try_allocate(self, nbytes: int) -> Allocation | None:
        """A fresh allocation of at least nbytes in the smallest free extent that fits, or None if none does now."""
        if nbytes < 0:
            raise IpcError(f"heap {self.ring}: cannot allocate a negative size ({nbytes} bytes)")
        size = aligned_size(nbytes)
        if size > self.capacity:
            raise AllocationTooLarge(
                f"heap {self.ring}: an allocation of {nbytes} bytes is larger than the heap ({self.capacity} bytes)"
            )
        fits = self._fits
        i = bisect_left(fits, (size,))  # (size,) sorts before every (size, offset)
        if i == len(fits):
            return None
        extent, offset = fits[i]
        del fits[i]
        if extent == size:
            del self._starts[bisect_left(self._starts, offset)]
            del self._sizes[offset]
        else:  # the rest of the extent stays free, in the same place among the offsets
            rest = offset + size
            self._starts[bisect_left(self._starts, offset)] = rest
            del self._sizes[offset]
            self._sizes[rest] = extent - size
            insort(fits, (extent - size, rest))
        self._seq += 1
        return self._mark_live(offset, nbytes, size, self._seq)

    def release(self, offset: int, seq: int) -> bool:
        """Free an allocation, merging it with free neighbours; False (nothing changes) unless
        (offset, seq) names a live allocation."""
        entry = self._live.get(offset)
        if entry is None or entry[1] != seq:
            return False
        del self._live[offset]
        size = entry[0]
        self._used -= size
        starts, sizes, fits = self._starts, self._sizes, self._fits
        start, end = offset, offset + size
        i = bisect_left(starts, offset)  # the first free extent after the freed region
        if i < len(starts) and starts[i] == end:  # the next extent is free: absorb it
            after = sizes.pop(end)
            del fits[bisect_left(fits, (after, end))]
            del starts[i]
            end += after
        if i > 0 and starts[i - 1] + sizes[starts[i - 1]] == offset:  # the previous extent is free: grow it
            start = starts[i - 1]
            del fits[bisect_left(fits, (sizes[start], start))]
        else:
            starts.insert(i, start)
        sizes[start] = end - start
        insort(fits, (end - start, start))
        return True

    def claim(self, offset: int, nbytes: int, seq: int) -> Allocation:
        """Mark live a region an earlier writer of this segment allocated (and its reader still holds).

        IpcError if the region is misaligned, outside the heap or overlaps anything live, or seq is
        not positive; allocations made afterwards get seqs above `seq`.
        """
        if nbytes < 0 or seq < 1:
            raise IpcError(f"heap {self.ring}: cannot claim {nbytes} bytes with seq {seq} (sizes >= 0, seqs >= 1)")
        if offset % ALIGN:
            raise IpcError(f"heap {self.ring}: cannot claim offset {offset}: not {ALIGN}-byte aligned")
        size = aligned_size(nbytes)
        end = offset + size
        if offset < 0 or end > self.capacity:
            raise IpcError(f"heap {self.ring}: cannot claim [{offset}, {end}): outside the {self.capacity}-byte heap")
        starts, sizes = self._starts, self._sizes
        i = bisect_right(starts, offset) - 1  # the free extent starting at or before offset
        if i < 0 or starts[i] + sizes[starts[i]] < end:
            # Everything that is not free is live, so some live allocation overlaps: name the first.
            other = min(o for o, (s, _) in self._live.items() if o < end and offset < o + s)
            other_size, other_seq = self._live[other]
            raise IpcError(
                f"heap {self.ring}: cannot claim [{offset}, {end}): it overlaps the live allocation "
                f"[{other}, {other + other_size}) (seq {other_seq})"
            )
        start = starts[i]
        extent = sizes.pop(start)
        del starts[i]
        del self._fits[bisect_left(self._fits, (extent, start))]
        for piece_start, piece_end in ((end, start + extent), (start, offset)):  # after, then before: ascending
            if piece_end > piece_start:
                starts.insert(i, piece_start)
                sizes[piece_start] = piece_end - piece_start
                insort(self._fits, (piece_end - piece_start, piece_start))
        self._seq = max(self._seq, seq)
        return self._mark_live(offset, nbytes, size, seq)

    def _mark_live(self, offset: int, nbytes: int, size: int, seq: int) -> Allocation:
        self._live[offset] = (size, seq)
        self._used += size
        self._peak = max(self._peak, self._used)
        self._allocations += 1
        return Allocation(self.ring, offset, nbytes, seq)

    def array(self, allocation: Allocation, dtype: np.dtype | str, shape: tuple[int, ...]) -> np.ndarray:
        """A writable C-contiguous array over an allocation (the writer fills an entry here)."""
        return allocation_array(self._bytes, allocation, dtype, shape, f"heap {self.ring}")

    def stats(self) -> HeapStats:
        largest = self._fits[-1][0] if self._fits else 0
        return HeapStats(self.capacity, self._used, len(self._live), self._peak, self._allocations, largest)
