"""The requests in flight: each one's `State`, and the table that gives each exactly one reply.

A request enters the table once its inputs are checked (FETCHING or QUEUED), moves to RUNNING
when a worker takes it, and leaves it with its reply. A cancelled request is answered "aborted" at
once; if the I/O process or a worker still has it, it stays in the table, cancelled, until that
answer arrives, which is then dropped (and the memory it holds given back): so a late answer is
never taken for another request's, and never answers a request twice.
"""

import enum
import itertools
import time
from collections.abc import Callable
from typing import Any

from mmworker.errors import Outcome
from mmworker.pool.answers import Answers
from mmworker.pool.cache import Plan
from mmworker.pool.inputs import RequestInputs
from mmworker.pool.reply import Reply


class State(enum.Enum):
    """Where a request in the table is."""

    FETCHING = "fetching"  # at the I/O process (URLs, files)
    WAITING = "waiting"  # for an identical image another request is computing (mmworker.pool.cache)
    QUEUED = "queued"  # waiting for an idle worker
    RUNNING = "running"  # on a worker (its Slot.rid)
    CANCELLED_FETCHING = "cancelled_fetching"  # answered "aborted"; the I/O process's answer is dropped
    CANCELLED_RUNNING = "cancelled_running"  # answered "aborted"; the worker's answer is dropped, its memory freed


CANCELLED = frozenset({State.CANCELLED_FETCHING, State.CANCELLED_RUNNING})
_CANCELLED_FROM = {State.FETCHING: State.CANCELLED_FETCHING, State.RUNNING: State.CANCELLED_RUNNING}


class Request:
    """One submitted request: the caller's id, the pool's own number (`rid`), its inputs, its times."""

    __slots__ = ("cache", "deadline", "dispatched", "inputs", "request_id", "rid", "state", "submitted")

    def __init__(self, rid: int, request_id: Any, submitted: float) -> None:
        self.rid, self.request_id, self.submitted = rid, request_id, submitted
        self.state: State | None = None  # until it enters the table
        self.inputs: RequestInputs | None = None  # once checked
        self.deadline = 0.0  # handed to a worker + deadline_s
        self.dispatched = 0.0
        self.cache: Plan | None = None  # what the feature cache decided for it, if the pool has one


class InFlight:
    """The table of requests in flight by `rid`, the counters of what became of them, and the one
    reply each is owed (`answers`)."""

    def __init__(self, ordered: bool) -> None:
        self.table: dict[int, Request] = {}
        self.answers = Answers(ordered)
        self.submitted = self.accepted = self.rejected = 0
        self._rids = itertools.count(1)
        self._auto_ids = itertools.count(1)
        self.on_leave: Callable[[Request], None] | None = None  # told of each request that leaves the table

    def open(self, request_id: Any, deliver: Callable[[Reply], None] | None) -> Request:
        """A new request, owed its reply (through `deliver`, if given); UsageError if `request_id` is
        still in flight or not hashable. It is not in the table yet (`enter`)."""
        if request_id is None:
            request_id = next(self._auto_ids)
        req = Request(next(self._rids), request_id, time.monotonic())
        self.answers.owe(req.rid, request_id, deliver)
        self.submitted += 1
        return req

    def enter(self, req: Request, state: State) -> None:
        """`req` passed its checks at submit: it is in flight, in `state`."""
        req.state = state
        self.table[req.rid] = req

    def reject(self, req: Request, error: str, kind: Outcome) -> None:
        """Answer `req` with `error` of `kind`; it leaves the table."""
        self._rejection(req, error, kind)
        self._leave(req)

    def accept(self, req: Request, reply: Reply) -> None:
        """Answer `req` with its accepted reply; it leaves the table."""
        reply.latency_ms = (time.monotonic() - req.submitted) * 1e3
        self.accepted += 1
        self.answers.give(req.rid, reply)
        self._leave(req)

    def cancel(self, req: Request) -> None:
        """Answer `req` "aborted". One the I/O process or a worker still has stays in the table,
        cancelled, until its answer arrives (`answered` drops it then); a cancelled one is left alone."""
        if req.state in CANCELLED:  # answered already
            return
        cancelled = _CANCELLED_FROM.get(req.state)
        self._rejection(req, "aborted", Outcome.ABORTED)
        if cancelled is None:
            self._leave(req)
        else:
            req.state = cancelled

    def ended(self, req: Request, error: str, kind: Outcome) -> None:
        """The process that had `req` is gone (crashed, or killed past its deadline): answer it, unless
        it was cancelled (its "aborted" was its answer); either way it leaves the table."""
        if req.state in CANCELLED:
            self._leave(req)
        else:
            self.reject(req, error, kind)

    def answered(self, rid: int) -> Request | None:
        """The live request that an answer from the I/O process or a worker is for; None if it is gone
        or was cancelled (then it leaves the table now: the answer is to be dropped)."""
        req = self.table.get(rid)
        if req is not None and req.state in CANCELLED:
            self._leave(req)
            return None
        return req

    def close(self) -> None:
        """Answer every request still owed a reply "pool closed", and forget them all."""
        for req in list(self.table.values()):
            if req.state not in CANCELLED:
                self._rejection(req, "pool closed", Outcome.POOL_CLOSED)
        self.table.clear()

    def _leave(self, req: Request) -> None:
        if self.table.pop(req.rid, None) is not None and self.on_leave is not None:
            self.on_leave(req)

    def _rejection(self, req: Request, error: str, kind: Outcome) -> None:
        self.rejected += 1
        latency = (time.monotonic() - req.submitted) * 1e3
        self.answers.give(req.rid, Reply(req.request_id, False, error, kind, latency_ms=latency))
