"""ZeroMQ channels for a client and its workers: endpoints in a private directory, a load-balancing ROUTER, DEALERs.

Topology (one client, N workers; W_k connect, the client binds):

    client: Router (ROUTER, bound) <------ DEALER (identity w<k>) : worker k
              | idle: workers that announced readiness and hold no job
              '- dispatch(job) -> the longest-idle worker, or None when all are busy

A worker gets a job only when it is idle (it announced readiness, or answered its last job), never
queued blindly behind another worker's slow job. Control messages (Release, Cancel, Stop) go to a
specific worker and are not dispatches. Every received header is decoded by `ipc.wire.decode`; a
malformed or hostile message is logged and dropped, never raised into the receive loop.
(mmworker's pool talks to its I/O process this way; its CPU workers get their jobs through
ipc.inbox instead, which costs the client a fraction of the CPU per job: see there.)

Endpoints are ipc:// sockets inside a fresh 0700 directory (nobody else can connect); tcp:// is
accepted for remote peers only with CURVE keys (encrypted, and only peers that know the server's
public key can connect; without keys a tcp:// endpoint is refused). All sockets close with linger
0, so `close()` never hangs on unsent data.
libzmq runs its own I/O and reaper threads in every process that uses it; they move bytes only.
"""

import logging
import os
import shutil
import stat
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class CurveKeys:
    """A CURVE key pair (Z85 bytes); a connecting side also names the server's public key."""

    public: bytes
    secret: bytes
    server_public: bytes | None = None

    @classmethod
    def generate(cls, server_public: bytes | None = None) -> "CurveKeys":
        public, secret = zmq.curve_keypair()
        return cls(public, secret, server_public)


def _secure(sock: zmq.Socket, endpoint: str, keys: CurveKeys | None, *, server: bool) -> None:
    if keys is None:
        if endpoint.startswith("tcp://"):
            raise IpcError(f"{endpoint}: tcp:// endpoints need CURVE keys (ipc:// ones are private by directory mode)")
        return
    if not zmq.has("curve"):
        raise IpcError("this libzmq has no CURVE support")
    sock.curve_publickey, sock.curve_secretkey = keys.public, keys.secret
    if server:
        sock.curve_server = True
    else:
        if keys.server_public is None:
            raise IpcError(f"{endpoint}: a CURVE client needs the server's public key")
        sock.curve_serverkey = keys.server_public


class Router:
    """The client side: one bound ROUTER, the idle set, and checked receives."""

    def __init__(self, context: zmq.Context, endpoint: str, curve: CurveKeys | None = None) -> None:
        self.sock = _configure(context.socket(zmq.ROUTER))
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished peer raises, never drops
        _secure(self.sock, endpoint, curve, server=True)
        self.sock.bind(endpoint)
        self.endpoint = endpoint
        self._idle: OrderedDict[bytes, None] = OrderedDict()
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

    def send(self, peer: bytes, message: Message, payload: tuple = ()) -> None:
        sock = self.sock
        self.settled = False
        try:
            _send(sock, peer, _SNDMORE)
            if not payload:
                _send(sock, encode(message), 0)
                return
            _send(sock, encode(message), _SNDMORE)
            last = len(payload) - 1
            for i, frame in enumerate(payload):
                _send(sock, frame, 0 if i == last else _SNDMORE, False)  # copied below copy_threshold
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise ChannelClosed(f"peer {peer!r} is not connected") from exc
            raise

    def mark_idle(self, peer: bytes) -> None:
        self._idle[peer] = None

    def forget(self, peer: bytes) -> None:
        self._idle.pop(peer, None)

    @property
    def idle(self) -> int:
        return len(self._idle)

    def dispatch(self, message: Message | Callable[[bytes], Message], payload: tuple = ()) -> bytes | None:
        """Send to the longest-idle worker and mark it busy; None if no worker is idle.

        `message` may be a function of the chosen peer, for a message that carries something of
        that peer's (e.g. its piggybacked releases).
        """
        while self._idle:
            peer, _ = self._idle.popitem(last=False)
            try:
                self.send(peer, message(peer) if callable(message) else message, payload)
            except ChannelClosed:
                continue  # it died after announcing readiness; the pool notices through its process
            return peer
        return None

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
    """A worker's side: one DEALER with a fixed identity, connected to the client's Router."""

    def __init__(self, context: zmq.Context, endpoint: str, identity: bytes, curve: CurveKeys | None = None) -> None:
        self.sock = _configure(context.socket(zmq.DEALER))
        self.sock.setsockopt(zmq.IDENTITY, identity)
        _secure(self.sock, endpoint, curve, server=False)
        self.sock.connect(endpoint)
        self.rejected = 0

    def send(self, message: Message, payload: tuple = ()) -> None:
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
