"""The floor under the pool's overhead: bare sockets in the pool's shape, with no pool logic at all.

Same topology and load as bench_pool's open loop: a bound ROUTER in this process, two DEALER
processes pinned one per core and scheduled like workers (worker_sched, worker_nice), jobs
dispatched to an idle worker only, Poisson arrivals, the same request bytes (the encoded image) and
a small reply. A job is "work" that streams memory the way a worker writing pixel_values does
(refilling a 22.5 MB array) for a given time. Replies come back either through ZeroMQ too or, as in
the pool, through one shared AF_UNIX SOCK_SEQPACKET pair (ipc.results). What this measures
(overhead = reply latency minus work, client CPU per request) is what the transport and waking up
cost on this machine before mmworker adds anything.
"""

import os
import random
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque

import zmq
from yardstick import percentile

ECHO_WORKER = r"""
import os, socket, struct, sys, time
import numpy as np
import zmq
endpoint, identity, sched = sys.argv[1], sys.argv[2].encode(), sys.argv[5]
core, nice = int(sys.argv[3]), int(sys.argv[4])
results = socket.socket(fileno=int(sys.argv[6])) if len(sys.argv) > 6 else None
os.sched_setaffinity(0, {core})
os.nice(nice)  # before libzmq starts its threads, so they inherit both, as in a pool worker
if sched == "idle":
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
sock = zmq.Context(io_threads=1).socket(zmq.DEALER)
sock.setsockopt(zmq.IDENTITY, identity)
sock.setsockopt(zmq.LINGER, 0)
sock.connect(endpoint)
out = np.empty(22_500_000 // 4, np.float32)
sock.send(b"ready")
while True:
    frames = sock.recv_multipart()
    if frames[0] == b"stop":
        break
    (work_s,) = struct.unpack("d", frames[0])
    t0 = time.monotonic()
    while time.monotonic() - t0 < work_s:
        out.fill(1.0)
    reply = struct.pack("dd", t0, (time.monotonic() - t0) * 1e3)
    if results is None:
        sock.send(reply)
    else:
        results.send(identity + reply)
"""


def zmq_floor(
    payload: bytes,
    work_ms: float,
    rate: float,
    seconds: float,
    cores: list[int],
    nice: int,
    sched: str,
    *,
    seqpacket: bool,
) -> tuple:
    """Poisson arrivals at `rate`/s, each a job of `work_ms` on one of len(cores) echo workers;
    replies through ZeroMQ, or through a shared SOCK_SEQPACKET pair if `seqpacket`; the workers run
    at `nice` and, if `sched` is "idle", as SCHED_IDLE (PoolConfig.worker_nice, .worker_sched).

    Returns the overhead per request (dispatch -> reply received, minus the work) in its two parts,
    in ms: "to the worker" (dispatch -> work began) and "back" (work ended -> reply received); and
    the client CPU ms per request.
    """
    with tempfile.TemporaryDirectory(prefix="mmworker-floor-") as tmp:
        context = zmq.Context(io_threads=1)
        router = context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        endpoint = f"ipc://{tmp}/floor"
        router.bind(endpoint)
        receiving, sending = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        inherit = (sending.fileno(),) if seqpacket else ()  # where replies go, if not through ZeroMQ
        workers = [
            subprocess.Popen([sys.executable, "-c", ECHO_WORKER, endpoint, f"e{i}", str(core), str(nice), sched,
                              *map(str, inherit)], pass_fds=inherit)
            for i, core in enumerate(cores)
        ]  # fmt: skip
        try:
            idle = deque()
            while len(idle) < len(workers):
                if not router.poll(30_000, zmq.POLLIN):
                    raise RuntimeError("a bare ZeroMQ echo worker did not start within 30 s")
                idle.append(router.recv_multipart()[0])
            return _open_loop(router, receiving if seqpacket else None, idle, payload, work_ms, rate, seconds)
        finally:
            for i in range(len(workers)):
                router.send_multipart([f"e{i}".encode(), b"stop"])  # dropped for one that never connected
            for proc in workers:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            router.close()
            context.term()
            receiving.close()
            sending.close()


def _open_loop(router, results, idle: deque, payload: bytes, work_ms: float, rate: float, seconds: float) -> tuple:
    rng = random.Random(1)
    job = struct.pack("d", work_ms / 1e3)
    waiting: deque[float] = deque()  # arrival times of jobs not yet dispatched
    running: dict[bytes, float] = {}  # identity -> dispatch time
    to_worker, back = [], []

    def answered(identity: bytes, reply: bytes, arrived: float) -> None:
        started, busy_ms = struct.unpack("dd", reply)
        to_worker.append((started - running.pop(identity)) * 1e3)
        back.append((arrived - started) * 1e3 - busy_ms)
        idle.append(identity)

    ready = select.poll()
    if results is not None:
        ready.register(results.fileno(), select.POLLIN)
    cpu0 = time.process_time()
    t0 = time.monotonic()
    next_at = t0
    while time.monotonic() - t0 < seconds or waiting or running:
        now = time.monotonic()
        while next_at <= now and now - t0 < seconds:
            waiting.append(now)
            next_at += rng.expovariate(rate)
        while waiting and idle:
            waiting.popleft()
            identity = idle.popleft()
            running[identity] = time.monotonic()  # before the send, as in the pool
            router.send_multipart([identity, job, payload])
        wait = max(0.0, min(next_at - time.monotonic(), 0.05)) if now - t0 < seconds else 0.05
        if results is not None:
            for _ in ready.poll(int(wait * 1000) + 1):
                record = results.recv(64)
                answered(record[:-16], record[-16:], time.monotonic())
        elif router.poll(int(wait * 1000) + 1, zmq.POLLIN):
            while router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                identity, reply = router.recv_multipart()
                answered(identity, reply, time.monotonic())
    cpu_ms = (time.process_time() - cpu0) / max(1, len(back)) * 1e3
    return to_worker, back, cpu_ms


if __name__ == "__main__":
    cores = sorted(os.sched_getaffinity(0))[:2]
    for seqpacket in (False, True):
        to_worker, back, cpu = zmq_floor(os.urandom(135_000), 14.0, 95.0, 10.0, cores, 10, "idle", seqpacket=seqpacket)
        over = [a + b for a, b in zip(to_worker, back, strict=True)]
        name = "ZeroMQ + SEQPACKET replies" if seqpacket else "ZeroMQ both ways"
        print(f"{name}: overhead p50 {percentile(over, 0.5):.2f} ms (to the worker {percentile(to_worker, 0.5):.2f}, "
              f"back {percentile(back, 0.5):.2f}), p99 {percentile(over, 0.99):.2f} ms, "
              f"client CPU {cpu:.3f} ms/request over {len(over)} requests")  # fmt: skip
