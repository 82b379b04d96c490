"""A worker's CPU budget per job: SIGVTALRM raises BudgetExceeded inside the job's computation, nowhere else.

The budget is the process's virtual timer (user CPU time), and its signal's handler raises. An
exception that can strike between any two bytecodes must not strike where code cannot be cut in
two: between jobs, in a send, in the except clause that answers a failed job, or inside the
ring's bookkeeping (an allocation made but not yet recorded by the job would never be freed; a
ring cut between its own updates would hand out memory a reply still views). So the signal is
blocked in this thread except while `run` computes, and `held()` blocks it again inside. A
signal that expires while blocked waits, and strikes the moment the block ends.

Nor may it strike in Python that numba's compiled code calls back into (returning new arrays from
nopython code unpickles their dtypes in `numba.core.serialize`): numba's C code then swallows the
exception, so the job runs on past its budget, or turns it into a SystemError. The first bytecode
after a long kernel is often there. So an expiry that finds numba frames on top strikes instead
at the next line that the Python code which called numba runs: those frames (up to `run`'s) get a
trace function that raises, and tracing is on for that thread until it does or `run` ends.

Only this thread can take the signal: a worker has no other (numba, blake3 and Pillow run
single-threaded there, and its channels are plain sockets: no libzmq threads).
"""

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

import llvmlite
import numba

from mmworker.errors import BudgetExceeded

T = TypeVar("T")
MESSAGE = "exceeded the CPU budget (image_cpu_s per image, video_cpu_s per video)"
_SIGNALS = {signal.SIGVTALRM}
_NUMBA_SOURCES = tuple(os.path.dirname(module.__file__) + os.sep for module in (numba, llvmlite))


class CpuBudget:
    """Owns SIGVTALRM and the virtual timer of the process; make one, in the main thread, and `close()` it."""

    def __init__(self) -> None:
        self._run_frame: FrameType | None = None  # while `run` computes
        self._traced: list[FrameType] = []  # frames that strike at their next line (see the module docstring)
        self._holding = 0  # `held()` blocks open
        self._previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        self._previous_handler = signal.signal(signal.SIGVTALRM, self._expired)

    def run(self, seconds: float, compute: Callable[[], T]) -> T:
        """compute(), interrupted by BudgetExceeded once the process has spent `seconds` of CPU on it."""
        _discard_pending()  # one that arrived between jobs (a stray kill) is not this job's
        self._run_frame = sys._getframe()
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
            self._untrace()  # a strike still waiting for a line: the job is over
            self._run_frame = None
            _discard_pending()  # expired after the block: the job is over

    @contextmanager
    def held(self) -> Iterator[None]:
        """Inside `run`: the block runs whole; an expiry during it strikes as the block ends."""
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def _expired(self, signum: int, frame: FrameType | None) -> None:
        caller = frame
        while caller is not None and caller.f_code.co_filename.startswith(_NUMBA_SOURCES):
            caller = caller.f_back
        if caller is frame:
            raise BudgetExceeded(MESSAGE)
        while caller is not None and caller is not self._run_frame:  # numba called back: strike in its caller
            caller.f_trace = self._strike
            self._traced.append(caller)
            caller = caller.f_back
        sys.settrace(_no_new_frames)  # frames' own trace functions run only while tracing is on

    def _strike(self, frame: FrameType, event: str, arg: object) -> Callable | None:
        if self._holding:  # never inside a held block: its end comes first
            return self._strike
        self._untrace()
        raise BudgetExceeded(MESSAGE)

    def _untrace(self) -> None:
        if self._traced:
            sys.settrace(None)
            for frame in self._traced:
                frame.f_trace = None
            self._traced.clear()

    def close(self) -> None:
        """Disarm and give the signal back as it was."""
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        _discard_pending()
        signal.signal(signal.SIGVTALRM, self._previous_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._previous_mask)


def _no_new_frames(frame: FrameType, event: str, arg: object) -> None:
    return None  # frames called from here on are not traced


def _discard_pending() -> None:
    if signal.SIGVTALRM in signal.sigpending():
        signal.sigwait(_SIGNALS)  # returns at once: it is pending, and blocked here
