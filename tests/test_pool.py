"""WorkerPool end to end: real worker processes, real ZeroMQ, real shared memory, a real HTTP server."""

import asyncio
import base64
import fcntl
import gc
import logging
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from httpserver import MediaServer
from processes import UNTRACEABLE, ended, no_leaked_segments, open_fds, wait_replies  # noqa: F401 (a fixture)

import mmworker.pool.inputs as pool_inputs
from ipc.peer_memory import places_of
from ipc.results import ResultSender
from ipc.wire import Done, TensorDesc
from mmworker import MmError, PoolConfig, WorkerPool, to_sglang
from mmworker.corpus import encode, photo_like
from mmworker.driver import MmInput, process
from mmworker.errors import Outcome, UsageError
from mmworker.pipeline import MRope
from mmworker.pool import naming
from mmworker.pool.inflight import State
from mmworker.registry import named_spec, pipeline_from_spec

P = 151655
SPEC = {**named_spec("qwen2_vl"), "max_pixels": 1003520}


def threads_of(pid: int) -> list[str]:
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            names.append(f.read().strip())
    return names


@pytest.fixture(scope="module")
def images():
    return {
        "small": encode(photo_like(64, 48, seed=1), "PNG"),
        "jpeg": encode(photo_like(640, 480, seed=2), "JPEG"),
        "big": encode(photo_like(1920, 1080, seed=3), "JPEG"),
    }


# Tests serve media from 127.0.0.1 and temporary files; the safe default policy refuses both.
TEST_MEDIA = {"allowed_networks": ["127.0.0.1/32"], "allowed_local_roots": [tempfile.gettempdir()]}


@pytest.fixture(scope="module")
def pool():
    # The worker's path: these tests send the same images again and again, which a feature cache
    # would answer itself (tests/test_cache.py tests that).
    with WorkerPool(SPEC, {"cache_mib": 0, "ring_mib": 192, "deadline_s": 30, "media": TEST_MEDIA}) as p:
        yield p


def test_mixed_sources_equal_in_process_driver(pool, images, tmp_path):
    server = MediaServer()
    try:
        path = tmp_path / "img.png"
        path.write_bytes(images["small"])
        png_b64 = base64.b64encode(images["small"]).decode()
        sources = [
            images["jpeg"],
            "data:image/png;base64," + png_b64,
            png_b64,
            str(path),
            server.put("a.jpg", images["jpeg"]),
        ]
        ids = [5, P, 6, P, P, 7, P, P, 8]
        reply = pool.process(ids, sources)
        expected = process(pipeline_from_spec(SPEC), MmInput(ids, sources))
    finally:
        server.stop()
    with reply:
        assert reply.ok, reply.error
        np.testing.assert_array_equal(reply.input_ids, expected.input_ids)
        assert reply.offsets == list(expected.offsets)
        assert isinstance(expected.positions, MRope)
        np.testing.assert_array_equal(reply.positions, expected.positions.positions)
        assert reply.delta == expected.positions.delta
        for got, want in zip(reply.items, expected.items, strict=True):
            assert got.feature.tobytes() == want.feature.tobytes()  # byte-identical features
            assert got.hash == want.hash
            grid = got.aux["image_grid_thw"]
            np.testing.assert_array_equal(grid, want.aux["image_grid_thw"])
            assert grid.dtype == np.int64 and grid.shape == (3,)
            assert not got.feature.flags.writeable and not grid.flags.writeable  # both views into the ring


def test_replies_come_in_submission_order(pool, images):
    rids = [pool.submit([P], [images["big" if k % 3 == 0 else "small"]]) for k in range(9)]
    replies = wait_replies(pool, 9)
    assert [r.request_id for r in replies] == rids
    assert all(r.ok for r in replies)
    for r in replies:
        r.release()


def test_reply_timings_say_where_the_latency_went(pool, images):
    # One request more than twice the workers: the last ones wait for a worker to finish a job.
    rids = [pool.submit([P], [images["big"]]) for _ in range(2 * len(pool.worker_pids()) + 1)]
    replies = wait_replies(pool, len(rids))
    for r in replies:
        assert r.ok, r.error
        phases = (r.queued_ms, r.to_worker_ms, r.busy_ms, r.returned_ms)
        assert min(phases) > 0, phases
        assert sum(phases) == pytest.approx(r.latency_ms, abs=1e-6)
        r.release()
    assert max(r.queued_ms for r in replies) > 0.5 * min(r.busy_ms for r in replies)


def test_unordered_pool_returns_in_completion_order(images):
    with WorkerPool(SPEC, {"ordered": False, "workers": 2, "ring_mib": 128}) as pool:
        big = pool.submit([P], [images["big"]])
        small = [pool.submit([P], [images["small"]]) for _ in range(4)]
        replies = wait_replies(pool, 5)
        order = [r.request_id for r in replies]
        assert order.index(big) > order.index(small[0])  # the small ones overtake the big one
        for r in replies:
            r.release()


def test_rejections_name_the_cause(pool, images):
    cases = {
        "no placeholder": ([7, 8], [images["small"]], r"prompt has 0 media placeholder\(s\) but 1 media item\(s\)"),
        "bad image": ([P], [b"junk"], r"^image 0: image decode"),
        "no images": ([P], [], r"without image sources"),
        "too many": ([P] * 65, [images["small"]] * 65, r"^multimodal request exceeds 64 media items$"),
        "missing file": ([P], ["/no/such/file.png"], r"^image 0: media fetch: /no/such/file.png"),
        "bad ids": (["x"], [images["small"]], r"input_ids must be integers"),
        "images not a list": ([P], images["small"], r"^images must be a list of sources$"),
        "not a source": ([P], [7], r"^image 0: source must be a string or bytes, got int$"),
        "strided view": (
            [P],
            [memoryview(images["small"])[::2]],
            r"^image 0: a memoryview source must be C-contiguous$",
        ),
    }
    for name, (ids, sources, pattern) in cases.items():
        reply = pool.process(ids, sources)
        assert not reply.ok and reply.error, name
        assert __import__("re").search(pattern, reply.error), (name, reply.error)


def test_a_request_id_is_refused_while_in_flight_and_free_again_once_answered(pool, images):
    pool.submit([P], [images["small"]], request_id="a")
    with pytest.raises(UsageError, match=r"^request id 'a' is already in flight$"):
        pool.submit([P], [images["small"]], request_id="a")
    [reply] = wait_replies(pool, 1)
    assert reply.request_id == "a" and reply.ok, reply.error
    reply.release()
    with pool.process([P], [images["small"]], request_id="a") as again:
        assert again.ok and pool.stats().in_flight == 0


def test_the_client_keeps_nothing_per_answered_request(pool, images):
    # A pool serves for weeks: accepted, rejected and aborted requests alike must leave no trace here.
    def serve(n: int) -> None:
        for _ in range(n // 16):
            ids = [pool.submit([P], [images["small"] if k % 4 else b"junk"]) for k in range(16)]
            assert pool.cancel(ids[-1])
            replies = wait_replies(pool, 16)
            assert sum(r.ok for r in replies) == 11 and replies[-1].error == "aborted"
            for reply in replies:
                reply.release()

    serve(160)  # caches and free lists fill up first
    tracemalloc.start()
    try:
        serve(160)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        serve(1600)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 32 * 1024, f"the client holds {grown} bytes more after 1600 more requests"
    assert pool.stats().in_flight == 0 and pool.stats().shm_held_bytes == 0


def test_text_that_cannot_be_encoded_is_rejected_and_the_pool_keeps_serving(pool, images):
    # A lone surrogate cannot go over the wire; it once stayed at the head of the queue and broke every poll().
    for source in ("data:image/png;base64,\ud800", "http://127.0.0.1:9/\ud800.png"):
        reply = pool.process([P], [source])
        assert not reply.ok and reply.error.startswith("image 0: source text is not valid Unicode"), reply.error
    with pool.process([P], [images["small"]]) as reply:
        assert reply.ok


def test_http_404_is_rejected_with_the_image_index(pool, images):
    server = MediaServer()
    try:
        reply = pool.process([P, P], [images["small"], server.url("/status/404")])
    finally:
        server.stop()
    assert not reply.ok and reply.error.startswith("image 1: media fetch: GET ") and "404" in reply.error


def test_cancel_queued_and_running(pool, images):
    first = pool.submit([P], [images["big"]])
    queued = [pool.submit([P], [images["big"]]) for _ in range(3)]
    assert pool.cancel(queued[-1]) and pool.cancel(first)
    assert not pool.cancel("never submitted")
    replies = {r.request_id: r for r in wait_replies(pool, 4)}
    assert replies[first].error == "aborted" and replies[queued[-1]].error == "aborted"
    assert replies[queued[0]].ok and replies[queued[1]].ok
    for r in replies.values():
        r.release()
    # Everything the cancelled requests held was freed: a full pool's worth of work still fits.
    assert all(r.ok for r in (pool.process([P], [images["big"]]) for _ in range(3)))
    assert pool.stats().request_ring_used_bytes == 0  # the running one's inputs too, once it answered


def state_of(pool, request_id) -> State:
    return pool._inflight.table[pool._inflight.answers.rid_of(request_id)].state


def wait_until(pool, condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the pool did not get there in time"
        pool.poll(0.05)


def test_cancel_in_every_state_answers_aborted_exactly_once_and_frees_everything(images):
    # Finished but not yet taken, running (a stopped worker), queued, fetching (a slow URL at the
    # I/O process): each cancel answers "aborted" at once, and a second one changes nothing. The
    # late answers are dropped when they come: the worker's (its memory given back), and none at
    # all from an I/O process that dies meanwhile, which must not answer the request again.
    server = MediaServer()
    try:
        with WorkerPool(SPEC, {"workers": 1, "cache_mib": 0, "ring_mib": 64, "media": TEST_MEDIA}) as pool:
            finished = pool.submit([P], [images["small"]])
            pool.process([P], [images["small"]]).release()  # one worker: `finished` is done, its reply kept
            [pid] = pool.worker_pids()
            os.kill(pid, signal.SIGSTOP)
            try:
                running = pool.submit([P], [images["jpeg"]])
                queued = pool.submit([P], [images["small"]])
                fetching = pool.submit([P], [server.url("/slow/30")])
                states = [state_of(pool, r) for r in (running, queued, fetching)]
                assert states == [State.RUNNING, State.QUEUED, State.FETCHING]
                rejected = pool.stats().rejected
                for request_id in (finished, running, queued, fetching) * 2:  # twice: the second changes nothing
                    assert pool.cancel(request_id)
                assert pool.stats().rejected == rejected + 3  # the finished one had been accepted
                assert state_of(pool, running) is State.CANCELLED_RUNNING
                assert state_of(pool, fetching) is State.CANCELLED_FETCHING
                assert pool.stats().queued == 0 and pool.stats().in_flight == 2
                os.kill(pool.io_pid(), signal.SIGKILL)
            finally:
                os.kill(pid, signal.SIGCONT)
            replies = wait_replies(pool, 4)
            assert [r.request_id for r in replies] == [finished, running, queued, fetching]
            assert all(r.kind is Outcome.ABORTED and r.error == "aborted" for r in replies)
            wait_until(pool, lambda: pool.stats().in_flight == 0 and pool._supervisor.io_ready)  # said Hello
            assert pool.poll(0.3) == []  # nothing answered twice
            stats = pool.stats()
            assert stats.shm_held_bytes == 0 and stats.request_ring_used_bytes == 0
            assert not pool.cancel(finished)  # delivered
            with pool.process([P], [server.put("a.png", images["small"])]) as after:  # the new I/O process serves
                assert after.ok, after.error

            # Running, cancelled, then its worker dies: the crash does not answer it again.
            [pid] = pool.worker_pids()
            os.kill(pid, signal.SIGSTOP)
            gone = pool.submit([P], [images["small"]])
            assert state_of(pool, gone) is State.RUNNING and pool.cancel(gone)
            os.kill(pid, signal.SIGKILL)
            [reply] = wait_replies(pool, 1)
            assert reply.request_id == gone and reply.kind is Outcome.ABORTED
            wait_until(pool, lambda: pool.stats().restarts == 2 and pool.stats().workers_ready == 1)
            assert pool.stats().in_flight == 0 and pool.poll(0.3) == []
            answers = pool._inflight.answers
            assert not (answers._finished or answers._rids or answers._order or answers._deliver)
            with pool.process([P], [images["small"]]) as after:
                assert after.ok, after.error
    finally:
        server.stop()


def test_done_names_are_read_back_as_written_and_foreign_ones_refused():
    tensors = {naming.INPUT_IDS: "ids", naming.feature_name(0): "f0", naming.feature_name(1): "f1",
               naming.aux_name(1, "grid.thw"): "g"}  # fmt: skip
    assert naming.unpack(tensors, 2) == ("ids", None, ["f0", "f1"], [{}, {"grid.thw": "g"}])
    assert naming.unpack({**tensors, naming.POSITIONS: "p"}, 2)[1] == "p"
    for foreign in ("aux.2.x", "aux.-1.x", "aux.a.x", "aux.0"):  # an item the request lacks, or no name at all
        with pytest.raises((IndexError, ValueError)):
            naming.unpack({**tensors, foreign: "x"}, 2)
    with pytest.raises(KeyError):
        naming.unpack(tensors, 3)  # a feature missing


def test_a_queued_request_keeps_the_ids_it_was_given(images):
    # The caller may reuse its array or list as soon as submit returns, also while the request waits.
    with WorkerPool(SPEC, {"workers": 1, "ring_mib": 64}) as pool:
        busy = pool.submit([P], [images["big"]])
        array_ids, list_ids = np.array([7, P, 8], np.int64), [7, P, 8]
        queued = [pool.submit(array_ids, [images["jpeg"]]), pool.submit(list_ids, [images["jpeg"]])]
        array_ids[:] = -1
        list_ids[:] = [-1, -1, -1]
        replies = {r.request_id: r for r in wait_replies(pool, 3)}
        for request_id in queued:
            got = replies[request_id].input_ids
            assert replies[request_id].ok and got[0] == 7 and got[-1] == 8 and (got[1:-1] == P).all()
        for r in replies.values():
            r.release()
        assert busy in replies


def test_input_ids_convert_as_numpy_converts_them():
    # A flat list of ints takes a quicker route than numpy's; the ids and the errors stay the same.
    given = [[7, P, 8], (7, P, 8), np.array([7, P, 8], np.int32), [np.int64(7), True, 2**63 - 1], [-(2**63)],
             [[7, P], [8, 9]], [7.9, 8.0], ["7"], []]  # fmt: skip
    for ids in given:
        got = np.frombuffer(pool_inputs.check_inputs(ids, [b"x"], None).ids, "<i8")
        np.testing.assert_array_equal(got, np.array(ids, np.int64).reshape(-1))
    for bad in (["x"], [2**63], [None], [[1], [2, 3]]):
        with pytest.raises(MmError, match=r"^input_ids must be integers: "):
            pool_inputs.check_inputs(bad, [b"x"], None)


def test_queue_full_rejects_at_once(images):
    with WorkerPool(SPEC, {"queue_depth": 2, "workers": 1, "ring_mib": 64}) as pool:
        rids = [pool.submit([P], [images["jpeg"]]) for _ in range(5)]
        replies = {r.request_id: r for r in wait_replies(pool, 5)}
        errors = [replies[r].error for r in rids]
        assert errors[:2] == [None, None]
        assert all(e.startswith("queue full: 2 requests in flight") for e in errors[2:])
        assert [replies[r].kind for r in rids] == [Outcome.ACCEPTED] * 2 + [Outcome.QUEUE_FULL] * 3
        for r in replies.values():
            r.release()


def wait_inbox_read(pool, slot, timeout: float = 10.0) -> None:
    """Until `slot`'s worker has read all the pool sent to its inbox (a Job: the worker has it and
    runs it): nothing is queued on the pool's end of the socket pair any more (SIOCOUTQ counts what
    the reader has not consumed). No poll(), which would take a reply this test waits for."""
    fd = pool._res.inboxes[slot.index]._sock.fileno()
    deadline = time.monotonic() + timeout
    while (queued := struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0" * 4))[0]) > 0:
        assert time.monotonic() < deadline, f"worker {slot.index} left {queued} inbox bytes unread for {timeout} s"
        time.sleep(0.001)


def test_worker_crash_is_answered_and_the_worker_replaced(images):
    with WorkerPool(SPEC, {"workers": 1, "ring_mib": 256}) as pool:
        [pid] = pool.worker_pids()
        [slot] = pool._supervisor.slots
        rid = pool.submit([P] * 8, [images["big"]] * 8)  # a few hundred ms of work
        assert slot.rid is not None  # handed to the idle worker at once...
        wait_inbox_read(pool, slot)  # ...which has taken it: the kill comes mid-request
        os.kill(pid, signal.SIGKILL)
        [reply] = wait_replies(pool, 1)
        assert reply.request_id == rid and not reply.ok
        assert reply.error.startswith("worker crashed (worker 0, exit code -9)")
        assert reply.kind is Outcome.WORKER_CRASHED
        assert pool.stats().request_ring_used_bytes == 0  # the dead worker's inputs are free again
        after = pool.process([P], [images["small"]])
        assert after.ok and pool.worker_pids() != [pid] and pool.stats().restarts == 1
        after.release()


def test_hung_worker_hits_the_deadline_and_is_replaced(images):
    with WorkerPool(SPEC, {"workers": 1, "ring_mib": 64, "deadline_s": 1.0}) as pool:
        [pid] = pool.worker_pids()
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        reply = pool.process([P], [images["small"]])
        assert not reply.ok and reply.error.startswith("deadline exceeded (1 s, worker 0)")
        assert reply.kind is Outcome.DEADLINE_EXCEEDED
        assert 0.9 < time.monotonic() - t0 < 10
        assert pool.stats().request_ring_used_bytes == 0
        after = pool.process([P], [images["small"]])
        assert after.ok and pool.worker_pids() != [pid]
        after.release()


def test_close_rejects_everything_pending(images):
    pool = WorkerPool(SPEC, {"workers": 1, "ring_mib": 64})
    rids = [pool.submit([P], [images["big"]]) for _ in range(3)]
    pids = [*pool.worker_pids(), pool.io_pid()]
    pool.close()
    replies = pool.poll()
    assert [r.request_id for r in replies] == rids and {r.error for r in replies} == {"pool closed"}
    assert {r.kind for r in replies} == {Outcome.POOL_CLOSED}
    with pytest.raises(UsageError, match="pool closed"):
        pool.submit([P], [images["small"]])
    assert all(ended(pid) for pid in pids)


def sockets_of(pid: int) -> set[str]:
    return {link for link in open_fds(pid).values() if link.startswith("socket:")}


def test_only_workers_hold_the_results_channel_and_close_leaves_no_fd(images):
    before = open_fds()
    pool = WorkerPool(SPEC, {"workers": 1, "ring_mib": 64})
    pool.process([P], [images["small"]]).release()
    sending_end = f"socket:[{os.fstat(pool._res.results.sender_fd).st_ino}]"
    [worker] = pool.worker_pids()
    assert sending_end in sockets_of(worker)
    assert sending_end not in sockets_of(pool.io_pid())  # the I/O process cannot forge results
    pool.close()
    assert open_fds() == before


def test_a_result_naming_an_item_the_request_lacks_is_rejected_and_a_stale_one_dropped(images, caplog):
    # What a worker sends back is checked before any view reaches the caller. Here a Done sent on
    # the worker's own identity while it is stopped with the request names an aux tensor of an
    # item the request does not have: the request is answered "internal error" and the caller sees
    # no exception. The worker's real answer, arriving after that, answers a job it no longer
    # runs: it is dropped without touching the slot, and the pool serves the next request.
    with WorkerPool(SPEC, {"workers": 1, "deadline_s": 30}) as pool:
        [slot] = pool._supervisor.slots
        [pid] = pool.worker_pids()
        os.kill(pid, signal.SIGSTOP)
        try:
            rid = pool.submit([P], [images["small"]])
            running = slot.rid  # the pool's own number for the job the stopped worker holds
            assert running is not None
            ids = TensorDesc(slot.index, 0, -1, 32, "<i8", (4,))
            feature = TensorDesc(slot.index, 64, -1, 16, "<f4", (1, 4))
            grid = TensorDesc(slot.index, 128, -1, 24, "<i8", (3,))
            tensors = {"input_ids": ids, "feature.0": feature, "aux.1.image_grid_thw": grid}
            sender = ResultSender(os.dup(pool._res.results.sender_fd), slot.identity)
            try:
                meta = {"offsets": [[1, 2]], "runs": [[1, 2]], "modalities": ["IMAGE"], "hashes": [7]}
                sender.send(Done(running, tensors, meta))
            finally:
                sender.close()
            [reply] = wait_replies(pool, 1)
            assert slot.rid is None  # answered, as far as the pool knows
        finally:
            os.kill(pid, signal.SIGCONT)
        assert reply.request_id == rid and not reply.ok
        assert reply.error.startswith("internal error: bad result from worker 0: "), reply.error
        with caplog.at_level(logging.WARNING, logger="mmworker.pool"), pool.process([P], [images["small"]]) as after:
            assert after.ok, after.error
        assert f"worker 0 answered request {running} while running" in caplog.text
        assert pool.stats().restarts == 0 and pool.stats().in_flight == 0


def test_releases_a_stopped_worker_has_no_room_for_wait_and_none_is_lost(images):
    # A worker's inbox holds ~280 records. Releasing 400 replies while the worker is stopped with a
    # job in its inbox overflows it: the rest wait here and follow once it reads again. The ring
    # (36 MiB) holds ~480 of these replies, and a lost release would pin its space for good: holding
    # 400 again, twice (the second time wraps past every earlier allocation), proves none was lost.
    def hold(n: int) -> list:
        for _ in range(n):
            pool.submit([P], [images["small"]])
        replies = wait_replies(pool, n)
        assert all(r.ok for r in replies), {r.error for r in replies}
        return replies

    with WorkerPool(SPEC, {"workers": 1, "cache_mib": 0, "ring_mib": 36, "queue_depth": 512, "deadline_s": 20}) as pool:
        [pid] = pool.worker_pids()
        [slot] = pool._supervisor.slots
        held = hold(400)
        os.kill(pid, signal.SIGSTOP)
        try:
            pool.submit([P], [images["small"]])
            assert slot.rid is not None  # handed to the stopped worker: it counts as busy
            # Every array a reply holds (ids, positions, each feature and aux tensor) is one allocation.
            released = sum(2 + sum(1 + len(item.aux) for item in reply.items) for reply in held)
            for reply in held:
                reply.release()
            assert 0 < len(slot.pending) < released  # its inbox took some, the rest wait here
        finally:
            os.kill(pid, signal.SIGCONT)
        [reply] = wait_replies(pool, 1)
        assert reply.ok, reply.error
        reply.release()
        for _ in range(2):
            for reply in hold(400):
                reply.release()
        assert pool.stats().restarts == 0


def assert_same_as_in_process(reply, request: list) -> None:
    expected = process(pipeline_from_spec(SPEC), MmInput([P] * len(request), request))
    assert reply.ok, reply.error
    np.testing.assert_array_equal(reply.input_ids, expected.input_ids)
    for got, item in zip(reply.features, expected.items, strict=True):
        np.testing.assert_array_equal(got, item.feature)


def big_requests(images) -> list[list[bytes]]:
    """Requests around a 1 MiB request ring: one that fits, and three that do not."""
    big = encode(photo_like(2000, 1500, seed=4), "PNG")
    assert len(big) > 1 << 20 > len(images["big"]) and 4 * len(images["big"]) > 1 << 20
    return [[images["big"]], [images["big"]] * 4, [big], [images["jpeg"], big]]


def test_inputs_reach_workers_through_the_request_ring_or_a_one_off_segment(images):
    # Copied (inputs_in_place false): 1 MiB of request ring: the 1080p JPEG (~0.3 MB) goes through
    # it, 4 of them in one request cannot all fit and go in a one-off nameless segment.
    config = {"workers": 1, "cache_mib": 0, "ring_mib": 256, "request_ring_mib": 1, "inputs_in_place": False}
    with WorkerPool(SPEC, config) as small_ring:
        assert small_ring.stats().workers_reading_in_place == 0
        [worker] = small_ring.worker_pids()
        for request in big_requests(images):
            reply = small_ring.process([P] * len(request), request)
            assert_same_as_in_process(reply, request)
            reply.release()
            assert small_ring.stats().request_ring_used_bytes == 0
        running = small_ring.submit([P], [images["big"]])
        assert small_ring.stats().request_ring_used_bytes > 0  # while it runs, its inputs sit there
        [reply] = wait_replies(small_ring, 1)
        assert reply.request_id == running and reply.ok
        reply.release()
        with open(f"/proc/{worker}/maps") as f:
            request_maps = [line.split()[1] for line in f if "-req-" in line]
        assert request_maps == ["r--s"]  # workers map the client's request ring read-only


def test_workers_read_inputs_in_place_from_the_client(images):
    # The default where the kernel allows it (here): nothing is copied on this side, whatever the size.
    with WorkerPool(SPEC, {"workers": 1, "cache_mib": 0, "ring_mib": 256, "request_ring_mib": 1}) as pool:
        assert pool.stats().workers_reading_in_place == 1
        for request in big_requests(images):
            rid = pool.submit([P] * len(request), request)
            assert pool.stats().request_ring_used_bytes == 0  # running, and nothing in the ring
            [reply] = wait_replies(pool, 1)
            assert reply.request_id == rid
            assert_same_as_in_process(reply, request)
            reply.release()


# A scheduler stand-in whose memory its workers may not read.
UNREADABLE_CLIENT = (
    UNTRACEABLE
    + """
import sys
sys.path.insert(0, {root!r})
from mmworker import WorkerPool
from mmworker.corpus import encode, photo_like
with WorkerPool("qwen2_vl", {{"workers": 1, "ring_mib": 64}}) as pool:
    reply = pool.process([151655], [encode(photo_like(640, 480, seed=1), "JPEG")])
    print(pool.stats().workers_reading_in_place, reply.ok, reply.error, flush=True)
    reply.release()
"""
)


def test_a_client_its_workers_may_not_read_gets_its_inputs_copied_and_a_warning():
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", UNREADABLE_CLIENT.format(root=root)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True", "None"]
    assert "worker 0 cannot read the client's memory, so inputs are copied for it" in done.stderr
    assert "EPERM (Operation not permitted)" in done.stderr


def test_a_read_that_fails_rejects_the_request_naming_the_cause(images, monkeypatch):
    # The kernel refuses a read after start-up (here: a Job that names an unmapped address).
    def unmapped(frames):
        exports, places = places_of(frames)
        return exports, [(4096, n) for _, n in places]

    with WorkerPool(SPEC, {"workers": 1, "ring_mib": 64}) as pool:
        monkeypatch.setattr(pool_inputs, "places_of", unmapped)
        reply = pool.process([P], [images["small"]])
        assert not reply.ok
        assert reply.error.startswith("internal error: job inputs not read from the client: process ")
        assert "process_vm_readv read 0 of " in reply.error and reply.error.endswith("EFAULT (Bad address)")
        monkeypatch.undo()
        with pool.process([P], [images["small"]]) as after:  # the worker stays and serves
            assert after.ok and pool.stats().restarts == 0


def test_garbage_collected_pool_stops_its_processes(images):
    pool = WorkerPool(SPEC, {"workers": 1, "ring_mib": 64})
    pids = [*pool.worker_pids(), pool.io_pid()]
    rundir = pool._res.rundir.path
    del pool
    gc.collect()
    assert not os.path.exists(rundir)
    assert all(ended(pid) for pid in pids)


def test_each_worker_runs_one_thread_after_real_work(pool, images):
    for r in [pool.process([P], [images["big"]]) for _ in range(4)]:
        r.release()
    for pid in pool.worker_pids():
        names = threads_of(pid)
        assert len(names) == 1, names  # no libzmq thread either: a worker's channels are plain socket pairs
        with open(f"/proc/{pid}/status") as f:
            allowed = next(line for line in f if line.startswith("Cpus_allowed_list")).split()[1]
        assert "-" not in allowed and "," not in allowed  # pinned to exactly one core


def test_worker_scheduling_follows_the_plan_threads_included(pool, images):
    with pool.process([P], [images["small"]]) as r:
        assert r.ok
    want = {"idle": os.SCHED_IDLE, "normal": os.SCHED_OTHER}[pool.plan.worker_sched]  # "auto", decided
    for pid in pool.worker_pids():
        for tid in map(int, os.listdir(f"/proc/{pid}/task")):
            assert os.sched_getscheduler(tid) == want


def test_idle_workers_yield_to_the_client(images):
    with WorkerPool(SPEC, {"workers": 1, "worker_sched": "idle"}) as pool:
        with pool.process([P], [images["small"]]) as r:
            assert r.ok
        want_nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + pool.config.worker_nice)
        for tid in map(int, os.listdir(f"/proc/{pool.worker_pids()[0]}/task")):
            assert os.sched_getscheduler(tid) == os.SCHED_IDLE
            assert os.getpriority(os.PRIO_PROCESS, tid) == want_nice
        assert os.sched_getscheduler(pool.io_pid()) == os.SCHED_OTHER  # fetching is not the workers' business


def test_normal_workers_run_nicer_than_the_client(images):
    with WorkerPool(SPEC, {"workers": 1, "worker_sched": "normal", "worker_nice": 7}) as pool:
        with pool.process([P], [images["small"]]) as r:
            assert r.ok
        want = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7)
        for tid in map(int, os.listdir(f"/proc/{pool.worker_pids()[0]}/task")):
            assert os.sched_getscheduler(tid) == os.SCHED_OTHER
            assert os.getpriority(os.PRIO_PROCESS, tid) == want


def test_ring_full_rejects_and_recovers_after_release(images):
    # 8 MiB ring: one 640x480 feature (7.4 MB) fits, a second cannot while the first is held: the
    # worker waits memory_wait_s for a release, then rejects it (MEMORY_FULL, before the deadline).
    with WorkerPool(
        SPEC, {"workers": 1, "cache_mib": 0, "ring_mib": 8, "deadline_s": 30, "memory_wait_s": 0.5}
    ) as pool:
        first = pool.process([P], [images["jpeg"]])
        assert first.ok
        second = pool.process([P], [images["jpeg"]])
        assert not second.ok and second.error.startswith("shared memory full")
        assert second.kind is Outcome.MEMORY_FULL
        first.release()
        third = pool.process([P], [images["jpeg"]])
        assert third.ok
        third.release()


def test_mm_hashes_override(pool, images):
    reply = pool.process([P, P], [images["small"], images["small"]], mm_hashes=["0xABC", "not hex"])
    with reply:
        computed = process(pipeline_from_spec(SPEC), MmInput([P], [images["small"]])).items[0].hash
        assert reply.hashes == [0xABC, computed]
    with pool.process([P], [images["small"]], mm_hashes=["1", "2"]) as mismatched:
        assert mismatched.hashes == [computed]  # a count mismatch ignores the overrides


def test_to_sglang_dict(pool, images):
    with pool.process([1, P, 2], [images["jpeg"]]) as reply:
        out = to_sglang(reply)
        [item] = out["mm_items"]
        assert item["modality"] == "IMAGE" and item["offsets"] == [reply.offsets[0]]
        assert item["model_specific_data"]["image_grid_thw"].tolist() == [[1, 34, 46]]
        assert item["model_specific_data"]["image_grid_thw"].dtype == np.int64
        assert type(item["hash"]) is int
        assert np.shares_memory(item["feature"], reply.features[0])
        assert out["mrope_positions"].shape == (3, len(reply.input_ids)) and out["mrope_positions"].dtype == np.int64
        assert out["mrope_position_delta"].tolist() == [[reply.delta]]
        # Without these SGLang's scheduler cannot pad the image tokens (found by tests/test_sglang_client.py).
        assert (out["im_token_id"], out["im_start_id"], out["im_end_id"], out["video_token_id"]) == (
            151655, 151652, 151653, 151656)  # fmt: skip
    with pytest.raises(UsageError, match="was rejected"):  # the caller's mistake, not bad input
        to_sglang(pool.process([P], [b"junk"]))


def test_fileno_wakes_a_sleeping_loop_when_the_answer_arrives(pool, images):
    rid = pool.submit([P], [images["jpeg"]])
    got = []
    for _ in range(100):  # a wake-up may also stand for other traffic; the answer must come with one
        readable, _, _ = select.select([pool.fileno()], [], [], 30)
        assert readable, "fileno() did not become readable within 30 s"
        got = pool.poll(0)
        if got:
            break
    assert [r.request_id for r in got] == [rid] and got[0].ok
    got[0].release()


def test_aprocess(pool, images):
    async def main():
        return await asyncio.gather(*(pool.aprocess([P], [images["small"]]) for _ in range(3)))

    replies = asyncio.run(main())
    assert all(r.ok and r.kind is Outcome.ACCEPTED for r in replies)
    for r in replies:
        r.release()


def test_config_validation_and_plan(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    with pytest.raises(MmError, match="are not in this process's CPU set"):
        PoolConfig.from_any({"cores": "4096"}).plan()
    with pytest.raises(MmError, match="unknown key"):
        PoolConfig.from_any({"worker": 2})
    with pytest.raises(MmError, match="workers need"):
        PoolConfig.from_any({"workers": len(allowed) + 1}).plan()
    for bad in (-1, 20, 2.5, True):
        with pytest.raises(MmError, match="worker_nice must be an int from 0 to 19"):
            PoolConfig.from_any({"worker_nice": bad})
    for bad in ("IDLE", "batch", None, 5):
        with pytest.raises(MmError, match='worker_sched must be "auto", "idle" or "normal"'):
            PoolConfig.from_any({"worker_sched": bad})
    for key in ("ordered", "inputs_in_place"):
        with pytest.raises(MmError, match=f"{key} must be true or false, got 'yes'"):
            PoolConfig.from_any({key: "yes"})
    # "auto": idle where this process keeps a CPU without a worker (here the reserved ones), else normal.
    auto = PoolConfig.from_any({"cores": "0-15"}).plan(allowed=set(range(16)))
    assert auto.own_cpus == (0, 1) and auto.worker_sched == "idle"
    every = PoolConfig.from_any({"workers": 2}).plan(allowed={0, 1})
    assert every.own_cpus == () and every.worker_sched == "normal"
    assert PoolConfig.from_any({"workers": 1}).plan(allowed={0, 1}).worker_sched == "idle"
    assert PoolConfig.from_any({"workers": 2, "worker_sched": "idle"}).plan(allowed={0, 1}).worker_sched == "idle"
    assert PoolConfig.from_any({"worker_sched": "normal"}).plan(allowed=set(range(16))).worker_sched == "normal"
    plan = PoolConfig.from_any({"cores": "0-15", "reserved_cores": None}).plan(allowed=set(range(16)))
    assert plan.reserved == (0, 1) and plan.workers == tuple(range(2, 16))  # SGLang's min(2, n // 4)
    toml = tmp_path / "pool.toml"
    toml.write_text("workers = 1\nring_mib = 32\nordered = false\ninputs_in_place = false\n")
    config = PoolConfig.from_any(str(toml))
    assert config.workers == 1 and config.ring_mib == 32 and config.ordered is False
    assert config.inputs_in_place is False
    with pytest.raises(MmError, match="unknown mm family"):
        WorkerPool({"family": "llava"})


def test_default_media_policy_refuses_private_urls_and_local_files(images, tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(images["small"])
    server = MediaServer()
    try:
        url = server.put("a.png", images["small"])
        with WorkerPool(SPEC, {"workers": 1, "ring_mib": 64}) as strict:
            by_url = strict.process([P], [url])
            by_path = strict.process([P], [str(path)])
            by_file_uri = strict.process([P], [f"file://{path}"])
    finally:
        server.stop()
    assert not by_url.ok and "refused by the media policy: address 127.0.0.1 is not public (loopback)" in by_url.error
    assert not by_path.ok and by_path.error.endswith("local files are not allowed")
    assert not by_file_uri.ok and by_file_uri.error.endswith("local files are not allowed")
