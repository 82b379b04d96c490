"""ZeroMQ channels between a client and its peers: endpoints in a private directory, the client's ROUTER, DEALERs.

Topology (one client, N peers; the peers connect, the client binds):

    client: Router (ROUTER, bound) <------ Dealer (DEALER, identity) : peer

The client sends to a peer by its identity; a peer that is not connected is an error
(ChannelClosed), never a silent drop. Messages from the client carry a header only; a Dealer's
may carry payload frames after it (ipc.wire). Every received header is decoded by
`ipc.wire.decode`; a malformed or hostile message is logged and dropped, never raised into the
receive loop. (mmworker's pool talks to its I/O process this way, whose replies carry the fetched
bytes as payload frames. Its CPU workers get jobs through ipc.inbox and answer through
ipc.results instead: a ZeroMQ context starts an I/O thread in every process that has one, and
each message crosses it; plain socket pairs leave a worker one thread and cost the client less
CPU per job. docs/architecture.md has the reasoning.)

Endpoints are ipc:// sockets inside a fresh 0700 directory, so nobody else can connect; nothing
connects from another host, so no other transport is accepted. All sockets close with linger 0,
so `close()` never hangs on unsent data. libzmq runs its own I/O and reaper threads in every
process that uses it; they move bytes only.
"""

import logging
import os
import shutil
import stat
import tempfile

import zmq
from zmq.backend import Socket as _CompiledSocket
from zmq.backend import zmq_poll as _zmq_poll

from ipc.errors import ChannelClosed, IpcError, WireError
from ipc.segment import creator_is_gone, creator_stamp
from ipc.wire import Message, decode, encode

log = logging.getLogger(__name__)

RUNTIME_DIR_PREFIX = "mmworker"


class RuntimeDir:
    """A private (0700) directory holding a client's ipc:// socket files; removed on close.

    Its name, `<prefix>-<pid>-<start time>-<random>` in the temporary directory, says which process
    created it, so that `sweep_stale` can remove the directories of clients that were killed before
    they could close (SIGKILL), and never one whose creator is alive.
    """

    def __init__(self, prefix: str = RUNTIME_DIR_PREFIX) -> None:
        self.path = tempfile.mkdtemp(prefix=f"{prefix}-{creator_stamp()}-")  # mkdtemp creates it 0700
        os.chmod(self.path, 0o700)

    def endpoint(self, name: str) -> str:
        return f"ipc://{os.path.join(self.path, name)}"

    def close(self) -> None:
        if os.path.isdir(self.path):
            shutil.rmtree(self.path)

    @staticmethod
    def sweep_stale(prefix: str = RUNTIME_DIR_PREFIX, parent: str | None = None) -> list[str]:
        """Remove this user's runtime directories (in `parent`, default the temporary directory) whose
        creating process is gone and that hold nothing but sockets; returns the paths removed."""
        parent = tempfile.gettempdir() if parent is None else parent
        removed = []
        for entry in os.listdir(parent):
            path = os.path.join(parent, entry)
            if not creator_is_gone(entry, prefix):
                continue
            try:
                info = os.lstat(path)
                if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                    continue
                inside = [os.path.join(path, name) for name in os.listdir(path)]
                if not all(stat.S_ISSOCK(os.lstat(item).st_mode) for item in inside):
                    continue  # not what a RuntimeDir holds: leave it alone
                for item in inside:
                    os.unlink(item)
                os.rmdir(path)
            except FileNotFoundError:  # another sweep got there first
                continue
            removed.append(path)
        return removed


def new_context() -> zmq.Context:
    """A ZeroMQ context with one I/O thread (ipc/tcp need one; more buys nothing here)."""
    return zmq.Context(io_threads=1)


# The client's loop calls these for every message, right after waking up, when nothing is in the
# CPU's caches: pyzmq's Python-level send wrapper (DRAFT routing ids and groups, which nothing here
# uses) and its IntFlag arithmetic cost more there than the calls themselves, so the channels call
# the compiled socket methods with plain int flags.
_send = _CompiledSocket.send
_recv = _CompiledSocket.recv
_get = _CompiledSocket.get
_SNDMORE = int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)

# Payload frames smaller than this are copied into the message; larger ones are sent zero-copy.
# pyzmq's zero-copy path hands each buffer to a garbage-collector thread that releases it once
# libzmq is done, which costs more CPU (and GIL hand-offs) than copying a few hundred KB.
ZERO_COPY_THRESHOLD = 1 << 20


def _configure(sock: zmq.Socket) -> zmq.Socket:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # bounded by the pool's own queue limits, not by silent drops
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.copy_threshold = ZERO_COPY_THRESHOLD
    return sock


def _private(endpoint: str) -> str:
    """`endpoint` if it is an ipc:// one (private by its directory's mode); IpcError for anything else."""
    if not endpoint.startswith("ipc://"):
        raise IpcError(f"{endpoint}: only ipc:// endpoints are supported (a RuntimeDir's, private by its mode)")
    return endpoint


class Router:
    """The client side: one bound ROUTER, sends to a peer by identity, and checked receives."""

    def __init__(self, context: zmq.Context, endpoint: str) -> None:
        self.endpoint = _private(endpoint)  # checked before a socket exists: a refusal leaves none open
        self.sock = _configure(context.socket(zmq.ROUTER))
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished peer raises, never drops
        self.sock.bind(endpoint)
        self.rejected = 0  # malformed messages dropped
        self._poll_items = [(self.sock, _POLLIN)]  # built once: a wait happens per loop turn
        # True once `recv` found nothing and nothing touched the socket since: only then does its
        # fd become readable for whatever arrives next (ZeroMQ's notification is edge-like: a
        # receive, a send or a poll may consume it while messages wait), so a caller that waits
        # on the fd alone must call recv until None first whenever this is False.
        self.settled = False

    def fileno(self) -> int:
        """The socket's edge-triggered notification fd: readable means "call recv until None"."""
        return self.sock.getsockopt(zmq.FD)

    def send(self, peer: bytes, message: Message) -> None:
        """Send `message` (a header, no payload frames) to `peer`; ChannelClosed if it is not connected."""
        sock = self.sock
        self.settled = False
        try:
            _send(sock, peer, _SNDMORE)
            _send(sock, encode(message), 0)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise ChannelClosed(f"peer {peer!r} is not connected") from exc
            raise

    def watch(self, fd: int) -> None:
        """Make `poll` return also when `fd` (another channel, e.g. ipc.results) becomes readable."""
        self._poll_items.append((fd, _POLLIN))

    def poll(self, timeout_ms: int) -> int:
        """Wait up to timeout_ms for a message here or on a watched fd. Returns which are ready as a
        bit mask: bit 0 this socket (then call recv), bit k the k-th watched fd; 0 if none."""
        ready = 0
        self.settled = False
        for item, _ in _zmq_poll(self._poll_items, timeout_ms):
            ready |= 1 << self._poll_items.index((item, _POLLIN))
        return ready

    def recv(self) -> tuple[bytes, Message, list] | None:
        """The next valid (peer, message, payload) if one is waiting, else None (never blocks)."""
        sock = self.sock
        self.settled = False
        while True:
            # Asking EVENTS first avoids pyzmq's EAGAIN exception (tens of microseconds each) on
            # every empty check; ZeroMQ delivers multipart messages whole, so POLLIN means all parts.
            if not _get(sock, _EVENTS) & _POLLIN:
                self.settled = True
                return None
            # The identity and the header are small (bytes are cheaper than Frame objects); payload
            # frames stay zero-copy Frames.
            peer = _recv(sock)
            frames = [_recv(sock, 0, False)]
            while frames[-1].more:
                frames.append(_recv(sock, 0, False))
            try:
                message, payload = decode(frames)
            except WireError as exc:
                self.rejected += 1
                log.error("dropped a malformed message from %r: %s", peer, exc)
                continue
            return peer, message, payload

    def close(self) -> None:
        self.sock.close(linger=0)


class Dealer:
    """A peer's side: one DEALER with a fixed identity, connected to the client's Router."""

    def __init__(self, context: zmq.Context, endpoint: str, identity: bytes) -> None:
        _private(endpoint)  # checked before a socket exists: a refusal leaves none open
        self.sock = _configure(context.socket(zmq.DEALER))
        self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.connect(endpoint)
        self.rejected = 0

    def send(self, message: Message, payload: tuple = ()) -> None:
        """Send `message` and its payload frames (copied below ZERO_COPY_THRESHOLD, else zero-copy)."""
        self.sock.send_multipart([encode(message), *payload], copy=False)

    def recv(self, timeout_ms: int) -> tuple[Message, list] | None:
        """The next valid message within timeout_ms (-1: wait forever), else None."""
        while True:
            if not self.sock.poll(timeout_ms, zmq.POLLIN):
                return None
            frames = self.sock.recv_multipart(copy=False)
            try:
                return decode(frames)
            except WireError as exc:
                self.rejected += 1
                log.error("dropped a malformed message: %s", exc)

    def close(self) -> None:
        self.sock.close(linger=0)
