"""The pool's asyncio face: one reader on the pool's fd, one future per request.

    aprocess(...) --submit(deliver=...)--> pool            event loop
         |                                   ^               |
         '-- await future <-- set_result --- | <-- _turn <---+-- reader on pool.fileno() (one per pool per loop)
                                             '-- _tick <-----+-- a timer every 50 ms, while requests are in flight

`WorkerPool.aprocess` makes one `PoolDriver` per event loop, the first time it runs on that loop.
The driver puts one reader on `WorkerPool.fileno()` for the pool's life (or the loop's), whose
callback turns the pool's engine once over whatever has arrived (results, the I/O process's
answers, releases posted by finalizers) without waiting. Each request is submitted with a
`deliver` callable bound to its future, so its reply goes to that future the moment the pool
gives it, whatever the pool's order (`ordered` only shapes `poll()`), and no request's reply is
ever handed to another caller or to `poll()`. A timer turns the engine every 50 ms while
requests are in flight, for what no fd announces: a worker that died (its replacement, its
request's "worker crashed"), a deadline passed. So the loop does per request one submit, one
future and its wake-up: no reader or timer is added or removed per request.

Cancelling the awaiting task cancels the request in the pool (its "aborted" reply goes nowhere);
a reply already on its way is released, and a worker's answer that comes later is freed by the
pool. Closing the pool answers every pending request ("pool closed", through the same futures),
then takes the reader off the loop.

The driver holds the pool weakly: a pool nobody holds can be collected while its reader is on a
loop; its finalizer detaches the driver before the fd closes.
"""

import asyncio
import contextlib
import functools
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mmworker.pool.reply import Reply

if TYPE_CHECKING:
    from mmworker.pool.client import WorkerPool

# How often the engine runs its periodic checks (dead workers, deadlines) while requests are in
# flight: what no fd announces is noticed within this.
TICK_S = 0.05


class PoolDriver:
    """One pool on one event loop: the reader, the timer and the futures of its requests."""

    def __init__(self, pool: "WorkerPool", loop: asyncio.AbstractEventLoop) -> None:
        self._pool = weakref.ref(pool)
        self._loop = loop
        self._fd = pool.fileno()
        self._in_flight = 0  # requests whose reply has not been delivered
        self._timer: asyncio.TimerHandle | None = None
        self._attached = True
        loop.add_reader(self._fd, self._turn)

    async def process(
        self,
        input_ids: Sequence[int] | np.ndarray,
        images: Sequence[str | bytes | bytearray | memoryview],
        request_id: Any,
        mm_hashes: Sequence[str] | None,
        content_hashes: Sequence[str | None] | None = None,
        videos: Sequence[str | bytes | bytearray | memoryview] = (),
    ) -> Reply:
        """Submit one request and await its reply (see `WorkerPool.aprocess`)."""
        pool = self._pool()
        assert pool is not None  # the caller (WorkerPool.aprocess) holds it
        future = self._loop.create_future()
        deliver = functools.partial(self._deliver, future)
        self._in_flight += 1  # before the submit: a rejection is delivered inside it
        try:
            request_id = pool._submit(input_ids, images, request_id, mm_hashes, deliver, content_hashes, videos)
        except BaseException:  # misuse (UsageError: after close, a request id in flight): nothing was owed
            self._in_flight -= 1
            raise
        if future.done():  # rejected at submit
            return future.result()
        if self._timer is None:
            self._timer = self._loop.call_later(TICK_S, self._tick)
        if not pool._res.router.settled:
            # The submit sent to the I/O process: the router's fd announces only what arrives
            # after a receive (ipc.channels.Router.settled), so receive once now.
            pool._engine.step()
        try:
            return await future
        except asyncio.CancelledError:
            if future.cancelled():
                pool.cancel(request_id)  # its "aborted" reply comes back to _deliver, which drops it
            else:  # the reply came as the task was being cancelled: nobody will take it
                future.result().release()
            raise

    def _deliver(self, future: asyncio.Future, reply: Reply) -> None:
        """The pool gives `reply` (on the loop's thread, inside a turn of its engine)."""
        self._in_flight -= 1
        if future.done():  # its task was cancelled
            reply.release()
        else:
            future.set_result(reply)

    def _turn(self) -> None:
        """The reader's callback: the pool's fd is readable."""
        pool = self._pool()
        if pool is None or pool._res.closed:  # its teardown detaches this; until then, nothing to do
            return
        pool._engine.step()

    def _tick(self) -> None:
        self._timer = None
        pool = self._pool()
        if pool is None or pool._res.closed:
            return
        pool._engine.step()
        if self._in_flight and self._attached:
            self._timer = self._loop.call_later(TICK_S, self._tick)

    def detach(self) -> None:
        """Take the reader and the timer off the loop (idempotent; from any thread: the pool's
        finalizer may run on another one, and then this happens on the loop's next turn)."""
        if not self._attached:
            return
        self._attached = False
        loop = self._loop
        if loop.is_closed():
            return
        if not loop.is_running() or asyncio._get_running_loop() is loop:
            self._detach_now()
        else:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(self._detach_now)

    def _detach_now(self) -> None:
        self._loop.remove_reader(self._fd)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
