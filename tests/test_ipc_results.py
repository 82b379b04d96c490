"""The results channel (ipc.results): records whole and in order per sender, across real processes,
malformed records dropped, a killed sender never leaves half a record."""

import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ipc.errors import ChannelClosed, IpcError
from ipc.records import MAX_RECORD_BYTES
from ipc.results import ResultsChannel, ResultSender
from ipc.wire import Done, Failed, TensorDesc, encode

PEER = str(Path(__file__).with_name("ipc_peer.py"))


@pytest.fixture
def channel():
    ch = ResultsChannel()
    yield ch
    ch.close()


def drain(channel, want, timeout=30.0):
    """Up to `want` records, waiting on the channel's fd (readable while records wait) until `timeout`."""
    got, deadline = [], time.monotonic() + timeout
    ready = select.poll()
    ready.register(channel.fileno(), select.POLLIN)
    while len(got) < want:
        item = channel.recv()
        if item is not None:
            got.append(item)
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready.poll(remaining * 1000)
    return got


def test_round_trip_and_empty_is_none(channel):
    assert channel.recv() is None
    sender = ResultSender(os.dup(channel.sender_fd), b"w0.1")
    desc = TensorDesc(0, 4096, 7, 24, "<f4", (2, 3))
    sender.send(Done(5, {"feature.0": desc}, {"offsets": [[1, 4]], "delta": -3}, busy_ms=1.5))
    sender.send(Failed(6, "image 0: image decode: truncated"))
    assert channel.recv() == (b"w0.1", Done(5, {"feature.0": desc}, {"offsets": [[1, 4]], "delta": -3}, busy_ms=1.5))
    assert channel.recv() == (b"w0.1", Failed(6, "image 0: image decode: truncated"))
    assert channel.recv() is None
    sender.close()


def test_processes_sharing_the_sending_end_deliver_every_record_whole_and_in_order(channel):
    count, fd = 3000, channel.sender_fd
    procs = [
        subprocess.Popen([sys.executable, PEER, "results", str(fd), f"w{k}.1", str(count), str(2000 * k)],
                         pass_fds=(fd,))
        for k in range(3)
    ]  # fmt: skip
    got = drain(channel, 3 * count, timeout=60)
    assert [p.wait(30) for p in procs] == [0, 0, 0]
    assert channel.recv() is None and channel.rejected == 0
    for k in range(3):
        mine = [m for ident, m in got if ident == f"w{k}.1".encode()]
        assert [m.rid for m in mine] == list(range(1, count + 1))
        assert all(m.meta["check"] == m.rid * 7 and len(m.meta["pad"]) == 2000 * k for m in mine)


def test_a_sender_killed_mid_stream_leaves_no_partial_record(channel):
    fd = channel.sender_fd
    # 60 KB records: the socket buffer holds a few, so the sender spends its life blocked in send.
    proc = subprocess.Popen([sys.executable, PEER, "results", str(fd), "w9.1", "1000000", "60000"], pass_fds=(fd,))
    got = drain(channel, 20)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # The sender is gone, so whatever it sent is queued already: everything left, without waiting.
    got += drain(channel, 10**6, timeout=0)
    assert len(got) >= 20 and channel.rejected == 0
    assert [m.rid for _, m in got] == list(range(1, len(got) + 1))
    assert all(len(m.meta["pad"]) == 60000 and m.meta["check"] == m.rid * 7 for _, m in got)


@pytest.mark.parametrize(
    "record, why",
    [
        (b"", "no complete identity"),
        (b"\x00" + encode(Failed(1, "x")), "no complete identity"),
        (b"\x09w0", "no complete identity"),
        (b"\x02w0" + b"\xc1garbage", "malformed header"),
        (b"\x02w0" + encode(Done(1, {}, {}, frames=1)), "payload frame"),
        (b"\x02w0" + b"\x00" * (MAX_RECORD_BYTES + 1), "longer than"),
    ],
)
def test_malformed_records_are_dropped_and_the_next_one_still_arrives(channel, caplog, record, why):
    raw = socket.socket(fileno=os.dup(channel.sender_fd))
    raw.send(record)
    raw.send(b"\x02w1" + encode(Failed(2, "fine")))
    raw.close()
    assert channel.recv() == (b"w1", Failed(2, "fine"))
    assert channel.rejected == 1 and why in caplog.text


def test_sender_refuses_what_is_not_a_results_socket(channel):
    stream_a, stream_b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(IpcError, match="not a SOCK_SEQPACKET socket"):
        ResultSender(os.dup(stream_a.fileno()), b"w0.1")
    for identity in (b"", b"x" * 256):
        with pytest.raises(IpcError, match="identity of"):
            ResultSender(os.dup(channel.sender_fd), identity)
    assert len(os.listdir("/proc/self/fd")) == before  # a refused fd is closed, not leaked
    stream_a.close()
    stream_b.close()


def test_a_record_too_large_is_refused_by_the_sender_and_nothing_is_sent(channel):
    sender = ResultSender(os.dup(channel.sender_fd), b"w0.1")
    with pytest.raises(IpcError, match="exceeds"):
        sender.send(Failed(1, "x" * MAX_RECORD_BYTES))
    sender.send(Failed(2, "x" * (MAX_RECORD_BYTES - 100)))  # the largest that fits still goes through
    assert channel.recv() == (b"w0.1", Failed(2, "x" * (MAX_RECORD_BYTES - 100)))
    assert channel.recv() is None
    sender.close()


def test_send_after_the_client_closed_says_so():
    channel = ResultsChannel()
    sender = ResultSender(os.dup(channel.sender_fd), b"w0.1")
    channel.close()
    with pytest.raises(ChannelClosed):
        sender.send(Failed(1, "late"))
    sender.close()
