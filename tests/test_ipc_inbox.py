"""ipc.inbox: a worker's inbox over a real SOCK_SEQPACKET pair, descriptors included; and nameless segments."""

import array
import os
import socket
import subprocess
import sys
import time
import zlib

import pytest
from processes import open_fds

from ipc.errors import ChannelClosed, IpcError
from ipc.inbox import Inbox, InboxReader
from ipc.records import MAX_RECORD_BYTES
from ipc.segment import SHM_DIR, Segment
from ipc.wire import Done, Job, Release, encode


@pytest.fixture
def pair():
    inbox = Inbox()
    reader = InboxReader(os.dup(inbox.worker_fd))
    inbox.handed_over()
    yield inbox, reader
    inbox.close()
    reader.close()


def one_off(data: bytes) -> int:
    segment, fd = Segment.anonymous("test", len(data))
    segment.buffer[: len(data)] = data
    assert segment.close()
    return fd


def rights(*fds: int) -> list:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]


def test_messages_arrive_whole_and_in_order(pair):
    inbox, reader = pair
    sent = [Job(1, 0, 1000, {"kinds": "b"}, [(64, 2)], [(0, 8), (64, 100)]), Release(0, [(128, 3)]), Job(2, 0, 10)]
    for message in sent:
        assert inbox.send(message)
    assert [reader.recv(1000) for _ in sent] == [(message, None) for message in sent]
    started = time.monotonic()
    assert reader.recv(20) is None  # nothing more: the timeout holds
    assert 0.015 < time.monotonic() - started < 1


def test_a_job_carries_its_inputs_descriptor_and_nothing_is_named(pair):
    inbox, reader = pair
    before = set(os.listdir(SHM_DIR))
    data = os.urandom(300_000)
    fd = one_off(data)
    assert set(os.listdir(SHM_DIR)) == before  # a memfd has no name in /dev/shm
    assert inbox.send(Job(7, 0, 1000, inputs=[(0, len(data))]), fd)
    os.close(fd)  # the sender's copy; the record holds its own
    message, received = reader.recv(1000)
    assert message.rid == 7 and received is not None
    segment = Segment.map_fd(received)
    os.close(received)
    assert bytes(segment.buffer[: len(data)]) == data and not segment.writable
    assert segment.close()


def test_the_descriptor_reaches_another_process(pair, tmp_path):
    # The worker's side in a child process of its own, as in the pool: the memory arrives by descriptor.
    inbox = Inbox()
    child = (
        "import sys, zlib; from ipc.inbox import InboxReader; from ipc.segment import Segment\n"
        "message, fd = InboxReader(int(sys.argv[1])).recv(10_000)\n"
        "offset, n = message.inputs[0]\n"
        "print(zlib.crc32(Segment.map_fd(fd).buffer[offset : offset + n]))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child, str(inbox.worker_fd)], pass_fds=(inbox.worker_fd,),
                            stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))  # fmt: skip
    inbox.handed_over()
    data = os.urandom(1 << 20)
    fd = one_off(data)
    try:
        assert inbox.send(Job(1, 0, 1000, inputs=[(0, len(data))]), fd)
    finally:
        os.close(fd)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and int(out) == zlib.crc32(data)
    inbox.close()


def test_a_full_queue_refuses_without_blocking_and_loses_nothing(pair):
    inbox, reader = pair
    sent = 0
    started = time.monotonic()
    while inbox.send(Release(0, [(sent * 64, sent)])):
        sent += 1
    assert time.monotonic() - started < 5 and sent > 10  # it filled and said so, at once
    assert not inbox.send(Release(0, [(0, 0)]))  # still full: refused again, nothing queued
    got = []
    while (record := reader.recv(0)) is not None:
        got.append(record[0].allocations[0][1])
    assert got == list(range(sent))
    assert inbox.send(Release(0, []))  # room again


def test_a_record_too_large_is_refused_before_sending(pair):
    inbox, reader = pair
    with pytest.raises(IpcError, match="exceeds"):
        inbox.send(Release(0, [(i * 64, i) for i in range(MAX_RECORD_BYTES // 8)]))
    assert reader.recv(0) is None


def test_the_worker_gone_is_channel_closed_and_so_is_the_client_gone(pair):
    inbox, reader = pair
    reader.close()
    with pytest.raises(ChannelClosed):
        inbox.send(Release(0, []))
    other = Inbox()
    other_reader = InboxReader(os.dup(other.worker_fd))
    other.close()  # the client's end, and its copy of the worker's
    with pytest.raises(ChannelClosed):
        other_reader.recv(1000)
    other_reader.close()


def test_malformed_records_are_dropped_and_their_descriptors_closed(pair):
    inbox, reader = pair
    raw = inbox._sock  # what a buggy or hostile sender could put on the socket
    fd = one_off(b"x" * 64)
    fds_before = open_fds()
    raw.send(b"\x93garbage")
    raw.send(encode(Done(1, {}, frames=1)))  # announces a payload frame a record cannot have
    raw.sendmsg([encode(Release(0, []))], rights(fd))  # a descriptor with something other than a Job
    raw.sendmsg([encode(Job(2, 0, 10))], rights(fd, fd))  # more than one descriptor
    raw.send(b"\x00" * (MAX_RECORD_BYTES + 100))  # longer than any record
    # A descriptor with a Job whose inputs are in the sender's memory: one of the two would be ignored.
    raw.sendmsg([encode(Job(4, 0, 10, inputs=[(4096, 8)], inputs_in_sender=True))], rights(fd))
    assert inbox.send(Job(3, 0, 10))
    message, received = reader.recv(1000)
    assert message.rid == 3 and received is None and reader.rejected == 6
    os.close(fd)
    assert len(open_fds()) == len(fds_before) - 1  # every descriptor that came with a bad record is closed


def test_only_a_seqpacket_socket_is_accepted():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = a.detach()
    with pytest.raises(IpcError, match="not a SOCK_SEQPACKET"):
        InboxReader(fd)
    with pytest.raises(OSError):
        os.fstat(fd)  # refused, and closed
    b.close()


def test_nameless_segments_are_sized_and_must_be_positive():
    segment, fd = Segment.anonymous("test", 4096)
    try:
        assert os.fstat(fd).st_size == 4096 == segment.size and segment.writable
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:mmw-test")
    finally:
        assert segment.close()
        os.close(fd)
    with pytest.raises(IpcError, match="positive"):
        Segment.anonymous("test", 0)
