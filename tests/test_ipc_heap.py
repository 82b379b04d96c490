"""ipc.heap: best-fit placement and coalescing against a model, release checks, taking a heap over, another process's view."""

import hashlib
import json
import random
import subprocess
import sys

import numpy as np
import pytest
from processes import segments_of

from ipc.errors import AllocationTooLarge, IpcError
from ipc.heap import HeapWriter
from ipc.ring import ALIGN, Allocation, RingReader
from ipc.segment import Segment, new_name

CAPACITY = 256 * 1024


@pytest.fixture(autouse=True)
def no_leaks():
    before = segments_of()
    yield
    assert segments_of() == before, "a test left a segment in /dev/shm"


@pytest.fixture
def heap():
    seg = Segment.create(new_name("heap"), CAPACITY)
    reader_seg = Segment.attach(seg.name, writable=False)
    seg.unlink()
    writer, reader = HeapWriter(seg, 3), RingReader(reader_seg, 3)
    yield writer, reader
    del writer, reader
    seg.close()
    reader_seg.close()


def aligned(nbytes: int) -> int:
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


class Model:
    """What a best-fit heap must do, found the slow way: a map of the ALIGN-byte units (0 free, else
    the seq holding it), its free runs scanned afresh for every question."""

    def __init__(self, capacity: int) -> None:
        self.owner = np.zeros(capacity // ALIGN, np.int64)

    def free_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """(first unit, length in units) of every maximal run of free units, in address order."""
        edges = np.diff(np.concatenate(([0], (self.owner == 0).astype(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        return starts, ends - starts

    def best_fit(self, size: int) -> int | None:
        starts, lengths = self.free_runs()
        fitting = np.flatnonzero(lengths >= size // ALIGN)
        if not fitting.size:
            return None
        smallest = lengths[fitting].min()
        return int(starts[fitting][lengths[fitting] == smallest].min()) * ALIGN  # ties: the lowest offset

    def largest_free(self) -> int:
        _, lengths = self.free_runs()
        return int(lengths.max(initial=0)) * ALIGN

    def mark(self, a: Allocation, seq: int) -> None:
        units = self.owner[a.offset // ALIGN : (a.offset + aligned(a.nbytes)) // ALIGN]
        assert (units == 0).all(), f"{a} overlaps live allocations {set(units[units != 0].tolist())}"
        units[...] = seq

    def unmark(self, a: Allocation) -> None:
        self.owner[a.offset // ALIGN : (a.offset + aligned(a.nbytes)) // ALIGN] = 0


def fill_byte(a: Allocation) -> int:
    return a.seq % 251 + 1


def holds(reader: RingReader, a: Allocation, byte: int) -> bool:
    return bool((reader.view(a.offset, a.nbytes, "|u1", (a.nbytes,)) == byte).all())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_allocations_and_releases_match_a_best_fit_model(heap, seed):
    writer, reader = heap
    rng = random.Random(seed)
    model = Model(writer.capacity)
    live: list[Allocation] = []
    gone: list[Allocation] = []
    peak = 0
    for step in range(3000):
        if rng.random() < 0.55:
            # Mostly small entries, some large ones: the heap runs full and fragments.
            nbytes = rng.choice([rng.randint(0, 300), rng.randint(1, 4000), rng.randint(4000, 40000)])
            expected = model.best_fit(aligned(nbytes))
            a = writer.try_allocate(nbytes)
            if expected is None:
                assert a is None, f"step {step}: {nbytes} bytes placed at {a} though no free extent fits"
                continue
            assert a is not None, f"step {step}: {nbytes} bytes refused though [{expected}, ...) is free"
            assert a.offset == expected, f"step {step}: {nbytes} bytes at {a.offset}, the best fit is {expected}"
            assert a.offset % ALIGN == 0 and a.offset >= 0 and a.offset + aligned(nbytes) <= writer.capacity
            assert a.nbytes == nbytes and a.ring == 3
            model.mark(a, a.seq)
            writer.array(a, "|u1", (nbytes,))[...] = fill_byte(a)
            live.append(a)
        elif live:
            a = live.pop(rng.randrange(len(live)))
            assert holds(reader, a, fill_byte(a)), f"step {step}: {a} was overwritten while live"
            assert writer.release(a.offset, a.seq)
            model.unmark(a)
            gone.append(a)
        if gone and rng.random() < 0.1:  # a repeated or stale release changes nothing
            stale = rng.choice(gone)
            before = writer.stats()
            assert not writer.release(stale.offset, stale.seq)
            assert writer.stats() == before
        stats = writer.stats()
        used = sum(aligned(a.nbytes) for a in live)
        peak = max(peak, used)
        assert (stats.used, stats.live, stats.peak_used) == (used, len(live), peak)
        assert stats.largest_free == model.largest_free()
        if step % 100 == 0:
            assert all(holds(reader, a, fill_byte(a)) for a in live)
    assert len(gone) > 500 and writer.stats().peak_used > writer.capacity * 0.9  # it ran full and churned
    for a in live:
        assert holds(reader, a, fill_byte(a))
        assert writer.release(a.offset, a.seq)
    stats = writer.stats()
    assert stats.used == 0 and stats.live == 0 and stats.largest_free == writer.capacity  # coalesced back whole
    whole = writer.try_allocate(writer.capacity)
    assert whole.offset == 0


def test_a_freed_extent_is_reused_at_once_in_any_order_and_merges_with_free_neighbours(heap):
    writer, _ = heap
    quarter = writer.capacity // 4
    a, b, c, d = (writer.try_allocate(quarter) for _ in range(4))
    assert [x.offset for x in (a, b, c, d)] == [0, quarter, 2 * quarter, 3 * quarter]
    assert writer.try_allocate(1) is None
    # A ring gets space back only from its oldest end; here the second allocation's space is
    # reusable the moment it is released, while older and newer ones stay live.
    assert writer.release(b.offset, b.seq)
    b2 = writer.try_allocate(quarter)
    assert b2.offset == quarter and b2.seq > d.seq
    # Neighbours merge whichever order they are freed in: c, then a, then b2 between them.
    assert writer.release(c.offset, c.seq) and writer.release(a.offset, a.seq)
    assert writer.stats().largest_free == quarter
    assert writer.try_allocate(quarter + 1) is None
    assert writer.release(b2.offset, b2.seq)
    assert writer.stats().largest_free == 3 * quarter
    big = writer.try_allocate(3 * quarter)
    assert big.offset == 0
    assert writer.release(d.offset, d.seq)
    assert writer.stats().largest_free == quarter  # d merged with the end of the heap only
    assert writer.release(big.offset, big.seq)
    assert writer.stats().largest_free == writer.capacity


def test_best_fit_takes_the_smallest_extent_that_fits(heap):
    writer, _ = heap
    # Holes of 3, 1, 2 and 2 units (of 64 bytes), separated by live allocations, then the free rest.
    layout = [("hole", 3), ("wall", 1), ("hole", 1), ("wall", 1), ("hole", 2), ("wall", 1), ("hole", 2), ("wall", 1)]
    placed = [(kind, writer.try_allocate(units * ALIGN)) for kind, units in layout]
    for kind, a in placed:
        if kind == "hole":
            assert writer.release(a.offset, a.seq)
    three, one, two, two_later = (a.offset for kind, a in placed if kind == "hole")
    rest = sum(units for _, units in layout) * ALIGN
    assert writer.try_allocate(128).offset == two  # not the 3-unit hole first in memory (first fit would)
    assert writer.try_allocate(100).offset == two_later  # 128 bytes: the other 2-unit hole
    assert writer.try_allocate(1).offset == one
    assert writer.try_allocate(150).offset == three
    assert writer.try_allocate(0).offset == rest  # every hole is taken: the free rest of the heap
    assert writer.stats().largest_free == writer.capacity - rest - ALIGN


def test_release_must_name_a_live_allocation(heap):
    writer, _ = heap
    a = writer.try_allocate(100)
    b = writer.try_allocate(200)
    before = writer.stats()
    for offset, seq in [
        (a.offset, a.seq + 7),  # a wrong seq: stale or forged
        (a.offset + ALIGN, a.seq),  # inside a live allocation, not its start
        (b.offset, a.seq),  # another live allocation's seq
        (writer.capacity, 1),
        (-ALIGN, a.seq),
        (4096, 1),  # free space
    ]:
        assert not writer.release(offset, seq), (offset, seq)
        assert writer.stats() == before
    assert writer.release(a.offset, a.seq)
    after = writer.stats()
    assert not writer.release(a.offset, a.seq)  # a double release is a no-op
    assert writer.stats() == after
    c = writer.try_allocate(100)  # reuses a's space at once...
    assert c.offset == a.offset
    assert not writer.release(a.offset, a.seq)  # ...so a late release of a must not free c
    assert writer.stats().live == 2
    assert writer.release(c.offset, c.seq) and writer.release(b.offset, b.seq)
    assert writer.stats().used == 0 and writer.stats().largest_free == writer.capacity


def test_a_new_writer_claims_the_live_entries_and_allocates_around_them():
    # A restarted worker takes over its cache partition: a fresh writer on the same segment, told
    # by the client which entries it still holds.
    seg = Segment.create(new_name("heap"), CAPACITY)
    successor_seg = Segment.attach(seg.name, writable=True)
    reader_seg = Segment.attach(seg.name, writable=False)
    seg.unlink()
    rng = random.Random(7)
    try:
        first = HeapWriter(seg, 5)
        held = []
        while (a := first.try_allocate(rng.randint(1, 9000))) is not None:
            first.array(a, "|u1", (a.nbytes,))[...] = fill_byte(a)
            held.append(a)
        for a in rng.sample(held, len(held) // 2):  # the client evicted these before the worker died
            held.remove(a)
            first.release(a.offset, a.seq)
        used = first.stats().used
        del first

        successor, reader = HeapWriter(successor_seg, 5), RingReader(reader_seg, 5)
        for a in rng.sample(held, len(held)):  # claims come in any order
            assert successor.claim(a.offset, a.nbytes, a.seq) == a
        stats = successor.stats()
        assert (stats.used, stats.live, stats.allocations) == (used, len(held), len(held))
        top = max(a.seq for a in held)
        fresh = []
        while (b := successor.try_allocate(rng.randint(1, 3000))) is not None:
            assert b.seq > top  # a release of a claimed entry can never name a fresh one
            for a in held:
                assert b.offset + aligned(b.nbytes) <= a.offset or a.offset + aligned(a.nbytes) <= b.offset, (a, b)
            successor.array(b, "|u1", (b.nbytes,))[...] = 0xEE
            fresh.append(b)
        assert fresh and successor.stats().used > used
        for a in held:
            assert holds(reader, a, fill_byte(a)), f"claimed {a} was overwritten"
            for b in fresh:
                assert not successor.release(b.offset, a.seq)
        for a in held + fresh:
            assert successor.release(a.offset, a.seq)
        assert successor.stats().largest_free == successor.capacity
        del successor, reader
    finally:
        seg.close()
        successor_seg.close()
        reader_seg.close()


def test_claim_refuses_overlaps_misalignment_and_the_outside(heap):
    writer, _ = heap
    first = writer.claim(0, 1000, 4)  # [0, 1024)
    assert first == Allocation(3, 0, 1000, 4)
    assert writer.claim(1024, 1, 2).offset == 1024  # adjacent is fine; an older seq too
    writer.claim(2048, 64, 9)
    before = writer.stats()
    for args, message in [
        ((0, 64, 10), r"\[0, 64\): it overlaps the live allocation \[0, 1024\) \(seq 4\)"),
        ((960, 200, 10), r"\[960, 1216\): it overlaps the live allocation \[0, 1024\)"),
        ((1088, 2000, 10), r"\[1088, 3136\): it overlaps the live allocation \[2048, 2112\) \(seq 9\)"),
        ((32, 64, 10), r"offset 32: not 64-byte aligned"),
        ((-64, 64, 10), r"\[-64, 0\): outside the 262144-byte heap"),
        ((CAPACITY - 64, 65, 10), r"\[262080, 262208\): outside"),
        ((4096, -1, 10), r"cannot claim -1 bytes"),
        ((4096, 64, 0), r"with seq 0"),
    ]:
        with pytest.raises(IpcError, match=message):
            writer.claim(*args)
        assert writer.stats() == before
    after = writer.try_allocate(1)
    assert after.seq == 10  # above every claimed seq, not just the last claimed
    assert after.offset == 1088  # the best fit: the 960-byte hole between the claims
    assert writer.stats().allocations == 4  # three claims and one allocation; refused claims count nothing


def test_allocation_larger_than_the_heap(heap):
    writer, _ = heap
    with pytest.raises(
        AllocationTooLarge, match=r"allocation of 262145 bytes is larger than the heap \(262144 bytes\)"
    ):
        writer.try_allocate(CAPACITY + 1)
    with pytest.raises(IpcError, match="negative size"):
        writer.try_allocate(-1)
    a = writer.try_allocate(256)
    with pytest.raises(IpcError, match=r"heap 3: \(100,\) float32 does not fit a 256-byte allocation"):
        writer.array(a, "<f4", (100,))
    assert writer.array(a, "<f4", (8, 8)).shape == (8, 8)
    assert writer.release(a.offset, a.seq)
    whole = writer.try_allocate(CAPACITY)
    assert whole.offset == 0 and writer.try_allocate(0) is None


def test_the_writer_needs_a_writable_mapping_of_room_for_one_allocation():
    seg = Segment.create(new_name("heap"), 4096 + 60)
    tiny = Segment.create(new_name("heap"), ALIGN - 1)
    reader_seg = Segment.attach(seg.name, writable=False)
    seg.unlink()
    tiny.unlink()
    try:
        with pytest.raises(IpcError, match=r"heap 1: the writer needs a writable mapping of mmw-"):
            HeapWriter(reader_seg, 1)
        with pytest.raises(IpcError, match=r"\(63 bytes\) cannot hold one 64-byte allocation"):
            HeapWriter(tiny, 1)
        writer = HeapWriter(seg, 1)  # the tail short of ALIGN stays unused
        assert writer.capacity == 4096 and writer.stats().largest_free == 4096
        del writer
    finally:
        seg.close()
        tiny.close()
        reader_seg.close()


READER = """
import hashlib, json, sys
from ipc.ring import RingReader
from ipc.segment import Segment
segment = Segment.attach(sys.argv[1], writable=False)
reader = RingReader(segment, 0)
out = []
for offset, nbytes, dtype, shape in json.loads(sys.argv[2]):
    view = reader.view(offset, nbytes, dtype, tuple(shape))
    out.append([hashlib.sha256(view.tobytes()).hexdigest(), float(view.astype("f8").sum())])
print(json.dumps(out))
"""


def test_a_reader_in_another_process_sees_what_the_writer_wrote():
    seg = Segment.create(new_name("heap"), CAPACITY)
    try:
        writer = HeapWriter(seg, 0)
        rng = np.random.default_rng(11)
        entries = []  # (allocation, dtype, shape)
        for dtype, shape in [("<f4", (37, 19)), ("<u2", (1000,)), ("<f4", (64, 64)), ("<i8", (3,)), ("|u1", (999,))]:
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            entries.append((writer.try_allocate(nbytes), dtype, shape))
        # Evict two from the middle and fill their space with others, as the cache would.
        evicted = [entries.pop(1)[0], entries.pop(2)[0]]  # the 2000-byte and the 24-byte entries
        for a in evicted:
            assert writer.release(a.offset, a.seq)
        for dtype, shape in [("<u2", (500,)), ("<f4", (10, 10))]:
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            entries.append((writer.try_allocate(nbytes), dtype, shape))
        # Both fit the 2048-byte hole, the best fit each time; the 64-byte hole is too small.
        assert [a.offset for a, _, _ in entries[-2:]] == [evicted[0].offset, evicted[0].offset + 1024]
        expected = []
        for a, dtype, shape in entries:
            out = writer.array(a, dtype, shape)
            out[...] = rng.integers(0, 250, size=shape).astype(dtype)
            expected.append([hashlib.sha256(out.tobytes()).hexdigest(), float(out.astype("f8").sum())])
        descriptors = [[a.offset, a.nbytes, dtype, list(shape)] for a, dtype, shape in entries]
        child = subprocess.run(
            [sys.executable, "-c", READER, seg.name, json.dumps(descriptors)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.returncode == 0, child.stderr
        assert json.loads(child.stdout) == expected
        del writer, out
    finally:
        seg.unlink()
        seg.close()
