"""A consumer and the workers' rings: replies held too long get MEMORY_FULL (never a hang), and
`Reply.release_on_drop` gives the memory back once nothing sees the arrays; real processes."""

import gc
import re
import select
import threading

import numpy as np
import pytest
from processes import no_leaked_segments  # noqa: F401 (a fixture, autouse here)

from mmworker import MmError, PoolConfig, WorkerPool
from mmworker.corpus import encode, photo_like
from mmworker.errors import Outcome
from mmworker.registry import named_spec

P = 151655
SPEC = {**named_spec("qwen2_vl"), "max_pixels": 1003520}
RING = 8 << 20


@pytest.fixture(scope="module")
def images():
    return {
        "jpeg": encode(photo_like(640, 480, seed=2), "JPEG"),  # a 7.4 MB feature: one fits an 8 MiB ring
        "medium": encode(photo_like(224, 224, seed=3), "PNG"),  # 1.2 MB: ~6 per 8 MiB ring
    }


class Holder:
    """Something that keeps a reference to an array, as a torch tensor of torch.from_numpy does."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array


def wait_readable(pool: WorkerPool) -> None:
    readable, _, _ = select.select([pool.fileno()], [], [], 30)
    assert readable, "fileno() did not become readable within 30 s"


MEMORY_FULL = re.compile(
    r"^shared memory full: ring 0 has no room for \d+ bytes \(\d+ of 8388608 bytes held by \d+ live allocation\(s\)\), "
    r"after waiting \d+\.\d s for releases; worker 0's unreleased replies: (\d+) \((\d+) bytes\)(.*): "
    r"release replies sooner, or raise ring_mib \(now 8\)$"
)


def test_a_consumer_that_holds_replies_too_long_gets_memory_full_and_the_pool_serves_on(images):
    config = {"workers": 1, "cache_mib": 0, "ring_mib": 8, "memory_wait_s": 0.5, "deadline_s": 60}
    with WorkerPool(SPEC, config) as pool:
        first = pool.process([P], [images["jpeg"]])
        assert first.ok
        second = pool.process([P], [images["jpeg"]])  # the worker waits 0.5 s for room, not the 60 s deadline
        assert not second.ok and second.kind is Outcome.MEMORY_FULL
        match = MEMORY_FULL.match(second.error)
        assert match, second.error
        assert int(match[1]) == 1 and int(match[2]) == first.nbytes
        # It was handed out before the second request began, which then waited 0.5 s.
        age = re.fullmatch(r", the oldest handed out (\d+\.\d) s ago", match[3])
        assert age and float(age[1]) >= 0.5, match[3]
        first.release()
        with pool.process([P], [images["jpeg"]]) as third:
            assert third.ok, third.error
        assert pool.stats().restarts == 0 and pool.stats().shm_held_bytes == 0


def test_memory_full_counts_the_replies_not_yet_taken(images):
    with WorkerPool(SPEC, {"workers": 1, "cache_mib": 0, "ring_mib": 8, "memory_wait_s": 0.3}) as pool:
        waiting = pool.submit([P], [images["jpeg"]])  # its reply waits for poll() while process() runs
        blocked = pool.process([P], [images["jpeg"]])
        assert blocked.kind is Outcome.MEMORY_FULL
        match = MEMORY_FULL.match(blocked.error)
        assert match and match[1] == "1" and match[3] == ", 1 not yet taken by poll()", blocked.error
        [taken] = pool.poll()
        assert taken.request_id == waiting and taken.ok
        taken.release()


def test_memory_wait_s_is_validated():
    assert PoolConfig.from_any(None).memory_wait_s == 5.0
    for bad in (0, -1, "5", True):
        with pytest.raises(MmError, match="memory_wait_s must be a positive float"):
            PoolConfig.from_any({"memory_wait_s": bad})


def test_release_on_drop_gives_the_memory_back_once_the_last_view_is_gone(images):
    # Every kind of reference keeps the reply's memory: the Reply, a slice of its feature, an
    # object holding its positions, a memoryview of its ids, its grid. Until the last one goes
    # (here on another thread), nothing is reused: later requests run, the ring fills up behind
    # the held reply (FIFO) and rejects them with MEMORY_FULL, and the held bytes stay as they
    # were at accept. Then one wake-up and a poll() give the memory back, and the ring wraps again.
    config = {"workers": 1, "cache_mib": 0, "ring_mib": 8, "memory_wait_s": 0.3}
    with WorkerPool(SPEC, config) as pool:
        reply = pool.process([5, P, 6], [images["medium"]])
        assert reply.ok
        held = reply.nbytes
        assert pool.stats().shm_held_bytes == held
        feature_copy = reply.features[0].copy()
        positions_copy, ids_copy = reply.positions.copy(), reply.input_ids.copy()
        grid = reply.items[0].aux["image_grid_thw"]
        feature_slice = reply.features[0][1:]
        holder = Holder(reply.positions)
        ids_view = memoryview(reply.input_ids)
        reply.release_on_drop()
        reply.release()  # a no-op now
        reply.release_on_drop()  # and so is this
        del reply
        gc.collect()
        pool.poll(0)
        assert pool.stats().shm_held_bytes == held

        outcomes = []
        for _ in range(12):  # 12 x 1.2 MB > the 8 MiB ring
            with pool.process([P], [images["medium"]]) as later:
                outcomes.append(later.kind)
        assert Outcome.MEMORY_FULL in outcomes and outcomes[0] is Outcome.ACCEPTED, outcomes
        np.testing.assert_array_equal(feature_slice, feature_copy[1:])
        np.testing.assert_array_equal(holder.array, positions_copy)
        np.testing.assert_array_equal(np.frombuffer(ids_view, np.int64), ids_copy)
        assert grid.tolist() == [1, 16, 16]

        del grid, holder, ids_view
        gc.collect()
        pool.poll(0)
        assert pool.stats().shm_held_bytes == held  # the slice still sees the feature
        for _ in range(2):  # they find the ring as full as before, and overwrite nothing
            with pool.process([P], [images["medium"]]) as later:
                assert later.kind is Outcome.MEMORY_FULL
        np.testing.assert_array_equal(feature_slice, feature_copy[1:])

        last = [feature_slice]
        del feature_slice
        dropper = threading.Thread(target=last.clear)  # the last reference goes on that thread
        dropper.start()
        dropper.join()
        wait_readable(pool)  # the finalizer woke the pool
        assert pool.poll(0) == []
        assert pool.stats().shm_held_bytes == 0

        for _ in range(3 * RING // len(feature_copy.tobytes())):  # the ring wraps ~3 times
            with pool.process([P], [images["medium"]]) as again:
                assert again.ok, again.error
        assert pool.stats().restarts == 0


def test_release_on_drop_of_a_rejected_or_released_reply_does_nothing(images):
    with WorkerPool(SPEC, {"workers": 1, "cache_mib": 0, "ring_mib": 8}) as pool:
        rejected = pool.process([P], [b"junk"])
        rejected.release_on_drop()
        rejected.release()
        assert rejected.views() == []
        reply = pool.process([P], [images["medium"]])
        reply.release()
        reply.release_on_drop()
        features = reply.features
        del reply
        gc.collect()
        pool.poll(0)
        assert pool.stats().shm_held_bytes == 0  # released once, not twice
        del features


def test_views_dropped_after_close_keep_their_bytes_and_raise_nothing(images, monkeypatch):
    unraisable = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)  # where a finalizer's exception would go
    pool = WorkerPool(SPEC, {"workers": 1, "cache_mib": 0, "ring_mib": 8})
    reply = pool.process([P], [images["medium"]])
    feature = reply.features[0]
    copy = feature.copy()
    reply.release_on_drop()
    del reply
    later = pool.process([P], [images["medium"]])
    pool.close()
    np.testing.assert_array_equal(feature, copy)  # the ring stays mapped while a view lives
    later.release_on_drop()  # after close: nothing to give back to
    last = [feature]
    del feature
    dropper = threading.Thread(target=last.clear)  # its finalizer finds the pool closed
    dropper.start()
    dropper.join()
    del later
    gc.collect()
    assert pool.poll() == [] and unraisable == []


def test_a_drop_on_the_pools_own_thread_wakes_nobody_and_its_next_turn_gives_the_memory_back(images):
    # A wake-up of the pool's own (awake) thread would only cost it a sleep and a wake-up; the
    # release is taken at its next turn: here stats(), as well as any submit, result or tick.
    with WorkerPool(SPEC, {"workers": 1, "cache_mib": 0}) as pool:
        reply = pool.process([P], [images["medium"]])
        assert reply.ok and pool.stats().shm_held_bytes == reply.nbytes
        reply.release_on_drop()
        del reply
        gc.collect()
        readable, _, _ = select.select([pool.fileno()], [], [], 0.2)
        assert not readable, "a drop on the pool's own thread woke it"
        assert pool.stats().shm_held_bytes == 0
        again = pool.process([P], [images["medium"]])  # and the ring serves on
        assert again.ok
        again.release()
