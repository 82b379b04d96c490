"""ipc.wire and ipc.channels: schema round trips, hostile frames, load balancing over real sockets."""

import os
import random
import select
import stat
import subprocess
import sys
import threading
import time

import msgspec
import pytest
import zmq

from ipc.channels import Dealer, Router, RuntimeDir, new_context
from ipc.errors import ChannelClosed, IpcError, WireError
from ipc.wire import (
    MAX_HEADER_BYTES,
    WIRE_VERSION,
    Done,
    Failed,
    Hello,
    Job,
    Release,
    TensorDesc,
    decode,
    encode,
)

SAMPLES = [
    Hello(WIRE_VERSION, 3, 1234, 3, "mmw-1-2-ring-ab", 1 << 20),
    Job(7, 2, 5000, {"ids": [1, 2, 3], "name": "x", "flag": True, "none": None}),
    Done(7, {"feature": TensorDesc(0, 128, 5, 4096, "<f4", (32, 32))}, {"hash": 123}, 1.5),
    Failed(7, "image 0: image decode: truncated", 0.3),
    Release(0, [(0, 1), (4096, 2)]),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(message):
    payload = [b"a", b"b"] if isinstance(message, Job) else []
    decoded, frames = decode([encode(message), *payload])
    assert decoded == message and frames == payload


def test_job_inputs_in_the_request_ring_replace_payload_frames():
    job = Job(3, 0, 5000, {"kinds": "b"}, [(64, 2)], [(0, 8), (64, 135000)])
    assert decode([encode(job)]) == (job, [])
    in_sender = Job(3, 0, 5000, {"kinds": "b"}, [], [(140000000000000, 8)], inputs_in_sender=True)
    assert decode([encode(in_sender)]) == (in_sender, [])
    with pytest.raises(WireError, match=r"Job has 2 input place\(s\) and 1 payload frame\(s\)"):
        decode([encode(Job(3, 1, 0, inputs=[(0, 8), (64, 1)])), b"x"])


def test_payload_frame_count_is_checked():
    with pytest.raises(WireError, match=r"Job announces 2 payload frame\(s\), got 1"):
        decode([encode(Job(1, 2, 0)), b"only one"])
    with pytest.raises(WireError, match=r"Done announces 0 payload frame\(s\), got 1"):
        decode([encode(SAMPLES[2]), b"extra"])  # Done announces none


def test_version_and_size_are_checked():
    wrong = msgspec.msgpack.encode([WIRE_VERSION + 1, {"type": "release", "ring": 0, "allocations": []}])
    with pytest.raises(WireError, match="wire version"):
        decode([wrong])
    with pytest.raises(WireError, match="exceeds"):
        decode([b"\x00" * (MAX_HEADER_BYTES + 1)])
    with pytest.raises(WireError, match="empty message"):
        decode([])


def test_no_arbitrary_objects():
    # A pickle, an extension type, a wrong field type: all refused before anything is built.
    import pickle

    for raw in (
        pickle.dumps(Release(0, [(0, 1)])),
        msgspec.msgpack.encode([1, {"type": "job", "rid": "1", "frames": 0, "deadline_ms": 0}]),
        msgspec.msgpack.encode([1, {"type": "evil"}]),
        msgspec.msgpack.encode(msgspec.msgpack.Ext(1, b"x")),
    ):
        with pytest.raises(WireError):
            decode([raw])


@pytest.mark.parametrize("tag", ["stop", "cancel"])
def test_messages_the_schema_dropped_are_refused(tag):
    # Stop and Cancel were messages once; a peer that still sends them is refused, never obeyed.
    with pytest.raises(WireError, match="malformed header"):
        decode([msgspec.msgpack.encode([WIRE_VERSION, {"type": tag, "rid": 1}])])


def test_fuzz_100k_frames_never_crash():
    rng = random.Random(1234)
    seeds = [encode(m) for m in SAMPLES]
    accepted = 0
    for i in range(100_000):
        if i % 3 == 0:
            raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        else:
            raw = bytearray(rng.choice(seeds))
            for _ in range(rng.randint(1, 6)):
                op = rng.random()
                pos = rng.randrange(len(raw)) if raw else 0
                if op < 0.5 and raw:
                    raw[pos] = rng.getrandbits(8)
                elif op < 0.75:
                    raw.insert(pos, rng.getrandbits(8))
                elif raw:
                    del raw[pos]
            raw = bytes(raw)
        try:
            message, _ = decode([raw])
        except WireError:
            continue
        accepted += 1
        if isinstance(message, Done):  # whatever decodes is typed: descriptors are plain ints/strs
            for desc in message.tensors.values():
                assert isinstance(desc.offset, int) and isinstance(desc.dtype, str)
    assert accepted > 0  # mutation keeps some valid messages, so the check above ran


@pytest.fixture
def channel():
    rundir = RuntimeDir()
    ctx = new_context()
    router = Router(ctx, rundir.endpoint("work"))
    dealers = []
    yield rundir, ctx, router, dealers
    for d in dealers:
        d.close()
    router.close()
    ctx.term()
    rundir.close()
    assert not os.path.exists(rundir.path)


def recv_until(router, predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        router.poll(50)
        got = router.recv()
        if got is not None and predicate(got):
            return got
    raise AssertionError("nothing received")


def test_runtime_dir_is_private(channel):
    rundir, *_ = channel
    assert stat.S_IMODE(os.stat(rundir.path).st_mode) == 0o700


# A process that makes a runtime directory with a bound socket in it, prints its path, and keeps it
# until its stdin closes (a client that is alive) or is killed first (one that never closes).
_RUNTIME_DIR_OWNER = """
import socket, sys
from ipc.channels import RuntimeDir
rundir = RuntimeDir()
sock = socket.socket(socket.AF_UNIX)
sock.bind(rundir.path + "/work")
print(rundir.path, flush=True)
sys.stdin.read()
"""


def test_sweep_removes_only_socket_dirs_of_dead_creators(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}

    def owner() -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen([sys.executable, "-c", _RUNTIME_DIR_OWNER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        return proc, proc.stdout.readline().strip()

    alive, alive_dir = owner()
    killed, orphan_dir = owner()
    killed.kill()
    killed.wait()
    decoy = tmp_path / f"mmworker-{killed.pid}-1-decoy"  # the naming scheme, but a file inside
    decoy.mkdir()
    (decoy / "notes.txt").write_text("not a socket")
    other = tmp_path / "mmworker-somebody-else"
    other.mkdir()
    try:
        assert os.path.dirname(orphan_dir) == str(tmp_path) and os.path.exists(orphan_dir)
        assert RuntimeDir.sweep_stale(parent=str(tmp_path)) == [orphan_dir]
        assert not os.path.exists(orphan_dir)
        assert os.path.exists(alive_dir + "/work") and decoy.exists() and other.exists()
    finally:
        alive.stdin.close()
        alive.wait()


def test_messages_reach_the_named_peer_and_payload_frames_come_back(channel):
    _, ctx, router, dealers = channel
    for k in range(2):
        dealers.append(Dealer(ctx, router.endpoint, f"w{k}".encode()))
        dealers[-1].send(Hello(WIRE_VERSION, k, os.getpid(), k, "r", 1))
    peers = {recv_until(router, lambda g: isinstance(g[1], Hello))[0] for _ in range(2)}
    assert peers == {b"w0", b"w1"}
    router.send(b"w1", Job(1, 0, 0, {"sources": ["a"]}))
    assert dealers[1].recv(2000) == (Job(1, 0, 0, {"sources": ["a"]}), [])
    router.send(b"w0", Job(2, 0, 0))
    assert dealers[0].recv(2000) == (Job(2, 0, 0), [])  # its own first: job 1 went to w1 only
    big = os.urandom(3 << 20)  # above ZERO_COPY_THRESHOLD: sent zero-copy
    dealers[1].send(Done(1, {}, frames=2), (b"small", big))
    peer, msg, payload = recv_until(router, lambda g: isinstance(g[1], Done))
    assert (peer, msg) == (b"w1", Done(1, {}, frames=2))
    assert [bytes(frame) for frame in payload] == [b"small", big]


def test_sending_to_a_peer_that_is_not_connected_is_channel_closed(channel):
    _, ctx, router, dealers = channel
    with pytest.raises(ChannelClosed, match=r"peer b'nobody' is not connected"):
        router.send(b"nobody", Release(0, []))
    dealers.append(Dealer(ctx, router.endpoint, b"w0"))
    dealers[0].send(Hello(WIRE_VERSION, 0, os.getpid(), 0, "r", 1))
    recv_until(router, lambda g: isinstance(g[1], Hello))
    router.send(b"w0", Release(0, []))  # connected: delivered
    assert dealers[0].recv(2000) == (Release(0, []), [])
    dealers.pop().close()
    deadline = time.monotonic() + 5  # the router learns of the disconnect asynchronously
    while True:
        try:
            router.send(b"w0", Release(0, []))
        except ChannelClosed:
            break
        assert time.monotonic() < deadline, "a closed peer still accepted messages after 5 s"
        router.poll(20)


def test_poll_says_where_the_messages_are(channel):
    _, ctx, router, dealers = channel
    reading, writing = os.pipe()
    try:
        router.watch(reading)
        assert router.poll(10) == 0  # nothing: the wait timed out
        os.write(writing, b"x")
        assert router.poll(1000) == 2  # the watched fd only
        dealers.append(Dealer(ctx, router.endpoint, b"w9"))
        dealers[-1].send(Release(0, []))
        deadline = time.monotonic() + 5
        while router.poll(100) != 3 and time.monotonic() < deadline:
            pass
        assert router.poll(0) == 3  # both: the router's socket is bit 0
        assert isinstance(router.recv()[1], Release)
        os.read(reading, 1)
        assert router.poll(0) == 0
    finally:
        os.close(reading)
        os.close(writing)


def test_settled_router_fd_turns_readable_for_what_arrives_next(channel):
    """The contract WorkerPool's waits rely on: once recv found nothing (settled), the router's fd
    becomes readable when a message arrives (and may with nothing to receive); a send or a poll
    unsettles it until recv finds nothing."""
    _, ctx, router, dealers = channel
    wake = select.epoll()
    wake.register(router.fileno(), select.EPOLLIN)

    def fd_readable_within(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if wake.poll(0.05):
                return True
        return False

    def recv_waking_on_fd(k: int) -> tuple:
        """recv, and while it finds nothing, wait on the fd again, as WorkerPool does: the fd may
        also turn readable for ZeroMQ's own commands (a new peer's pipe attached before its first
        message is readable), so a wake-up promises a look, not a message."""
        while (got := router.recv()) is None:
            assert router.settled
            assert fd_readable_within(5.0), f"message {k}: no wake-up on a settled router"
        return got

    try:
        assert not router.settled  # nothing known about what came before
        assert router.recv() is None and router.settled
        dealers.append(Dealer(ctx, router.endpoint, b"w0"))
        for k in range(3):
            dealers[0].send(Hello(WIRE_VERSION, k, os.getpid(), 0, "r", 1))
            assert fd_readable_within(5.0), f"message {k}: no wake-up on a settled router"
            if k == 1:  # a send may consume the notification: unsettled until recv finds nothing
                router.send(b"w0", Release(0, []))
                assert not router.settled
                assert dealers[0].recv(2000) == (Release(0, []), [])
            elif k == 2:
                assert router.poll(0) == 1 and not router.settled
            peer, message, _ = recv_waking_on_fd(k)
            assert peer == b"w0" and message.worker == k and not router.settled
            assert router.recv() is None and router.settled
            assert not wake.poll(0)  # drained: nothing to wake up for
    finally:
        wake.close()


def test_malformed_messages_are_dropped_not_raised(channel):
    _, ctx, router, _dealers = channel
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(router.endpoint)
    try:
        raw.send_multipart([b"\xc1garbage"])
        raw.send_multipart([encode(Job(1, 3, 0))])  # announces 3 frames, sends none
        raw.send_multipart([encode(Release(0, [(64, 1)]))])
        _peer, msg, _ = recv_until(router, lambda g: True)
        assert msg == Release(0, [(64, 1)]) and router.rejected == 2
    finally:
        raw.close()


def test_close_does_not_hang_with_unsent_data(channel):
    _, ctx, _router, _dealers = channel
    d = Dealer(ctx, "ipc:///nonexistent/dir/sock", b"lost")  # never connects
    for _ in range(100):
        d.send(Release(0, []))
    t0 = time.monotonic()
    d.close()
    assert time.monotonic() - t0 < 1.0
    assert threading.active_count() >= 1


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:0", "inproc://work", "/tmp/work"])
def test_only_private_ipc_endpoints_are_accepted(endpoint):
    ctx = new_context()
    try:
        with pytest.raises(IpcError, match=r"only ipc:// endpoints are supported"):
            Router(ctx, endpoint)
        with pytest.raises(IpcError, match=r"only ipc:// endpoints are supported"):
            Dealer(ctx, endpoint, b"w0")
    finally:
        ctx.term()  # returns at once: a refused endpoint left no socket open
