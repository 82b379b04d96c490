"""Worker results to their client over one AF_UNIX SOCK_SEQPACKET pair, past libzmq's I/O threads.

Jobs go to workers through their inboxes (ipc.inbox); what a worker sends back (its Hello, and
one small header when a job ends: Done or Failed) comes back here. Why not ZeroMQ for this
direction: a ZeroMQ message crosses two extra threads (the sender's libzmq I/O thread, then the
receiver's) before the receiving thread wakes, and on a machine whose cores are all busy with
workers each of those hand-offs waits for the scheduler. Measured on the 2-core dev VM, the pool's shape with bare
sockets and no pool logic (bench/zmq_floor.py, medians of 5 runs): reply overhead p50 / p99 after
the work 0.58 / 3.9 ms through ZeroMQ, 0.35 / 0.76 ms through this pair, and client CPU per
request 0.56 -> 0.43 ms.

One pair per client. The client keeps both ends: it reads from one (`ResultsChannel`) and every
worker it starts inherits the other (`ResultSender`). A SOCK_SEQPACKET send is one record,
queued whole or not at all (also when the sender dies during the call), so any number of senders
can share the sending end without interleaving. A record is

    [identity length: 1 byte] [identity] [wire header (ipc.wire.encode)]

and the identity says which worker (and which start of it) sent it; the client drops records
from identities it no longer knows. Payload frames are not supported: results are descriptors.
"""

import logging
import select
import socket

from ipc.errors import ChannelClosed, IpcError, WireError
from ipc.wire import Message, decode, encode

log = logging.getLogger(__name__)

_MAX_IDENTITY = 255
# The largest record either side accepts. A Done for 64 images is ~7 KB; this also fits the
# default socket buffer (208 KB), so no socket option is needed anywhere.
MAX_RECORD_BYTES = 64 << 10
# As a plain int: `flags & socket.MSG_TRUNC` would build an enum member for every record.
_MSG_TRUNC = int(socket.MSG_TRUNC)


class ResultsChannel:
    """The client's side: owns the pair; `sender_fd` is what children inherit, `recv` never blocks."""

    def __init__(self) -> None:
        self._recv_sock, self._send_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._recv_sock.setblocking(False)
        self._buffer = bytearray(MAX_RECORD_BYTES + 1)  # one byte more, so a longer record shows as cut
        self._view = memoryview(self._buffer)
        self._waiting = select.poll()
        self._waiting.register(self._recv_sock.fileno(), select.POLLIN)
        self.rejected = 0  # malformed records dropped

    @property
    def sender_fd(self) -> int:
        """The sending end, for `subprocess.Popen(pass_fds=...)`; stays open here for later children."""
        return self._send_sock.fileno()

    def fileno(self) -> int:
        """Readable (level-triggered) while records are waiting."""
        return self._recv_sock.fileno()

    def recv(self) -> tuple[bytes, Message] | None:
        """The next valid (identity, message) if one is waiting, else None."""
        # Asking poll(2) first: an empty non-blocking receive would raise, and exceptions cost more
        # than the syscall on a loop that checks after every wake-up.
        while self._waiting.poll(0):
            try:
                n, _, flags, _ = self._recv_sock.recvmsg_into([self._buffer])
            except BlockingIOError:
                return None
            except OSError as exc:
                raise ChannelClosed(f"results channel: {exc}") from exc
            try:
                return self._parse(n, flags)
            except WireError as exc:
                self.rejected += 1
                log.error("dropped a malformed result record: %s", exc)
        return None

    def _parse(self, n: int, flags: int) -> tuple[bytes, Message]:
        if flags & _MSG_TRUNC or n > MAX_RECORD_BYTES:
            raise WireError(f"record longer than {MAX_RECORD_BYTES} bytes")
        if n == 0 or 1 + self._buffer[0] > n or self._buffer[0] == 0:
            raise WireError(f"record of {n} bytes has no complete identity")
        end = 1 + self._buffer[0]
        # One frame: decode refuses a message that announces payload frames.
        message, _ = decode([self._view[end:n]])
        return bytes(self._view[1:end]), message

    def close(self) -> None:
        self._view.release()
        self._recv_sock.close()
        self._send_sock.close()


class ResultSender:
    """A worker's side: the inherited sending end of its client's `ResultsChannel`.

    It owns `fd` from here on: `close()` closes it, and so does a refusal.
    """

    def __init__(self, fd: int, identity: bytes) -> None:
        self._sock = socket.socket(fileno=fd)
        problem = None
        if self._sock.type != socket.SOCK_SEQPACKET:
            problem = f"fd {fd} is not a SOCK_SEQPACKET socket"
        elif not 0 < len(identity) <= _MAX_IDENTITY:
            problem = f"identity of {len(identity)} bytes (1..{_MAX_IDENTITY})"
        if problem is not None:
            self._sock.close()
            raise IpcError(problem)
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
