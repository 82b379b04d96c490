"""What the process and shared-memory tests check alike: the /dev/shm segments a process created,
and whether a process has ended (exited, or a zombie nobody has reaped yet)."""

import os

from ipc.segment import PREFIX, SHM_DIR


def segments_of(pid: int | None = None) -> list[str]:
    """Names of the segments `pid` (default: this process) created that still exist."""
    prefix = f"{PREFIX}-{os.getpid() if pid is None else pid}-"
    return sorted(e for e in os.listdir(SHM_DIR) if e.startswith(prefix))


def ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
