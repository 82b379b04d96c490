"""WorkerPool.aprocess through its asyncio driver (mmworker.pool.aio): many requests in flight, each
answered exactly once through its own future; cancellation, close and crashes; real processes."""

import asyncio
import gc
import os
import signal
import time

import pytest
from httpserver import MediaServer
from processes import ended, no_leaked_segments, wait_replies  # noqa: F401 (a fixture, autouse here)

from mmworker import WorkerPool
from mmworker.corpus import encode, photo_like
from mmworker.errors import Outcome, UsageError
from mmworker.pool.aio import TICK_S
from mmworker.registry import named_spec

P = 151655
SPEC = {**named_spec("qwen2_vl"), "max_pixels": 1003520}


@pytest.fixture(scope="module")
def images():
    return {
        "small": encode(photo_like(64, 48, seed=1), "PNG"),
        "jpeg": encode(photo_like(640, 480, seed=2), "JPEG"),
    }


def run(main):
    return asyncio.run(asyncio.wait_for(main, 60))  # a lost wake-up fails the test instead of hanging it


class CountingLoop(asyncio.SelectorEventLoop):
    """An ordinary event loop that counts the readers and timers put on it."""

    def __init__(self) -> None:
        super().__init__()
        self.readers = self.timers = 0

    def add_reader(self, fd, callback, *args):
        self.readers += 1
        return super().add_reader(fd, callback, *args)

    def call_at(self, when, callback, *args, context=None):  # call_later comes here too
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)


@pytest.mark.parametrize("ordered", [True, False])
def test_200_requests_in_flight_each_get_their_own_reply(images, ordered):
    # The default queue_depth (256) takes them all at once; every 10th is a rejection. Each
    # request's ids start with its own number, so a reply handed to another request shows.
    async def one(pool, k):
        source = b"junk" if k % 10 == 9 else images["small"]
        reply = await pool.aprocess([k, P], [source], request_id=f"r{k}")
        try:
            assert reply.request_id == f"r{k}"
            if k % 10 == 9:
                assert reply.kind is Outcome.BAD_INPUT and reply.error.startswith("image 0: image decode")
            else:
                assert reply.ok, reply.error
                assert reply.input_ids[0] == k and reply.kind is Outcome.ACCEPTED
        finally:
            reply.release()
        return k

    async def main(pool):
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        done = await asyncio.gather(*(one(pool, k) for k in range(200)))
        elapsed = time.monotonic() - t0
        assert done == list(range(200))
        assert loop.readers == 1  # one reader for all of them
        assert loop.timers <= 2 + elapsed / TICK_S  # the driver's tick, not a timer per request
        await asyncio.gather(*(one(pool, k) for k in range(10)))  # a second wave on the same reader
        assert loop.readers == 1

    with WorkerPool(SPEC, {"workers": 1, "ring_mib": 64, "ordered": ordered}) as pool:
        assert pool.config.queue_depth == 256
        with asyncio.Runner(loop_factory=CountingLoop) as runner:
            runner.run(main(pool))
        assert pool.stats().in_flight == 0 and pool.stats().shm_held_bytes == 0


def test_awaited_and_polled_requests_never_get_each_others_replies(images):
    async def main(pool):
        polled = [pool.submit([7, P], [images["small"]], request_id=f"p{k}") for k in range(5)]
        awaited = await asyncio.gather(
            *(pool.aprocess([8, P], [images["small"]], request_id=f"a{k}") for k in range(5))
        )
        assert [r.request_id for r in awaited] == [f"a{k}" for k in range(5)]
        got = wait_replies(pool, 5, timeout=30)  # poll() blocks the loop: its own deadline, not run()'s
        assert [r.request_id for r in got] == polled and all(r.input_ids[0] == 7 for r in got)
        for r in awaited + got:
            r.release()

    with WorkerPool(SPEC, {"workers": 1, "ring_mib": 64}) as pool:
        run(main(pool))


def test_fetched_sources_through_aprocess(images):
    # Requests that go through the I/O process first (URLs): the router's answers wake the loop too.
    server = MediaServer()
    try:
        url = server.put("a.png", images["small"])

        async def main(pool):
            replies = await asyncio.gather(*(pool.aprocess([P], [url]) for _ in range(8)))
            assert all(r.ok for r in replies), [r.error for r in replies]
            for r in replies:
                r.release()

        with WorkerPool(SPEC, {"workers": 1, "ring_mib": 64, "media": {"allowed_networks": ["127.0.0.1/32"]}}) as pool:
            run(main(pool))
    finally:
        server.stop()


def test_cancelling_a_running_request_cancels_it_and_frees_its_late_answer(images):
    # 8 MiB ring: one 640x480 feature (7.4 MB) at a time. The cancelled request runs on a stopped
    # worker; its answer, arriving once the worker continues, must be freed, or the next request
    # would find no room.
    async def main(pool):
        [pid] = pool.worker_pids()
        os.kill(pid, signal.SIGSTOP)
        try:
            task = asyncio.create_task(pool.aprocess([P], [images["jpeg"]], request_id="gone"))
            await asyncio.sleep(0)  # the task submits: the idle worker gets the job at once
            assert pool._supervisor.slots[0].rid is not None
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            os.kill(pid, signal.SIGCONT)
        after = await pool.aprocess([P], [images["jpeg"]], request_id="gone")  # the id is free again
        assert after.ok, after.error
        after.release()
        assert pool.stats().in_flight == 0 and pool.stats().shm_held_bytes == 0

    with WorkerPool(SPEC, {"workers": 1, "ring_mib": 8, "memory_wait_s": 0.5}) as pool:
        run(main(pool))


def test_a_reply_delivered_as_its_task_is_cancelled_is_released(images):
    # The reply reaches the future, then the task is cancelled before it resumes: the await raises
    # CancelledError, and the reply it can no longer return is released.
    async def main(pool):
        task = asyncio.create_task(pool.aprocess([P], [images["small"]]))
        deadline = time.monotonic() + 30
        while pool.stats().shm_held_bytes == 0:  # until the driver has delivered the reply
            assert time.monotonic() < deadline, "the driver delivered no reply within 30 s"
            await asyncio.sleep(0)
        task.cancel()  # the task has not run since: its future is done
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.stats().shm_held_bytes == 0

    with WorkerPool(SPEC, {"workers": 1, "ring_mib": 64}) as pool:
        run(main(pool))


def test_closing_the_pool_answers_every_pending_await_and_removes_the_reader(images):
    async def main(pool):
        loop = asyncio.get_running_loop()
        [pid] = pool.worker_pids()
        os.kill(pid, signal.SIGSTOP)  # nothing finishes before the close
        tasks = [asyncio.create_task(pool.aprocess([P], [images["small"]])) for _ in range(5)]
        await asyncio.sleep(0)
        fd = pool.fileno()
        assert pool.stats().in_flight == 5
        os.kill(pid, signal.SIGCONT)  # so that close() stops it at once
        pool.close()
        replies = await asyncio.gather(*tasks)  # each returns its one reply; none raises
        assert [r.kind for r in replies] == [Outcome.POOL_CLOSED] * 5
        assert all(r.error == "pool closed" for r in replies)
        assert not loop.remove_reader(fd)  # the driver took it off already
        with pytest.raises(UsageError, match=r"^pool closed: submit after close\(\)$"):
            await pool.aprocess([P], [images["small"]])  # misuse still raises

    pool = WorkerPool(SPEC, {"workers": 1, "ring_mib": 64})
    try:
        run(main(pool))
    finally:
        pool.close()


def test_a_worker_killed_with_requests_in_flight(images):
    # No fd announces a dead worker: the driver's tick notices it. The request it ran gets
    # WORKER_CRASHED, the queued ones and later ones succeed on its replacement.
    async def main(pool):
        [pid] = pool.worker_pids()
        os.kill(pid, signal.SIGSTOP)
        tasks = [asyncio.create_task(pool.aprocess([P], [images["small"]], request_id=k)) for k in range(4)]
        await asyncio.sleep(0)
        assert pool._supervisor.slots[0].rid is not None  # the first is on the stopped worker, three queued
        os.kill(pid, signal.SIGKILL)
        replies = await asyncio.gather(*tasks)
        assert replies[0].kind is Outcome.WORKER_CRASHED and replies[0].error.startswith("worker crashed")
        assert all(r.ok for r in replies[1:]), [r.error for r in replies]
        later = await asyncio.gather(*(pool.aprocess([P], [images["small"]]) for _ in range(4)))
        assert all(r.ok for r in later)
        for r in replies + later:
            r.release()
        assert pool.worker_pids() != [pid] and pool.stats().restarts == 1

    with WorkerPool(SPEC, {"workers": 1, "ring_mib": 64}) as pool:
        run(main(pool))


def test_a_pool_collected_while_its_reader_is_on_a_loop_takes_it_off(images):
    async def main():
        loop = asyncio.get_running_loop()
        pool = WorkerPool(SPEC, {"workers": 1, "ring_mib": 64})
        with await pool.aprocess([P], [images["small"]]) as reply:
            assert reply.ok
        fd, pids = pool.fileno(), [*pool.worker_pids(), pool.io_pid()]
        del pool, reply
        gc.collect()
        assert all(ended(pid) for pid in pids)
        assert not loop.remove_reader(fd)

    run(main())
