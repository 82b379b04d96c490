"""What the process and shared-memory tests check alike: the /dev/shm segments a process created,
whether a process has ended (exited, or a zombie nobody has reaped yet), and its open fds."""

import contextlib
import os

from ipc.segment import PREFIX, SHM_DIR


def segments_of(pid: int | None = None) -> list[str]:
    """Names of the segments `pid` (default: this process) created that still exist."""
    prefix = f"{PREFIX}-{os.getpid() if pid is None else pid}-"
    return sorted(e for e in os.listdir(SHM_DIR) if e.startswith(prefix))


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
