"""A worker's CPU budget per job: SIGVTALRM raises BudgetExceeded inside the job's computation, nowhere else.

The budget is the process's virtual timer (user CPU time), and its signal's handler raises. An
exception that can strike between any two bytecodes must not strike where code cannot be cut in
two: between jobs, in a send, in the except clause that answers a failed job, or inside the
ring's bookkeeping (an allocation made but not yet recorded by the job would never be freed; a
ring cut between its own updates would hand out memory a reply still views). So the signal is
blocked in this thread except while `run` computes, and `held()` blocks it again inside. A
signal that expires while blocked waits, and strikes the moment the block ends.

Only this thread can take the signal: a worker has no other (numba, blake3 and Pillow run
single-threaded there, and its channels are plain sockets: no libzmq threads).
"""

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from mmworker.errors import BudgetExceeded

T = TypeVar("T")
MESSAGE = "exceeded the CPU budget (image_cpu_s per image)"
_SIGNALS = {signal.SIGVTALRM}


class CpuBudget:
    """Owns SIGVTALRM and the virtual timer of the process; make one, in the main thread, and `close()` it."""

    def __init__(self) -> None:
        self._previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        self._previous_handler = signal.signal(signal.SIGVTALRM, _expired)

    def run(self, seconds: float, compute: Callable[[], T]) -> T:
        """compute(), interrupted by BudgetExceeded once the process has spent `seconds` of CPU on it."""
        _discard_pending()  # one that arrived between jobs (a stray kill) is not this job's
        signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
            try:
                return compute()
            finally:
                # An expiry already taken strikes in this call (Python runs pending handlers
                # before pthread_sigmask returns), so still inside this try.
                signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            _discard_pending()  # expired after the block: the job is over

    @contextmanager
    def held(self) -> Iterator[None]:
        """Inside `run`: the block runs whole; an expiry during it strikes as the block ends."""
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def close(self) -> None:
        """Disarm and give the signal back as it was."""
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        _discard_pending()
        signal.signal(signal.SIGVTALRM, self._previous_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._previous_mask)


def _expired(signum: int, frame: object) -> None:
    raise BudgetExceeded(MESSAGE)


def _discard_pending() -> None:
    if signal.SIGVTALRM in signal.sigpending():
        signal.sigwait(_SIGNALS)  # returns at once: it is pending, and blocked here
