"""What the process and shared-memory tests check alike: the /dev/shm segments a process created
(and a fixture that fails a test leaving any), whether a process has ended (exited, or a zombie
nobody has reaped yet) or ends within a deadline, its open fds, making a child process one its own
children may not read (process_vm_readv), and waiting, each with a deadline, for a pool's replies
and for a line a child process prints."""

import contextlib
import gc
import os
import select
import time
from typing import IO

import pytest

from ipc.segment import PREFIX, SHM_DIR

# The start of a `python -c` script whose process its own children may not read: not dumpable
# (that stops readers of the same user) and, as root, its children never get CAP_SYS_PTRACE (which
# would override that; without it they also lack capabilities this process has, which denies them too).
UNTRACEABLE = """
import ctypes, os
_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE, PR_CAPBSET_DROP, CAP_SYS_PTRACE = 4, 24, 19
if os.geteuid() == 0 and _libc.prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")
if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "PR_SET_DUMPABLE")
"""


def segments_of(pid: int | None = None) -> list[str]:
    """Names of the segments `pid` (default: this process) created that still exist."""
    prefix = f"{PREFIX}-{os.getpid() if pid is None else pid}-"
    return sorted(e for e in os.listdir(SHM_DIR) if e.startswith(prefix))


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """A module that imports this checks after each of its tests that no segment of this process is left."""
    yield
    gc.collect()
    assert segments_of() == []


def wait_replies(pool, n: int, timeout: float = 60.0) -> list:
    """`n` replies from `pool.poll`, or an assertion naming how many came within `timeout`."""
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += pool.poll(0.2)
    assert len(got) == n, f"{len(got)} of {n} replies"
    return got


def open_fds(pid: int | str = "self") -> dict[str, str]:
    """A process's open fds and what they point at (the target makes a failure message useful)."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile (the one listdir used, for "self")
            out[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
    return out


def ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def all_end_within(pids: list[int], seconds: float) -> bool:
    """Whether every process in `pids` (children or not) ends within `seconds`: a wait on each one's
    pidfd, which becomes readable when the process exits (a zombie counts), never a polling loop."""
    deadline = time.monotonic() + seconds
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone and reaped already
        try:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return False
        finally:
            os.close(fd)
    return True


def line_within(stream: IO, seconds: float, what: str) -> str:
    """The next line a child process prints on `stream` (its stdout pipe) within `seconds`, or an
    assertion naming `what` was awaited and what came. It reads the pipe's fd a byte at a time, so
    nothing past the line is buffered where a later wait cannot see it: never mix it with the
    stream's own read methods."""
    fd, line = stream.fileno(), bytearray()
    deadline = time.monotonic() + seconds
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], f"no {what} within {seconds} s (got {bytes(line)!r})"
        byte = os.read(fd, 1)
        assert byte, f"the process closed its output before {what} (got {bytes(line)!r})"
        line += byte
    return line.decode()
