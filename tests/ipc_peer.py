"""Processes for the ipc multi-process tests: a ring writer, and a client that owns writers.

python tests/ipc_peer.py writer ENDPOINT RING_NAME WORKER COUNT SEED MAX_BYTES PARENT_PID
    (COUNT Done messages, then Done(-1); exits 0 once every allocation has been released)
python tests/ipc_peer.py client N_WRITERS RING_BYTES      (prints its segment names, then waits)
python tests/ipc_peer.py results FD IDENTITY COUNT PAD_BYTES   (COUNT Done records on an inherited results fd)
"""

import math
import os
import random
import subprocess
import sys
import time

import numpy as np

from ipc.channels import Dealer, Router, RuntimeDir, new_context
from ipc.lifeline import die_with_parent
from ipc.results import ResultSender
from ipc.ring import RingWriter
from ipc.segment import Segment, new_name
from ipc.wire import WIRE_VERSION, Done, Hello, Release, TensorDesc


def fill(arr: np.ndarray, seq: int) -> int:
    """Fill with a byte derived from seq; seq also goes into the first and last 8 bytes."""
    byte = (seq * 131 + 7) % 256
    arr[...] = byte
    if arr.size >= 16:
        arr[:8] = np.frombuffer(seq.to_bytes(8, "little"), np.uint8)
        arr[-8:] = arr[:8]
    return byte


def writer(endpoint, ring_name, worker, count, seed, max_bytes, parent_pid):
    die_with_parent(int(parent_pid))
    worker, count, max_bytes = int(worker), int(count), int(max_bytes)
    rng = random.Random(int(seed))
    segment = Segment.attach(ring_name, writable=True)
    ring = RingWriter(segment, worker)
    ctx = new_context()
    dealer = Dealer(ctx, endpoint, f"w{worker}".encode())
    dealer.send(Hello(WIRE_VERSION, worker, os.getpid(), worker, ring_name, segment.size))

    def apply(message) -> None:
        if isinstance(message, Release):
            for offset, seq in message.allocations:
                ring.release(offset, seq)

    def wait(seconds):
        got = dealer.recv(int(min(seconds, 0.05) * 1000))
        if got is not None:
            apply(got[0])

    for seq in range(1, count + 1):
        nbytes = max(1, int(math.exp(rng.uniform(0, math.log(max_bytes)))))
        allocation = ring.allocate(nbytes, time.monotonic() + 60, wait)
        arr = ring.array(allocation, "|u1", (nbytes,))
        byte = fill(arr, seq)
        desc = TensorDesc(worker, allocation.offset, allocation.seq, nbytes, "|u1", (nbytes,))
        dealer.send(Done(seq, {"x": desc}, {"fill": byte, "worker": worker}))
        while (got := dealer.recv(0)) is not None:
            apply(got[0])
    dealer.send(Done(-1, {}, {"worker": worker, "full_waits": ring.stats().full_waits}))
    while ring.stats().live:  # serve releases until the reader has given every allocation back
        got = dealer.recv(-1)
        if got is not None:
            apply(got[0])


def client(n_writers, ring_bytes):
    rundir = RuntimeDir()
    ctx = new_context()
    router = Router(ctx, rundir.endpoint("work"))
    segments = [Segment.create(new_name(f"w{k}"), int(ring_bytes)) for k in range(int(n_writers))]
    procs = [
        subprocess.Popen([sys.executable, __file__, "writer", router.endpoint, s.name, str(k), "1000000",
                          str(k), "4096", str(os.getpid())])
        for k, s in enumerate(segments)
    ]  # fmt: skip
    hello = 0
    while hello < len(procs):
        router.poll(100)
        got = router.recv()
        if got is not None and isinstance(got[1], Hello):
            segments[got[1].worker].unlink()  # every party has mapped it: the name can go
            hello += 1
    print(" ".join(str(p.pid) for p in procs), flush=True)
    while True:  # keep receiving (and never releasing) until killed
        router.poll(100)
        router.recv()


def results(fd, identity, count, pad_bytes):
    """Done(seq) for seq = 1..count, each padded so that records are large and a kill can land mid-send."""
    sender = ResultSender(int(fd), identity.encode())
    pad = "x" * int(pad_bytes)
    for seq in range(1, int(count) + 1):
        sender.send(Done(seq, {}, {"pad": pad, "check": seq * 7}))
    sender.close()


if __name__ == "__main__":
    {"writer": writer, "client": client, "results": results}[sys.argv[1]](*sys.argv[2:])
