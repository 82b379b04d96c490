"""A worker's inbox: one AF_UNIX SOCK_SEQPACKET pair per worker for what its client sends it, past libzmq.

The client keeps one end (`Inbox`), the worker inherits the other (`InboxReader`). What travels
here: Jobs, and Releases of the worker's ring allocations (ipc.ring). A record is one wire header
(ipc.wire.encode; never payload frames) and, with a Job, optionally one descriptor (SCM_RIGHTS) of
memory that holds the job's inputs when the client's request ring had no room (never with a Job
whose inputs the worker reads in place from the client's memory).

Why not ZeroMQ for this direction: a ZeroMQ context starts an I/O thread in every process that has
one, and a ZeroMQ send only hands the message to it; that thread then wakes up and writes the
socket, so each job costs the client a second thread's wake-up, and a worker would carry a libzmq
thread beside its compute thread. Here the client's own thread makes one sendmsg(2) and the worker
needs no libzmq threads at all. (bench/zmq_floor.py measures the difference; bench/HISTORY.md has
the runs. ZeroMQ still carries the client's traffic with its I/O process: ipc.channels.)

The client's end never blocks: a full queue (the worker is not reading) makes `send` return False
and the caller keeps the message for later. A worker that is gone makes it raise ChannelClosed.
"""

import array
import socket

from ipc.errors import ChannelClosed, IpcError, WireError
from ipc.records import MAX_RECORD_BYTES, RecordReceiver, adopt, check_whole
from ipc.wire import Job, Message, decode, encode

_FD_BYTES = array.array("i").itemsize
# Room for two descriptors, so a record that carries more than the one allowed shows as such.
_ANCILLARY_BYTES = socket.CMSG_SPACE(2 * _FD_BYTES)
_MSG_CTRUNC, _MSG_NOSIGNAL = int(socket.MSG_CTRUNC), int(socket.MSG_NOSIGNAL)


class Inbox:
    """The client's side of one worker's inbox: both ends until the worker has inherited its own."""

    def __init__(self) -> None:
        self._sock, self._worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.setblocking(False)

    @property
    def worker_fd(self) -> int:
        """The worker's end, for `subprocess.Popen(pass_fds=...)`; call `handed_over` after that."""
        if self._worker_end is None:
            raise IpcError("inbox: the worker's end was handed over already")
        return self._worker_end.fileno()

    def handed_over(self) -> None:
        """Close this process's copy of the worker's end: from now on only the worker holds it, so
        its exit shows here as ChannelClosed."""
        if self._worker_end is not None:
            self._worker_end.close()
            self._worker_end = None

    def send(self, message: Message, fd: int | None = None) -> bool:
        """Queue one record (with `fd`, a Job's inputs); False if the queue is full now (nothing is
        sent then). ChannelClosed if the worker is gone; IpcError if the record is too large."""
        record = encode(message)
        if len(record) > MAX_RECORD_BYTES:
            raise IpcError(f"inbox record of {len(record)} bytes exceeds {MAX_RECORD_BYTES}")
        try:
            if fd is None:
                self._sock.send(record, _MSG_NOSIGNAL)
            else:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
                self._sock.sendmsg([record], rights, _MSG_NOSIGNAL)
        except BlockingIOError:
            return False
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChannelClosed(f"inbox: {exc}") from exc
        except OSError as exc:
            raise IpcError(f"inbox: {exc}") from exc
        return True

    def close(self) -> None:
        self.handed_over()
        self._sock.close()


class InboxReader:
    """A worker's side: the inherited end of its `Inbox`. It owns `fd` from here on (a refusal closes it too)."""

    def __init__(self, fd: int) -> None:
        self._records = RecordReceiver(adopt(fd), "inbox")

    @property
    def rejected(self) -> int:
        """Malformed records dropped."""
        return self._records.rejected

    def recv(self, timeout_ms: int) -> tuple[Message, int | None] | None:
        """The next valid (message, descriptor or None) within timeout_ms (-1: wait forever), else
        None; the caller owns a returned descriptor. ChannelClosed once the client is gone."""
        records = self._records
        while records.wait(timeout_ms):
            got = records.receive(_ANCILLARY_BYTES)
            if got is None:
                continue
            n, ancillary, flags = got
            fds = _descriptors(ancillary)
            if n == 0 and not fds:
                raise ChannelClosed("inbox: the client closed it")
            try:
                message = self._parse(n, flags, len(fds))
            except WireError as exc:
                for fd in fds:
                    socket.close(fd)
                records.drop(exc)
                continue
            return message, fds[0] if fds else None
        return None

    def _parse(self, n: int, flags: int, descriptors: int) -> Message:
        check_whole(n, flags)
        if flags & _MSG_CTRUNC or descriptors > 1:
            raise WireError("record carries more than one descriptor")
        message, _ = decode([self._records.view[:n]])  # one frame: decode refuses announced payload frames
        if descriptors and not isinstance(message, Job):
            raise WireError(f"a descriptor came with a {type(message).__name__}, not a Job")
        if descriptors and message.inputs_in_sender:
            raise WireError("a descriptor came with a Job whose inputs are in the sender's memory")
        return message

    def close(self) -> None:
        self._records.close()


def _descriptors(ancillary: list) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % _FD_BYTES])
    return list(fds)
