"""ipc.segment and ipc.ring: segment lifecycle, allocator invariants, checked reader views."""

import os
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from processes import segments_of

from ipc.errors import AllocationTooLarge, IpcError, RingFull, SharedMemoryError
from ipc.inbox import Inbox, InboxReader
from ipc.ring import ALIGN, RingReader, RingWriter
from ipc.segment import SHM_DIR, Segment, free_bytes, new_name, sweep_stale
from ipc.wire import Release


@pytest.fixture(autouse=True)
def no_leaks():
    before = segments_of()
    yield
    assert segments_of() == before, "a test left a segment in /dev/shm"


@pytest.fixture
def ring():
    seg = Segment.create(new_name("test"), 64 * 1024)
    reader_seg = Segment.attach(seg.name, writable=False)
    seg.unlink()
    writer, reader = RingWriter(seg, 0), RingReader(reader_seg, 0)
    yield writer, reader
    del writer, reader
    seg.close()
    reader_seg.close()


def test_segment_mode_name_and_unlink():
    seg = Segment.create(new_name("mode"), 4096)
    path = os.path.join(SHM_DIR, seg.name)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert seg.name.startswith(f"mmw-{os.getpid()}-")
    peer = Segment.attach(seg.name, writable=False)
    with pytest.raises(SharedMemoryError, match="only the creator may unlink"):
        peer.unlink()
    seg.unlink()
    seg.unlink()  # idempotent: the name is removed exactly once
    assert not os.path.exists(path)
    seg.buffer[:5] = b"hello"  # the memory outlives the name while mapped
    assert bytes(peer.buffer[:5]) == b"hello"
    with pytest.raises(TypeError):
        peer.buffer[0] = 1  # the reader's mapping is read-only
    assert seg.close() and peer.close()


def test_a_segment_shared_as_an_inherited_descriptor_needs_no_name():
    # The client's request ring: its name goes at once; a child started later maps the descriptor.
    seg = Segment.create(new_name("fd"), 4096)
    fd = seg.reader_fd()
    seg.unlink()
    seg.buffer[:5] = b"hello"
    code = "import sys; from ipc.segment import Segment; print(bytes(Segment.map_fd(int(sys.argv[1])).buffer[:5]))"
    child = subprocess.run([sys.executable, "-c", code, str(fd)], pass_fds=(fd,), capture_output=True, text=True)
    assert child.stdout.strip() == "b'hello'", child.stderr
    reader = Segment.map_fd(fd)
    os.close(fd)  # the mapping keeps the memory
    assert bytes(reader.buffer[:5]) == b"hello" and not reader.writable
    with pytest.raises(TypeError):
        reader.buffer[0] = 1
    with pytest.raises(SharedMemoryError, match=r"cannot open .* for reading"):
        seg.reader_fd()  # unlinked: no new descriptor can be made
    assert reader.close() and seg.close()


def test_too_big_for_dev_shm_is_a_clear_start_up_error():
    # Refused before fallocate, which would first take every free page of /dev/shm (host memory).
    size = free_bytes() + (1 << 30)

    name = new_name("huge")
    with pytest.raises(SharedMemoryError, match=r"cannot hold a \d+-byte segment .* bytes free"):
        Segment.create(name, size)
    assert not os.path.exists(os.path.join(SHM_DIR, name))


def test_close_keeps_the_mapping_while_views_exist():
    seg = Segment.create(new_name("pin"), 4096)
    seg.unlink()
    view = np.frombuffer(seg.buffer, np.uint8)
    assert seg.close() is False  # a view pins it; freed when the view goes
    del view
    assert seg.close() is True


def test_sweep_removes_only_segments_of_dead_creators():
    code = "from ipc.segment import Segment, new_name; print(Segment.create(new_name('orphan'), 4096).name)"
    orphan = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    live = Segment.create(new_name("alive"), 4096)
    removed = sweep_stale()
    try:
        assert orphan in removed and not os.path.exists(os.path.join(SHM_DIR, orphan))
        assert os.path.exists(os.path.join(SHM_DIR, live.name))
    finally:
        live.unlink()
        live.close()


def test_write_copies_into_an_allocation_and_nowhere_else(ring):
    writer, reader = ring
    allocation = writer.try_allocate(100)
    assert writer.write(allocation, 0, b"abc") == 3
    assert writer.write(allocation, 64, np.arange(4, dtype="<i8")) == 32
    assert bytes(reader.view(allocation.offset, 3, "|u1", (3,))) == b"abc"
    assert reader.view(allocation.offset + 64, 32, "<i8", (4,)).tolist() == [0, 1, 2, 3]
    with pytest.raises(IpcError, match=r"33 bytes at 68 do not fit a 100-byte allocation"):
        writer.write(allocation, 68, b"x" * 33)


def test_allocation_larger_than_ring(ring):
    writer, _ = ring
    with pytest.raises(AllocationTooLarge, match=r"allocation of 70000 bytes is larger than the ring \(65536 bytes\)"):
        writer.try_allocate(70000)


def test_full_ring_waits_for_releases_then_reports_shared_memory_full(ring):
    writer, _ = ring
    a = writer.try_allocate(40000)
    inbox = Inbox()
    releases = InboxReader(os.dup(inbox.worker_fd))
    inbox.handed_over()
    waited = []

    def wait(seconds: float) -> None:  # as a worker waits for room: on its inbox, applying what arrives
        waited.append(seconds)
        got = releases.recv(int(min(seconds, 0.05) * 1000))
        if got is not None:
            for offset, seq in got[0].allocations:
                writer.release(offset, seq)

    try:
        t0 = time.monotonic()
        with pytest.raises(RingFull, match=r"^shared memory full: ring 0 has no room for 40000 bytes"):
            writer.allocate(40000, time.monotonic() + 0.2, wait)
        assert waited and 0.15 < time.monotonic() - t0 < 1.0  # nothing arrived: it waited until the deadline
        # A release that arrives lets the allocation through.
        assert inbox.send(Release(0, [(a.offset, a.seq)]))
        b = writer.allocate(40000, time.monotonic() + 5, wait)
        assert b.offset == 0 and writer.stats().live == 1
    finally:
        inbox.close()
        releases.close()


def test_release_must_name_a_live_allocation(ring):
    writer, _ = ring
    a = writer.try_allocate(100)
    assert not writer.release(a.offset, a.seq + 1)  # wrong sequence: stale or forged
    assert not writer.release(a.offset + 64, a.seq)
    assert writer.release(a.offset, a.seq)
    assert not writer.release(a.offset, a.seq)  # double release is a no-op


def test_wrap_around_reuses_the_start(ring):
    writer, _ = ring
    a = writer.try_allocate(30000)
    b = writer.try_allocate(30000)
    assert writer.try_allocate(10000) is None  # 5536 bytes left at the end
    writer.release(a.offset, a.seq)
    c = writer.try_allocate(10000)
    assert c.offset == 0  # the short tail is skipped
    writer.release(b.offset, b.seq)
    writer.release(c.offset, c.seq)
    assert writer.stats().used == 0


def test_reader_view_checks(ring):
    writer, reader = ring
    a = writer.try_allocate(4 * 12)
    out = writer.array(a, "<f4", (3, 4))
    out[...] = np.arange(12).reshape(3, 4)
    view = reader.view(a.offset, 48, "<f4", (3, 4))
    np.testing.assert_array_equal(view, out)
    assert not view.flags.writeable and np.shares_memory(view, view)
    for args, message in [
        ((a.offset, 48, "O", (3, 4)), "not allowed"),
        ((a.offset, 48, "<f4", (4, 4)), "is not 48 bytes"),
        ((a.offset, 48, "<f4", (-3, -4)), "negative dimension"),
        ((65536 - 32, 48, "<f4", (3, 4)), "outside the 65536-byte ring"),
        ((-64, 48, "<f4", (3, 4)), "outside"),
        ((a.offset + 4, 48, "<f4", (3, 4)), "outside"),  # misaligned
    ]:
        with pytest.raises(IpcError, match=message):
            reader.view(*args)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 20000), st.integers(0, 10**6)), min_size=1, max_size=120))
def test_ring_invariants(ring, ops):
    writer, reader = ring
    live = {}  # offset -> (allocation, fill byte)
    for is_alloc, size, pick in ops:
        if is_alloc or not live:
            a = writer.try_allocate(size)
            if a is None:
                continue
            assert a.offset % ALIGN == 0 and a.offset >= 0 and a.offset + a.nbytes <= writer.capacity
            end = a.offset + -(-a.nbytes // ALIGN) * ALIGN
            for other, _ in live.values():  # no overlap with any live allocation
                assert end <= other.offset or other.offset + other.nbytes <= a.offset
            fill = (a.seq * 37) % 256
            writer.array(a, "|u1", (a.nbytes,))[...] = fill
            live[a.offset] = (a, fill)
        else:
            offset = sorted(live)[pick % len(live)]
            a, _ = live.pop(offset)
            assert writer.release(a.offset, a.seq)
        for a, fill in live.values():  # every live allocation still holds what was written
            assert (reader.view(a.offset, a.nbytes, "|u1", (a.nbytes,)) == fill).all()
    for a, _ in live.values():
        writer.release(a.offset, a.seq)
    stats = writer.stats()
    assert stats.used == 0 and stats.live == 0
    whole = writer.try_allocate(writer.capacity)  # all space reclaimed
    assert whole.offset == 0
    writer.release(whole.offset, whole.seq)
