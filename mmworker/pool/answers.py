"""The replies a pool owes: exactly one per submitted request, handed out in submission order (or
as they finish), or each straight to its own recipient (the asyncio driver's futures), and the
caller's request ids they answer."""

import collections
import time
from collections.abc import Callable
from typing import Any

from mmworker.errors import Outcome, UsageError
from mmworker.pool.reply import Reply


class Answers:
    """Requests are known by the pool's own `rid` (increasing) and by the caller's `request_id`,
    which is unique among those not yet handed out.

    A request owed with a `deliver` callable gets its reply through it the moment the reply is
    given, past any order; the others wait for `ready` or `take`. Either way the reply's lease
    (an accepted reply's hold on shared memory) learns when it was handed out, which a "shared
    memory full" message reports.
    """

    def __init__(self, ordered: bool) -> None:
        self._ordered = ordered
        self._order: collections.deque[int] = collections.deque()  # rids owed, in submission order
        self._finished: dict[int, Reply] = {}  # rid -> its reply, not yet handed out
        self._rids: dict[Any, int] = {}  # request_id -> rid, until its reply is handed out
        self._deliver: dict[int, Callable[[Reply], None]] = {}  # rid -> where its reply goes at once

    def owe(self, rid: int, request_id: Any, deliver: Callable[[Reply], None] | None = None) -> None:
        """Register a new request; UsageError if `request_id` is still in flight or cannot be a key."""
        if self.rid_of(request_id) is not None:
            raise UsageError(f"request id {request_id!r} is already in flight")
        self._rids[request_id] = rid
        if deliver is None:
            self._order.append(rid)
        else:
            self._deliver[rid] = deliver

    def rid_of(self, request_id: Any) -> int | None:
        """The rid of `request_id`'s reply not yet handed out; None if there is none. UsageError if
        `request_id` cannot be a request id (it is not hashable)."""
        try:
            return self._rids.get(request_id)
        except TypeError:
            raise UsageError(f"a request id must be hashable, got {type(request_id).__name__}") from None

    def give(self, rid: int, reply: Reply) -> None:
        """Its one reply (a later one for the same rid replaces it: see `abort`)."""
        deliver = self._deliver.pop(rid, None)
        if deliver is None:
            self._finished[rid] = reply
            return
        self._rids.pop(reply.request_id, None)
        _handed_out(reply)
        deliver(reply)

    def has(self, rid: int) -> bool:
        """Whether `rid`'s reply is in, not yet handed out."""
        return rid in self._finished

    def abort(self, rid: int) -> None:
        """Turn a finished reply not yet handed out into "aborted", releasing what it holds."""
        reply = self._finished[rid]
        reply.release()
        self._finished[rid] = Reply(reply.request_id, False, "aborted", Outcome.ABORTED, latency_ms=reply.latency_ms)

    def ready(self) -> list[Reply]:
        """Hand out what may go now: in order, the finished ones up to the first still owed;
        unordered, every finished one."""
        if not self._finished:
            return []
        out = []
        if self._ordered:
            while self._order and self._order[0] in self._finished:
                out.append(self._pop(self._order.popleft()))
        else:
            for rid in [r for r in self._order if r in self._finished]:
                self._order.remove(rid)
                out.append(self._pop(rid))
        return out

    def take(self, rid: int) -> Reply:
        """Hand out `rid`'s finished reply now, whatever the order (`process` waits for just one)."""
        self._order.remove(rid)
        return self._pop(rid)

    def _pop(self, rid: int) -> Reply:
        reply = self._finished.pop(rid)
        self._rids.pop(reply.request_id, None)
        _handed_out(reply)
        return reply


def _handed_out(reply: Reply) -> None:
    lease = reply._lease
    if lease is not None:
        lease.handed_out = time.monotonic()
