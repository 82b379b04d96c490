"""Wire messages as AF_UNIX SOCK_SEQPACKET records: the size limit, adopting an inherited end, and a receiving end.

Shared by the pool's two socket-pair channels (ipc.results, ipc.inbox). A SOCK_SEQPACKET send is
one record, queued whole or not at all; a receive takes one record into one reused buffer, and a
record cut short (longer than the buffer) shows as such, so it is refused, never parsed.
"""

import logging
import select
import socket

from ipc.errors import ChannelClosed, IpcError, WireError

log = logging.getLogger(__name__)

# The largest record either side accepts. A Done for 64 images is ~7 KB; this also fits the
# default socket buffer (208 KB), so no socket option is needed anywhere.
MAX_RECORD_BYTES = 64 << 10
# As a plain int: `flags & socket.MSG_TRUNC` would build an enum member for every record.
_MSG_TRUNC = int(socket.MSG_TRUNC)


def adopt(fd: int) -> socket.socket:
    """A socket object that owns the inherited `fd`; IpcError (and `fd` closed) unless it is SOCK_SEQPACKET."""
    sock = socket.socket(fileno=fd)
    if sock.type != socket.SOCK_SEQPACKET:
        sock.close()
        raise IpcError(f"fd {fd} is not a SOCK_SEQPACKET socket")
    return sock


def check_whole(n: int, flags: int) -> None:
    """WireError for a received record that was cut short (longer than MAX_RECORD_BYTES)."""
    if flags & _MSG_TRUNC or n > MAX_RECORD_BYTES:
        raise WireError(f"record longer than {MAX_RECORD_BYTES} bytes")


class RecordReceiver:
    """A non-blocking receiving end (it owns `sock`): one record at a time into one reused buffer."""

    def __init__(self, sock: socket.socket, channel: str) -> None:
        """`channel` names it in errors and logs ("results channel", "inbox")."""
        sock.setblocking(False)
        self.sock, self.channel = sock, channel
        self._buffer = bytearray(MAX_RECORD_BYTES + 1)  # one byte more, so a longer record shows as cut
        self.view = memoryview(self._buffer)
        self._waiting = select.poll()
        self._waiting.register(sock.fileno(), select.POLLIN)
        self.rejected = 0  # malformed records dropped

    def wait(self, timeout_ms: int) -> bool:
        """Whether a record is waiting, after up to timeout_ms (-1: for ever)."""
        return bool(self._waiting.poll(timeout_ms))

    def receive(self, ancillary_bytes: int = 0) -> tuple[int, list, int] | None:
        """(length, ancillary data, flags) of the next record, now in `view`; None if none was
        there after all (check it with `check_whole`). ChannelClosed if the socket failed."""
        try:
            n, ancillary, flags, _ = self.sock.recvmsg_into([self._buffer], ancillary_bytes)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise ChannelClosed(f"{self.channel}: {exc}") from exc
        return n, ancillary, flags

    def drop(self, exc: WireError) -> None:
        """Count and log a malformed record (it never reaches the receive loop as an exception)."""
        self.rejected += 1
        log.error("%s: dropped a malformed record: %s", self.channel, exc)

    def close(self) -> None:
        self.view.release()
        self.sock.close()
