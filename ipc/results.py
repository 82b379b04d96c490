"""Worker results to their client over one AF_UNIX SOCK_SEQPACKET pair, past libzmq's I/O threads.

Jobs go to workers through their inboxes (ipc.inbox); what a worker sends back (its Hello, and
one small header when a job ends: Done or Failed) comes back here. Why not ZeroMQ for this
direction: a ZeroMQ message crosses two extra threads (the sender's libzmq I/O thread, then the
receiver's) before the receiving thread wakes, and on a machine whose cores are all busy with
workers each of those hand-offs waits for the scheduler. In the pool's shape with bare sockets and
no pool logic (bench/zmq_floor.py), this pair cut both the reply overhead after the work, its tail
most, and the client's CPU per request (bench/HISTORY.md has the runs).

One pair per client. The client keeps both ends: it reads from one (`ResultsChannel`) and every
worker it starts inherits the other (`ResultSender`). A SOCK_SEQPACKET send is one record,
queued whole or not at all (also when the sender dies during the call), so any number of senders
can share the sending end without interleaving. A record is

    [identity length: 1 byte] [identity] [wire header (ipc.wire.encode)]

and the identity says which worker (and which start of it) sent it; the client drops records
from identities it no longer knows. Payload frames are not supported: results are descriptors.
"""

import socket

from ipc.errors import ChannelClosed, IpcError, WireError
from ipc.records import MAX_RECORD_BYTES, RecordReceiver, adopt, check_whole
from ipc.wire import Message, decode, encode

_MAX_IDENTITY = 255


class ResultsChannel:
    """The client's side: owns the pair; `sender_fd` is what children inherit, `recv` never blocks."""

    def __init__(self) -> None:
        receiving, self._send_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._records = RecordReceiver(receiving, "results channel")

    @property
    def sender_fd(self) -> int:
        """The sending end, for `subprocess.Popen(pass_fds=...)`; stays open here for later children."""
        return self._send_sock.fileno()

    def fileno(self) -> int:
        """Readable (level-triggered) while records are waiting."""
        return self._records.sock.fileno()

    @property
    def rejected(self) -> int:
        """Malformed records dropped."""
        return self._records.rejected

    def recv(self) -> tuple[bytes, Message] | None:
        """The next valid (identity, message) if one is waiting, else None."""
        # Asking poll(2) first: an empty non-blocking receive would raise, and exceptions cost more
        # than the syscall on a loop that checks after every wake-up.
        records = self._records
        while records.wait(0):
            got = records.receive()
            if got is None:
                return None
            n, _, flags = got
            try:
                return self._parse(n, flags)
            except WireError as exc:
                records.drop(exc)
        return None

    def _parse(self, n: int, flags: int) -> tuple[bytes, Message]:
        view = self._records.view
        check_whole(n, flags)
        if n == 0 or 1 + view[0] > n or view[0] == 0:
            raise WireError(f"record of {n} bytes has no complete identity")
        end = 1 + view[0]
        # One frame: decode refuses a message that announces payload frames.
        message, _ = decode([view[end:n]])
        return bytes(view[1:end]), message

    def close(self) -> None:
        self._records.close()
        self._send_sock.close()


class ResultSender:
    """A worker's side: the inherited sending end of its client's `ResultsChannel`.

    It owns `fd` from here on: `close()` closes it, and so does a refusal.
    """

    def __init__(self, fd: int, identity: bytes) -> None:
        self._sock = adopt(fd)
        if not 0 < len(identity) <= _MAX_IDENTITY:
            self._sock.close()
            raise IpcError(f"identity of {len(identity)} bytes (1..{_MAX_IDENTITY})")
        self._sock.setblocking(True)  # a full queue waits for the client to read, it never drops
        self.identity = identity

    def send(self, message: Message) -> None:
        """Queue one record; blocks while the client's queue is full. ChannelClosed if it is gone,
        IpcError if the record is larger than the client accepts (nothing is sent then)."""
        record = bytes((len(self.identity),)) + self.identity + encode(message)
        if len(record) > MAX_RECORD_BYTES:
            raise IpcError(f"result record of {len(record)} bytes exceeds {MAX_RECORD_BYTES}")
        try:
            self._sock.send(record)  # one record, whole or not at all (an error)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChannelClosed(f"results channel: {exc}") from exc
        except OSError as exc:
            raise IpcError(f"results channel: {exc}") from exc

    def close(self) -> None:
        self._sock.close()
