"""Benchmark of the ipc transport: feature hand-off cost on the client, and small round trips.

1. Hand-off of a 22.5 MB float32 feature (a 720p image's pixel_values) from a worker process to
   the client. The client-side cost is measured from "a message is waiting" to "the client holds
   a numpy array of the feature": for ipc that is receive + decode + a bounds-checked view into the
   worker's ring; beside it, a plain ZeroMQ send of the bytes and a multiprocessing.Queue (pickle;
   used here only as the yardstick it is), and an in-process memcpy of the same bytes.
2. Small request/reply round trips through ipc.channels (Job -> Done) vs a bare pyzmq
   DEALER/ROUTER echo, same run, same processes layout.

    .venv/bin/python bench/bench_ipc.py [--rounds 200] [--rtts 5000]
"""

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import zmq
from yardstick import percentile

from ipc.channels import Dealer, Router, RuntimeDir, new_context
from ipc.ring import RingReader, RingWriter
from ipc.segment import Segment, new_name
from ipc.wire import WIRE_VERSION, Done, Hello, Job, Release, TensorDesc

FEATURE_SHAPE = (4784, 1176)  # 1280x720 -> 1288x728, qwen2_vl
FEATURE_BYTES = FEATURE_SHAPE[0] * FEATURE_SHAPE[1] * 4


def peer(mode: str, endpoint: str, ring_name: str) -> None:
    """The worker side, run in its own process."""
    ctx = new_context()
    if mode == "raw-echo":
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send(b"hi")
        while True:
            msg = sock.recv_multipart()
            if msg[0] == b"stop":
                return
            sock.send_multipart(msg)
    if mode == "raw-bytes":
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        payload = np.ones(FEATURE_SHAPE, np.float32)
        sock.send(b"hi")
        while sock.recv() != b"stop":
            sock.send(payload, copy=False)
        return
    segment = Segment.attach(ring_name, writable=True)
    ring = RingWriter(segment, 0)
    dealer = Dealer(ctx, endpoint, b"w0")
    dealer.send(Hello(WIRE_VERSION, 0, os.getpid(), 0, ring_name, segment.size))
    while True:  # until SIGTERM, as the pool ends its children
        message, _ = dealer.recv(-1)
        if isinstance(message, Release):
            for offset, seq in message.allocations:
                ring.release(offset, seq)
            continue
        if message.args.get("feature"):
            a = ring.try_allocate(FEATURE_BYTES)
            ring.array(a, "<f4", FEATURE_SHAPE)[...] = 1.0
            tensors = {"feature": TensorDesc(0, a.offset, a.seq, FEATURE_BYTES, "<f4", FEATURE_SHAPE)}
        else:
            tensors = {}
        dealer.send(Done(message.rid, tensors))


def queue_peer(queue: multiprocessing.Queue, count: int) -> None:
    payload = np.ones(FEATURE_SHAPE, np.float32)
    for _ in range(count):
        queue.put(payload)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="feature hand-offs per method")
    parser.add_argument("--rtts", type=int, default=5000, help="small round trips per method")
    args = parser.parse_args()

    rundir = RuntimeDir()
    ctx = new_context()
    results = {}

    # --- ipc: ring + channels --------------------------------------------------------------------
    router = Router(ctx, rundir.endpoint("ipc"))
    segment = Segment.create(new_name("bench"), FEATURE_BYTES * 2 + (1 << 20))
    proc = subprocess.Popen([sys.executable, __file__, "--peer", "ring", router.endpoint, segment.name])
    while not router.poll(100) or (got := router.recv()) is None:
        pass
    peer_id, _hello, _ = got
    reader = RingReader(Segment.attach(segment.name, writable=False), 0)
    segment.unlink()
    handoff, rtt = [], []
    for rid in range(args.rounds):
        router.send(peer_id, Job(rid, 0, 0, {"feature": True}))
        # Spin until the reply is there, like a scheduler loop polling between steps: what is
        # timed is the client's own work, not the kernel waking a sleeping process.
        while not router.poll(0):
            pass
        t0 = time.perf_counter()
        _, done, _ = router.recv()
        d = done.tensors["feature"]
        view = reader.view(d.offset, d.nbytes, d.dtype, d.shape)
        handoff.append(time.perf_counter() - t0)
        assert view.shape == FEATURE_SHAPE
        del view
        router.send(peer_id, Release(0, [(d.offset, d.seq)]))
    for rid in range(args.rtts):
        t0 = time.perf_counter()
        router.send(peer_id, Job(rid, 0, 0))
        router.poll(-1)
        router.recv()
        rtt.append(time.perf_counter() - t0)
    proc.terminate()
    proc.wait(10)
    router.close()
    results["ipc ring view"] = handoff
    results["ipc channels RTT"] = rtt

    # --- bare pyzmq ----------------------------------------------------------------------------------
    for mode in ("raw-echo", "raw-bytes"):
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        endpoint = rundir.endpoint(mode)
        sock.bind(endpoint)
        proc = subprocess.Popen([sys.executable, __file__, "--peer", mode, endpoint, "-"])
        ident, _ = sock.recv_multipart()
        times = []
        for _ in range(args.rtts if mode == "raw-echo" else args.rounds):
            if mode == "raw-echo":
                t0 = time.perf_counter()
                sock.send_multipart([ident, b"x" * 64])
                sock.recv_multipart()
            else:
                sock.send_multipart([ident, b"go"])
                while not sock.poll(0):
                    pass
                t0 = time.perf_counter()
                _, frame = sock.recv_multipart(copy=False)
                np.frombuffer(frame.buffer, np.float32).reshape(FEATURE_SHAPE)
            times.append(time.perf_counter() - t0)
        sock.send_multipart([ident, b"stop"])
        proc.wait(10)
        sock.close()
        results["bare pyzmq RTT" if mode == "raw-echo" else "zmq send of the bytes"] = times

    # --- multiprocessing.Queue (pickles: a yardstick only) ------------------------------------------
    queue = multiprocessing.get_context("spawn").Queue()
    qproc = multiprocessing.get_context("spawn").Process(target=queue_peer, args=(queue, args.rounds))
    qproc.start()
    times = []
    for _ in range(args.rounds):
        while queue.empty():
            pass
        t0 = time.perf_counter()
        queue.get()
        times.append(time.perf_counter() - t0)
    qproc.join()
    results["multiprocessing.Queue"] = times

    src = np.ones(FEATURE_SHAPE, np.float32)
    dst = np.empty_like(src)
    memcpy = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        memcpy.append(time.perf_counter() - t0)
    results["in-process memcpy"] = memcpy

    ctx.term()
    rundir.close()

    print(f"client-side cost of receiving one {FEATURE_BYTES / 1e6:.1f} MB feature (median of {args.rounds})")
    base = statistics.median(results["in-process memcpy"])
    for name in ("ipc ring view", "zmq send of the bytes", "multiprocessing.Queue", "in-process memcpy"):
        med = statistics.median(results[name])
        print(f"  {name:<26} {med * 1e3:9.3f} ms   {med / base * 100:8.2f}% of a memcpy")
    print("  (the zmq row hides a copy: libzmq's I/O thread in the client process copied the bytes")
    print("   before the timer started; the ring view involves no copy anywhere)")
    print(f"\nsmall round trips ({args.rtts} each), microseconds")
    for name in ("ipc channels RTT", "bare pyzmq RTT"):
        v = results[name]
        print(f"  {name:<26} p50 {percentile(v, 0.5) * 1e6:7.1f}   p99 {percentile(v, 0.99) * 1e6:7.1f}")
    view_pct = statistics.median(results["ipc ring view"]) / base * 100
    p50 = percentile(results["ipc channels RTT"], 0.5) / percentile(results["bare pyzmq RTT"], 0.5)
    p99 = percentile(results["ipc channels RTT"], 0.99) / percentile(results["bare pyzmq RTT"], 0.99)
    verdicts = [
        (f"hand-off client cost <= 1% of a memcpy: {view_pct:.2f}%", view_pct <= 1.0),
        (f"channels RTT p50 <= 1.5x bare pyzmq: {p50:.2f}x", p50 <= 1.5),
        (f"channels RTT p99 <= 1.5x bare pyzmq: {p99:.2f}x", p99 <= 1.5),
    ]
    print()
    for text, ok in verdicts:
        print(f"target {text} {'PASS' if ok else 'MISS'}")
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--peer":
        peer(*sys.argv[2:5])
    else:
        sys.exit(main())
