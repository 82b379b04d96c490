"""Tying a child process's life to its parent's: the child dies when the parent does, however it dies."""

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent exits (Linux PR_SET_PDEATHSIG).

    Then check that `parent_pid` is still our parent: if it died before the call, the kernel will
    never send the signal, so exit now instead. SIGKILL by default: a worker whose client is gone
    has nobody to answer and nothing to clean up (its segments were unlinked at start-up).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent_pid:
        os._exit(1)
