"""The pool's feature cache end to end: real workers, real shared memory; hits equal misses, dedupe, eviction, crashes."""

import os
import signal
import time

import numpy as np
import pytest
from processes import no_leaked_segments, open_fds, wait_replies  # noqa: F401 (a fixture)

from ipc.results import ResultSender
from ipc.wire import Done, TensorDesc
from mmworker import WorkerPool, to_sglang
from mmworker.corpus import encode, photo_like
from mmworker.driver import MmInput, process
from mmworker.errors import Outcome
from mmworker.pool.inflight import State
from mmworker.registry import named_spec, pipeline_from_spec

P = 151655
SPEC = {**named_spec("qwen2_vl"), "max_pixels": 1003520}


def image(width: int, height: int, seed: int, fmt: str = "JPEG") -> bytes:
    return encode(photo_like(width, height, seed=seed), fmt)


def prompt(n: int) -> list[int]:
    return [7] + [P, 8] * n


def snapshot(reply) -> dict:
    """Everything a reply says, copied out of shared memory."""
    assert reply.ok, reply.error
    return {
        "ids": reply.input_ids.copy(),
        "offsets": list(reply.offsets),
        "positions": None if reply.positions is None else reply.positions.copy(),
        "delta": reply.delta,
        "hashes": list(reply.hashes),
        "features": [f.copy() for f in reply.features],
        "aux": [{k: v.copy() for k, v in item.aux.items()} for item in reply.items],
    }


def assert_same(a: dict, b: dict) -> None:
    assert np.array_equal(a["ids"], b["ids"]) and a["offsets"] == b["offsets"] and a["hashes"] == b["hashes"]
    assert a["delta"] == b["delta"]
    assert (a["positions"] is None) == (b["positions"] is None)
    if a["positions"] is not None:
        assert np.array_equal(a["positions"], b["positions"])
    for x, y in zip(a["features"], b["features"], strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    for x, y in zip(a["aux"], b["aux"], strict=True):
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def in_process(spec, ids, sources) -> dict:
    """What the in-process driver computes for the same request (the reference for a pool's reply)."""
    out = process(pipeline_from_spec(spec), MmInput(ids, sources))
    return {
        "ids": out.input_ids,
        "offsets": list(out.offsets),
        "positions": getattr(out.positions, "positions", None),
        "delta": getattr(out.positions, "delta", None),
        "hashes": [item.hash for item in out.items],
        "features": [item.feature for item in out.items],
        "aux": [item.aux for item in out.items],
    }


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hits_are_byte_identical_to_misses_whole_and_mixed(dtype):
    spec = {**SPEC, "feature_dtype": dtype}
    a, b, c = image(640, 480, 1), image(333, 251, 2, "PNG"), image(97, 1200, 3)
    with WorkerPool(spec, {"workers": 1, "cache_mib": 64}) as pool:
        first = pool.process(prompt(2), [a, b])
        assert first.cache_hits == 0 and first.worker == 0
        miss = snapshot(first)
        first.release()
        assert_same(miss, in_process(spec, prompt(2), [a, b]))
        again = pool.process(prompt(2), [a, b])  # every image cached: answered without a worker
        assert again.cache_hits == 2 and again.worker is None and again.busy_ms == 0
        assert_same(snapshot(again), miss)
        handed = to_sglang(again)
        assert [i["model_specific_data"]["image_grid_thw"].tolist() for i in handed["mm_items"]] == [
            [item.aux["image_grid_thw"].tolist()] for item in again.items
        ]
        again.release()
        # Mixed: a cached image beside a new one, in another order and prompt; the worker lays it out.
        ids = [5, P, 6, P, P]
        mixed = pool.process(ids, [c, a, b])
        assert mixed.cache_hits == 2 and mixed.worker == 0
        assert_same(snapshot(mixed), in_process(spec, ids, [c, a, b]))
        mixed.release()
        stats = pool.stats()
        assert (stats.cache_hits, stats.cache_misses, stats.cache_entries) == (4, 3, 3)
        assert 0 < stats.cache_bytes <= stats.cache_capacity_bytes


def test_a_family_with_1d_positions_and_other_aux_hits_alike():
    spec = named_spec("inkling")
    family = pipeline_from_spec(spec)
    ids = [1, *family.image_prompt(), 2]
    data = image(300, 200, 4)
    with (
        WorkerPool(spec, {"workers": 1, "cache_mib": 32}) as pool,
        pool.process(ids, [data]) as miss,
        pool.process(ids, [data]) as hit,
    ):
        assert hit.cache_hits == 1 and hit.positions is None and hit.delta is None
        assert_same(snapshot(hit), snapshot(miss))
        assert_same(snapshot(hit), in_process(spec, ids, [data]))


def test_identical_images_in_flight_are_computed_once():
    big = image(1920, 1080, 5)
    with WorkerPool(SPEC, {"workers": 2, "cache_mib": 64}) as pool:
        rids = [pool.submit(prompt(1), [big]) for _ in range(4)]
        replies = {r.request_id: r for r in wait_replies(pool, 4)}
        computed = [r for r in replies.values() if r.worker is not None]
        assert len(computed) == 1 and computed[0].request_id == rids[0]
        reference = snapshot(computed[0])
        for rid in rids[1:]:
            assert replies[rid].cache_hits == 1
            assert_same(snapshot(replies[rid]), reference)
        stats = pool.stats()
        assert (stats.cache_misses, stats.cache_hits, stats.cache_deduplicated) == (1, 3, 3)
        for r in replies.values():
            r.release()


def test_a_waiter_computes_itself_when_the_image_it_waited_for_failed_and_can_be_cancelled():
    big, junk = image(1920, 1080, 6), b"\xff\xd8\xff" + b"junk" * 100
    with WorkerPool(SPEC, {"workers": 1, "cache_mib": 64}) as pool:
        # The same corrupt bytes twice at once: the second waits for the first, which fails; then
        # it computes them itself (nothing was cached) and fails in the same words.
        first, second = pool.submit(prompt(1), [junk]), pool.submit(prompt(1), [junk])
        replies = {r.request_id: r for r in wait_replies(pool, 2)}
        assert {r.kind for r in replies.values()} == {Outcome.BAD_INPUT}
        assert replies[first].error == replies[second].error
        # A waiting request is cancelled like any other; the one computing the image goes on.
        producer, waiter = pool.submit(prompt(1), [big]), pool.submit(prompt(1), [big])
        table, rid_of = pool._inflight.table, pool._inflight.answers.rid_of
        assert table[rid_of(waiter)].state is State.WAITING
        assert pool.cancel(waiter)
        replies = {r.request_id: r for r in wait_replies(pool, 2)}
        assert replies[waiter].kind is Outcome.ABORTED and replies[producer].ok
        replies[producer].release()
        assert pool.stats().cache_entries == 1 and pool.stats().in_flight == 0
        # A request that was to compute an image is cancelled while still queued: the one waiting
        # for that image is admitted again at once and computes it itself.
        other = image(1920, 1080, 7)
        busy = pool.submit(prompt(1), [image(1920, 1080, 8)])  # keeps the one worker busy
        producer, waiter = pool.submit(prompt(1), [other]), pool.submit(prompt(1), [other])
        assert table[rid_of(producer)].state is State.QUEUED and table[rid_of(waiter)].state is State.WAITING
        assert pool.cancel(producer)
        assert table[rid_of(waiter)].state is State.QUEUED
        replies = {r.request_id: r for r in wait_replies(pool, 3)}
        assert replies[producer].kind is Outcome.ABORTED and replies[busy].ok and replies[waiter].ok
        assert replies[waiter].cache_hits == 0 and replies[waiter].worker == 0
        for r in replies.values():
            r.release()


def test_eviction_never_touches_what_a_live_reply_views():
    # A 24 MiB partition holds three 640x480 features (7.4 MB each). Two replies stay held (one
    # released on drop, its feature still referenced) while ten more images pass: their entries
    # are evicted in LRU order, never the held ones, and the cache stays within its bound.
    images = [image(640, 480, 10 + i) for i in range(12)]
    with WorkerPool(SPEC, {"workers": 1, "cache_mib": 24}) as pool:
        held = pool.process(prompt(1), [images[0]])
        dropped = pool.process(prompt(1), [images[1]])
        kept = {0: snapshot(held), 1: snapshot(dropped)}
        feature = dropped.features[0]
        dropped.release_on_drop()
        del dropped
        for data in images[2:]:
            with pool.process(prompt(1), [data]) as reply:
                assert reply.ok, reply.error
            stats = pool.stats()
            assert stats.cache_bytes <= stats.cache_capacity_bytes
        assert pool.stats().cache_evictions >= 8
        assert_same(snapshot(held), kept[0])
        assert feature.tobytes() == kept[1]["features"][0].tobytes()
        with pool.process(prompt(1), [images[0]]) as again:  # still cached: it was pinned throughout
            assert again.cache_hits == 1
            assert_same(snapshot(again), kept[0])
        held.release()
        del feature  # the last view of the dropped reply: its entry may go now
        for data in images[5:9]:
            pool.process(prompt(1), [data]).release()
        stats = pool.stats()
        assert stats.cache_entries <= 3 and stats.shm_held_bytes == 0
        with pool.process(prompt(1), [images[0]]) as back:  # evicted once unpinned: computed again, the same
            assert back.cache_hits == 0
            assert_same(snapshot(back), kept[0])


def test_a_worker_killed_mid_request_leaves_the_cache_consistent():
    # Three images cached; then a request of eight new ones, whose features the worker writes into
    # its partition one after another, is killed part way (SIGKILL). The new worker takes the
    # partition over: the old entries stay as they were and nothing new overwrites them.
    cached = [image(640, 480, 20 + i) for i in range(3)]
    batch = [image(640, 480, 30 + i) for i in range(8)]
    with WorkerPool(SPEC, {"workers": 1, "cache_mib": 160}) as pool:
        before = {}
        for i, data in enumerate(cached):
            with pool.process(prompt(1), [data]) as reply:
                before[i] = snapshot(reply)
        [pid] = pool.worker_pids()
        rid = pool.submit(prompt(8), batch)
        waiter = pool.submit(prompt(1), [batch[0]])  # waits for the image the first is computing
        entry = pool._inflight.table[pool._inflight.answers.rid_of(rid)]
        deadline = time.monotonic() + 30
        while entry.state is not State.RUNNING:  # handed to the worker, which is computing it
            assert time.monotonic() < deadline
            pool.poll(0.001)
        time.sleep(0.03)  # a few of its eight images in (the job takes well over 0.1 s here)
        os.kill(pid, signal.SIGKILL)
        replies = {r.request_id: r for r in wait_replies(pool, 2)}
        assert replies[rid].kind is Outcome.WORKER_CRASHED, replies[rid]
        # The waiter computed the image itself on the new worker: a miss, the right output.
        assert replies[waiter].ok and replies[waiter].cache_hits == 0
        assert_same(snapshot(replies[waiter]), in_process(SPEC, prompt(1), [batch[0]]))
        replies[waiter].release()
        assert pool.stats().cache_entries == 4
        for i, data in enumerate(cached):  # everything cached before the crash, unchanged
            with pool.process(prompt(1), [data]) as hit:
                assert hit.cache_hits == 1
                assert_same(snapshot(hit), before[i])
        with pool.process(prompt(8), batch) as redone:  # the new worker fills the partition
            assert redone.cache_hits == 1  # the waiter's
            assert_same(snapshot(redone), in_process(SPEC, prompt(8), batch))
        with pool.process(prompt(8), batch) as hit:
            assert hit.cache_hits == 8 and hit.worker is None
        for i, data in enumerate(cached):
            with pool.process(prompt(1), [data]) as reply:
                assert_same(snapshot(reply), before[i])  # a hit, or (if evicted) computed again: the same
        assert pool.stats().restarts == 1


def test_distinct_bytes_share_an_entry_only_under_trusted_caller_hashes():
    a, b = image(320, 240, 50), image(320, 240, 51)
    for trust in (False, True):
        with WorkerPool(SPEC, {"workers": 1, "cache_mib": 32, "trust_content_hashes": trust}) as pool:
            with pool.process(prompt(1), [a], content_hashes=["same"]) as first:
                reference = snapshot(first)
            with pool.process(prompt(1), [b], content_hashes=["same"]) as second:
                if trust:  # the caller said they are the same: the cache believes it
                    assert second.cache_hits == 1
                    assert_same(snapshot(second), reference)
                else:
                    assert second.cache_hits == 0
                    assert snapshot(second)["features"][0].tobytes() != reference["features"][0].tobytes()
            with pool.process(prompt(1), [b]) as unhashed:  # no caller hash: the bytes are hashed
                assert unhashed.cache_hits == (0 if trust else 1)


def test_no_segment_or_descriptor_is_left_after_close():
    before = open_fds()
    pool = WorkerPool(SPEC, {"workers": 1, "cache_mib": 16})
    data = image(200, 100, 60)
    pool.process(prompt(1), [data]).release()
    hit = pool.process(prompt(1), [data])
    assert hit.cache_hits == 1
    view = hit.features[0]
    pool.close()
    assert view.sum() != 0  # a view held past close keeps its memory mapped
    del hit, view
    assert open_fds() == before


def test_cache_off_computes_every_time():
    data = image(200, 100, 61)
    with WorkerPool(SPEC, {"workers": 1, "cache_mib": 0}) as pool:
        for _ in range(2):
            with pool.process(prompt(1), [data]) as reply:
                assert reply.cache_hits == 0 and reply.worker == 0
        stats = pool.stats()
        assert (stats.cache_hits, stats.cache_misses, stats.cache_capacity_bytes) == (0, 0, 0)


def test_a_forged_feature_in_the_partition_is_refused_and_never_viewed():
    # A Done (sent on the worker's identity while it is stopped) naming partition space for an image
    # the job was not to cache: the request is answered INTERNAL, no entry is made, and the space is
    # handed back rather than shown.
    with WorkerPool(SPEC, {"workers": 1, "cache_mib": 16}) as pool:
        [slot] = pool._supervisor.slots
        [pid] = pool.worker_pids()
        heap = pool._cache.partitions[0].heap
        os.kill(pid, signal.SIGSTOP)
        try:
            rid = pool.submit(prompt(1), [image(64, 48, 70, "PNG")])
            table = pool._inflight.table
            pool._inflight.table[pool._inflight.answers.rid_of(rid)].cache.produce.clear()  # cache nothing
            sender = ResultSender(os.dup(pool._res.results.sender_fd), slot.identity)
            try:
                forged = TensorDesc(heap, 0, 1, 64, "<f4", (16,))
                ids = TensorDesc(slot.index, 0, 1, 8, "<i8", (1,))
                meta = {"offsets": [[0, 0]], "hashes": [1], "grids": [[1, 2, 2]]}
                sender.send(Done(slot.rid, {"input_ids": ids, "feature.0": forged}, meta))
            finally:
                sender.close()
            [bad] = wait_replies(pool, 1)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert bad.request_id == rid and bad.kind is Outcome.INTERNAL and "cached feature" in bad.error, bad
        assert pool.stats().cache_entries == 0 and pool._cache.partitions[0].evicted == [] and not table
