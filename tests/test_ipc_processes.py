"""ipc across real processes: two writers x 20,000 messages, and SIGKILL of writer, reader and parent."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import all_end_within, ended, segments_of

from ipc.channels import Router, RuntimeDir, new_context
from ipc.errors import ChannelClosed
from ipc.ring import RingReader
from ipc.segment import Segment, new_name
from ipc.wire import Done, Hello, Release

PEER = str(Path(__file__).with_name("ipc_peer.py"))


class Client:
    """The reader side of the stress test: a Router, one segment per writer, checked views."""

    def __init__(self, n, ring_bytes, count, max_bytes):
        self.rundir = RuntimeDir()
        self.ctx = new_context()
        self.router = Router(self.ctx, self.rundir.endpoint("work"))
        self.segments = [Segment.create(new_name(f"w{k}"), ring_bytes) for k in range(n)]
        self.readers = {}
        self.procs = [
            subprocess.Popen([sys.executable, PEER, "writer", self.router.endpoint, s.name, str(k), str(count),
                              str(1000 + k), str(max_bytes), str(os.getpid())])
            for k, s in enumerate(self.segments)
        ]  # fmt: skip

    def recv(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.router.recv()
            if got is not None:
                peer, message, _ = got
                if isinstance(message, Hello):
                    seg = self.segments[message.worker]
                    self.readers[message.worker] = (
                        peer,
                        RingReader(Segment.attach(seg.name, writable=False), message.worker),
                    )
                    seg.unlink()
                    continue
                return peer, message
            self.router.poll(20)
        raise AssertionError("no message within the timeout")

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        self.readers.clear()
        for seg in self.segments:
            if seg._linked:
                seg.unlink()
            seg.close()
        self.router.close()
        self.ctx.term()
        self.rundir.close()


def test_two_writers_20000_messages_random_sizes_random_release_order():
    count = 20_000
    client = Client(2, 64 << 20, count, 8 << 20)
    rng = random.Random(7)
    held = []  # (worker, desc)
    seen = {0: 0, 1: 0}
    finished = set()
    try:
        while len(finished) < 2:
            _peer, message = client.recv()
            assert isinstance(message, Done)
            worker = message.meta["worker"]
            if message.rid == -1:
                finished.add(worker)
                continue
            seen[worker] += 1
            assert message.rid == seen[worker]  # each writer's messages arrive once, in order
            desc = message.tensors["x"]
            view = client.readers[worker][1].view(desc.offset, desc.nbytes, desc.dtype, desc.shape)
            if desc.nbytes >= 16:
                assert (
                    int.from_bytes(view[:8].tobytes(), "little")
                    == message.rid
                    == int.from_bytes(view[-8:].tobytes(), "little")
                )
                assert (view[8:-8] == message.meta["fill"]).all()
            else:
                assert (view == message.meta["fill"]).all()
            held.append((worker, desc))
            if len(held) > 40 or rng.random() < 0.3:  # release a random subset, in random order
                rng.shuffle(held)
                n = rng.randint(1, len(held))
                done, held = held[:n], held[n:]
                for w in (0, 1):
                    allocs = [(d.offset, d.seq) for k, d in done if k == w]
                    if allocs:
                        client.router.send(client.readers[w][0], Release(w, allocs))
        assert seen == {0: count, 1: count}
        for w in (0, 1):  # the rest back: each writer exits 0 once its ring is empty, so every release arrived
            allocs = [(d.offset, d.seq) for k, d in held if k == w]
            if allocs:
                client.router.send(client.readers[w][0], Release(w, allocs))
        for proc in client.procs:
            assert proc.wait(10) == 0
    finally:
        client.close()
    assert segments_of(os.getpid()) == []


def test_sigkill_of_a_writer_leaves_the_other_running_and_nothing_behind():
    client = Client(2, 8 << 20, 10**9, 64 << 10)

    def release(peer, message):
        desc = message.tensors["x"]
        client.router.send(peer, Release(desc.ring, [(desc.offset, desc.seq)]))

    try:
        while len(client.readers) < 2:
            release(*client.recv())
        client.procs[0].send_signal(signal.SIGKILL)  # mid-stream: it never stops writing
        assert client.procs[0].wait(5) == -signal.SIGKILL
        # The survivor keeps delivering intact messages; the dead one's ring is simply abandoned.
        survivor = 0
        while survivor < 50:
            peer, message = client.recv()
            if message.meta["worker"] == 1:
                desc = message.tensors["x"]
                view = client.readers[1][1].view(desc.offset, desc.nbytes, desc.dtype, desc.shape)
                assert (view[8:-8] == message.meta["fill"]).all()
                survivor += 1
            try:
                release(peer, message)
            except ChannelClosed:
                assert message.meta["worker"] == 0  # only the dead writer's peer is unreachable
    finally:
        client.close()
    assert segments_of(os.getpid()) == []


@pytest.mark.parametrize("victim", ["client", "writer-then-client"])
def test_sigkill_of_the_owning_process(victim):
    proc = subprocess.Popen([sys.executable, PEER, "client", "2", str(4 << 20)], stdout=subprocess.PIPE, text=True)
    try:
        writers = [int(p) for p in proc.stdout.readline().split()]
        assert len(writers) == 2 and segments_of(proc.pid) == []  # names unlinked once mapped
        if victim == "writer-then-client":
            os.kill(writers[0], signal.SIGKILL)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        assert all_end_within(writers, 2.0)  # workers notice the dead parent within 2 s
        assert all(ended(w) for w in writers)
        assert segments_of(proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
