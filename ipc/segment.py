"""POSIX shared-memory segments: creation, attachment, names, removal, and the stale-segment sweep.

These are the objects `multiprocessing.shared_memory` makes (on Linux `shm_open` is `open(2)` on
/dev/shm), handled directly so that no resource tracker is involved: before Python 3.13 the tracker
registers attach-only segments too and unlinks them when an attaching process exits (gh-82300),
which is exactly the double-unlink / destroyed-live-buffer class of bug to avoid.

Lifecycle, one owner:
  1. the owner `create`s: refused at once if /dev/shm has less room free than the segment, then
     O_CREAT|O_EXCL, mode 0600, then `posix_fallocate` so that a /dev/shm that filled meanwhile
     fails here with ENOSPC instead of SIGBUS at the first write later (fallocate also
     allocates the pages, so no write later pays for faulting in fresh ones);
  2. the peers `attach` by name with MAP_POPULATE (their page tables are filled once, up front);
  3. the owner `unlink`s the name as soon as every party has mapped it. From then on the memory
     lives exactly as long as some mapping does: a crash of anyone, even SIGKILL, cannot leak it.
A segment that processes started later must map too (the client's request ring, read by every
worker and by the workers that replace them) is shared as an inherited read-only descriptor
instead (`reader_fd`, `map_fd`): its name goes at once, and the memory lives while the descriptor
or a mapping does.
Names carry the creating process's pid and start time (`PREFIX-<pid>-<start>-<tag>`), so the
start-up sweep removes segments whose creator is gone, and never one whose creator is alive (a
recycled pid has another start time).
"""

import errno
import mmap
import os
import secrets
import stat
from collections.abc import Callable

from ipc.errors import SharedMemoryError

SHM_DIR = "/dev/shm"
PREFIX = "mmw"


def process_start_time(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    fields = stat_line[stat_line.rindex(b")") + 2 :].split()
    return int(fields[19])


def creator_stamp() -> str:
    """`<pid>-<start time>` of this process: what names of things it creates begin with after their prefix."""
    pid = os.getpid()
    return f"{pid}-{process_start_time(pid)}"


def creator_is_gone(name: str, prefix: str) -> bool:
    """Whether `name` is `prefix-<pid>-<start>-...` (a `creator_stamp` name) and that process no longer
    exists (its pid gone, or now another process's, with another start time). False for other names."""
    parts = name.split("-")
    if len(parts) < 4 or parts[0] != prefix or not parts[1].isdigit() or not parts[2].isdigit():
        return False
    return process_start_time(int(parts[1])) != int(parts[2])


def new_name(tag: str) -> str:
    """A fresh segment name owned by this process: PREFIX-<pid>-<start time>-<tag>-<random>."""
    if not tag.replace("_", "").isalnum():
        raise ValueError(f"segment tag must be alphanumeric (underscores allowed), got {tag!r}")
    return f"{PREFIX}-{creator_stamp()}-{tag}-{secrets.token_hex(4)}"


def free_bytes() -> int:
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


class Segment:
    """One mapped shared-memory segment. Only the creator may `unlink`; everyone must `close`."""

    def __init__(self, name: str, size: int, buf: mmap.mmap, *, owner: bool, writable: bool) -> None:
        self.name = name
        self.size = size
        self._mmap = buf
        self.owner = owner
        self.writable = writable
        self._linked = owner

    @classmethod
    def create(cls, name: str, size: int) -> "Segment":
        """Create, reserve and map a new segment of `size` bytes (SharedMemoryError if impossible)."""
        if size <= 0:
            raise SharedMemoryError(f"shared memory: segment size must be positive, got {size}")
        no_room = (f"shared memory: {SHM_DIR} cannot hold a {size}-byte segment ({{}} bytes free); "
                   "enlarge it (e.g. docker --shm-size) or shrink the rings")  # fmt: skip
        # Refused before any page is taken: on tmpfs, posix_fallocate takes pages until it runs out,
        # so a segment larger than what is free would first take all of it (where /dev/shm is sized
        # like the host's memory, enough to wake the OOM killer). fallocate stays the check that
        # counts, since the free space may shrink meanwhile.
        free = free_bytes()
        if size > free:
            raise SharedMemoryError(no_room.format(free))
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise SharedMemoryError(f"shared memory: cannot create {path}: {exc.strerror}") from exc
        try:
            os.fchmod(fd, 0o600)  # the umask can only remove bits, but be explicit about the mode
            buf = _reserve(fd, size, lambda: no_room.format(free_bytes()))
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        return cls(name, size, buf, owner=True, writable=True)

    @classmethod
    def attach(cls, name: str, *, writable: bool) -> "Segment":
        """Map an existing segment by name (read-only unless `writable`)."""
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
        except OSError as exc:
            raise SharedMemoryError(f"shared memory: cannot attach {path}: {exc.strerror}") from exc
        try:
            size, buf = _map(fd, path, writable=writable, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        finally:
            os.close(fd)
        return cls(name, size, buf, owner=False, writable=writable)

    @classmethod
    def anonymous(cls, tag: str, size: int) -> tuple["Segment", int]:
        """A nameless writable segment (memfd) and its descriptor, for handing to a peer over a
        socket (ipc.inbox): nothing appears in /dev/shm, so nothing can leak; the memory lives while
        the descriptor or a mapping does. The caller closes both."""
        if size <= 0:
            raise SharedMemoryError(f"shared memory: segment size must be positive, got {size}")
        fd = os.memfd_create(f"{PREFIX}-{tag}", os.MFD_CLOEXEC)
        try:
            buf = _reserve(fd, size, lambda: f"shared memory: no room for a {size}-byte {tag} segment")
        except BaseException:
            os.close(fd)
            raise
        return cls(f"memfd:{tag}", size, buf, owner=False, writable=True), fd

    def reader_fd(self) -> int:
        """A new read-only descriptor of this (still linked) segment, for children to inherit
        (`subprocess.Popen(pass_fds=...)`) and `map_fd`; the caller closes it."""
        try:
            return os.open(os.path.join(SHM_DIR, self.name), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise SharedMemoryError(f"shared memory: cannot open {self.name} for reading: {exc.strerror}") from exc

    @classmethod
    def map_fd(cls, fd: int, *, writable: bool = False) -> "Segment":
        """Map an inherited descriptor of a segment (see `reader_fd`, `anonymous`), read-only unless
        `writable` (which needs a descriptor opened for writing); the fd stays open."""
        try:
            size, buf = _map(fd, f"descriptor {fd}", writable=writable, flags=mmap.MAP_SHARED)
        except OSError as exc:
            raise SharedMemoryError(f"shared memory: cannot map descriptor {fd}: {exc.strerror}") from exc
        return cls(f"fd:{fd}", size, buf, owner=False, writable=writable)

    @property
    def buffer(self) -> memoryview:
        """The mapped bytes (writable only for a writable mapping)."""
        view = memoryview(self._mmap)
        return view if self.writable else view.toreadonly()

    def unlink(self) -> None:
        """Remove the name (creator only, once); the memory stays while any mapping exists."""
        if not self.owner:
            raise SharedMemoryError(f"shared memory: only the creator may unlink {self.name}")
        if self._linked:
            self._linked = False
            os.unlink(os.path.join(SHM_DIR, self.name))

    def close(self) -> bool:
        """Unmap if nothing still views the memory; returns False (and keeps the mapping) if something does.

        A zero-copy numpy view pins the mapping, so the unmap then happens when the last view is
        garbage collected instead; the name is gone already, so nothing can leak either way.
        """
        try:
            self._mmap.close()
        except BufferError:
            return False
        return True

    def __repr__(self) -> str:
        role = "owner" if self.owner else "attached"
        return f"Segment({self.name!r}, {self.size} bytes, {role}, {'linked' if self._linked else 'unlinked'})"


def _reserve(fd: int, size: int, no_room: Callable[[], str]) -> mmap.mmap:
    """Size a fresh descriptor, allocate its pages and map it writable. A shortage of memory fails
    here as SharedMemoryError(no_room()), not as SIGBUS at the first write later."""
    os.ftruncate(fd, size)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            raise SharedMemoryError(no_room()) from exc
        raise
    return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def _map(fd: int, what: str, *, writable: bool, flags: int) -> tuple[int, mmap.mmap]:
    """(size, mapping) of a whole segment's descriptor; SharedMemoryError if it is empty."""
    size = os.fstat(fd).st_size
    if size <= 0:
        raise SharedMemoryError(f"shared memory: {what} is empty")
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    return size, mmap.mmap(fd, size, flags, prot)


def sweep_stale(prefix: str = PREFIX) -> list[str]:
    """Remove segments named `prefix-<pid>-<start>-...` whose creating process no longer exists.

    Only our own naming scheme is touched, and only when the creator's pid is gone or now belongs
    to a process with another start time. Returns the names removed.
    """
    removed = []
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not creator_is_gone(entry, prefix):
            continue  # not our naming scheme, or the creator is alive: not ours to remove
        path = os.path.join(SHM_DIR, entry)
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)
                removed.append(entry)
        except FileNotFoundError:
            continue
    return removed
