"""The floor under the pool's overhead: bare sockets in the pool's shape, with no pool logic at all.

Same topology and load as bench_pool's open loop: this process and two echo-worker processes
pinned one per core and scheduled like workers (worker_sched, worker_nice), jobs dispatched to an
idle worker only, Poisson arrivals, the same request bytes (the encoded image) and a small reply.
A job is "work" that streams memory the way a worker writing pixel_values does (refilling a
22.5 MB array) for a given time. Three transports (TRANSPORTS):

- "pool": the pool's own. The request bytes stay where they are (a pool worker reads them in
  place, ipc.peer_memory: no work on this side), the job (a small record) goes on the worker's own
  SOCK_SEQPACKET pair (ipc.inbox's shape), the reply on one SOCK_SEQPACKET pair all workers share
  (ipc.results's shape);
- "zmq jobs": the request bytes are copied into a shared-memory buffer (as into the request ring),
  and the job goes through a ZeroMQ ROUTER to the worker's DEALER (the pool's transport before
  ipc.inbox and ipc.peer_memory);
- "all zmq": job and request bytes through ZeroMQ, the reply too (the pool's first design).

What this measures (overhead = reply latency minus work, client CPU per request, libzmq's I/O
thread included) is what the transport and waking up cost on this machine before mmworker adds
anything.
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
from multiprocessing import shared_memory

import numpy as np
import zmq
from yardstick import percentile

TRANSPORTS = ("pool", "zmq jobs", "all zmq")

ECHO_WORKER = r"""
import os, socket, struct, sys, time
import numpy as np
endpoint, identity, core, nice, sched, transport = sys.argv[1:7]
identity = identity.encode()
os.sched_setaffinity(0, {int(core)})
os.nice(int(nice))  # before libzmq starts its threads, so they inherit both, as in a pool worker
if sched == "idle":
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
results = socket.socket(fileno=int(sys.argv[7])) if transport != "all zmq" else None
if transport == "pool":
    inbox = socket.socket(fileno=int(sys.argv[8]))
    results.send(identity + b"ready")
    recv = lambda: inbox.recv(256)
else:
    import zmq
    sock = zmq.Context(io_threads=1).socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.send(b"ready")
    recv = lambda: sock.recv_multipart()[0]
out = np.empty(22_500_000 // 4, np.float32)
while True:
    job = recv()
    if job == b"stop":
        break
    (work_s,) = struct.unpack("d", job[:8])
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
    payload: bytes, work_ms: float, rate: float, seconds: float, cores: list[int], nice: int, sched: str, transport: str
) -> tuple:
    """Poisson arrivals at `rate`/s, each a job of `work_ms` on one of len(cores) echo workers,
    through `transport` (one of TRANSPORTS); the workers run at `nice` and, if `sched` is "idle",
    as SCHED_IDLE (PoolConfig.worker_nice, .worker_sched).

    Returns the overhead per request (dispatch -> reply received, minus the work) in its two parts,
    in ms: "to the worker" (dispatch -> work began) and "back" (work ended -> reply received); and
    the client CPU ms per request.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    with tempfile.TemporaryDirectory(prefix="mmworker-floor-") as tmp:
        context = zmq.Context(io_threads=1)
        router = context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        endpoint = f"ipc://{tmp}/floor"
        router.bind(endpoint)
        receiving, sending = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        staging = shared_memory.SharedMemory(create=True, size=max(1, len(payload)))
        inboxes, workers = {}, []
        try:
            for i, core in enumerate(cores):
                identity = f"e{i}".encode()
                inherit = (sending.fileno(),) if transport != "all zmq" else ()
                if transport == "pool":
                    inboxes[identity], worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                    inherit += (worker_end.fileno(),)
                argv = [endpoint, identity.decode(), str(core), str(nice), sched, transport, *map(str, inherit)]
                workers.append(subprocess.Popen([sys.executable, "-c", ECHO_WORKER, *argv], pass_fds=inherit))
                if transport == "pool":
                    worker_end.close()
            idle = deque()
            while len(idle) < len(workers):
                if transport == "pool":
                    if not select.select([receiving], [], [], 30)[0]:
                        raise RuntimeError("a bare echo worker did not start within 30 s")
                    idle.append(receiving.recv(64)[:2])
                else:
                    if not router.poll(30_000, zmq.POLLIN):
                        raise RuntimeError("a bare ZeroMQ echo worker did not start within 30 s")
                    idle.append(router.recv_multipart()[0])
            staged = np.frombuffer(staging.buf, np.uint8)
            return _Loop(router, receiving, inboxes, staged, transport).run(idle, payload, work_ms, rate, seconds)
        finally:
            for i in range(len(workers)):
                identity = f"e{i}".encode()
                if identity in inboxes:
                    inboxes[identity].send(b"stop")
                else:
                    router.send_multipart([identity, b"stop"])  # dropped for one that never connected
            for proc in workers:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for inbox in inboxes.values():
                inbox.close()
            router.close()
            context.term()
            receiving.close()
            sending.close()
            staged = None
            staging.close()
            staging.unlink()


class _Loop:
    """The client's open loop over one transport."""

    def __init__(self, router, receiving, inboxes: dict, staged: np.ndarray, transport: str) -> None:
        self.router, self.receiving, self.inboxes, self.staged = router, receiving, inboxes, staged
        self.transport = transport

    def send(self, identity: bytes, job: bytes, payload: bytes) -> None:
        if self.transport == "all zmq":
            self.router.send_multipart([identity, job, payload])
            return
        if self.transport == "pool":
            self.inboxes[identity].send(job)
        else:
            self.staged[: len(payload)] = np.frombuffer(payload, np.uint8)  # the copy into the request ring
            self.router.send_multipart([identity, job])

    def run(self, idle: deque, payload: bytes, work_ms: float, rate: float, seconds: float) -> tuple:
        rng = random.Random(1)
        job = struct.pack("d", work_ms / 1e3) + bytes(40)  # about a Job's size
        waiting: deque[float] = deque()  # arrival times of jobs not yet dispatched
        running: dict[bytes, float] = {}  # identity -> dispatch time
        to_worker, back = [], []

        def answered(identity: bytes, reply: bytes, arrived: float) -> None:
            started, busy_ms = struct.unpack("dd", reply)
            to_worker.append((started - running.pop(identity)) * 1e3)
            back.append((arrived - started) * 1e3 - busy_ms)
            idle.append(identity)

        ready = select.poll()
        ready.register(self.receiving.fileno(), select.POLLIN)
        zmq_replies = self.transport == "all zmq"
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
                self.send(identity, job, payload)
            wait = max(0.0, min(next_at - time.monotonic(), 0.05)) if now - t0 < seconds else 0.05
            if not zmq_replies:
                for _ in ready.poll(int(wait * 1000) + 1):
                    record = self.receiving.recv(64)
                    answered(record[:-16], record[-16:], time.monotonic())
            elif self.router.poll(int(wait * 1000) + 1, zmq.POLLIN):
                while self.router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    identity, reply = self.router.recv_multipart()
                    answered(identity, reply, time.monotonic())
        cpu_ms = (time.process_time() - cpu0) / max(1, len(back)) * 1e3
        return to_worker, back, cpu_ms


if __name__ == "__main__":
    cores = sorted(os.sched_getaffinity(0))[:2]
    for transport in TRANSPORTS:
        to_worker, back, cpu = zmq_floor(os.urandom(135_000), 4.2, 333.0, 10.0, cores, 10, "idle", transport)
        over = [a + b for a, b in zip(to_worker, back, strict=True)]
        parts = f"to the worker {percentile(to_worker, 0.5):.2f}, back {percentile(back, 0.5):.2f}"
        print(f"{transport}: overhead p50 {percentile(over, 0.5):.2f} ms ({parts}), p99 {percentile(over, 0.99):.2f}, "
              f"client CPU {cpu:.3f} ms/request over {len(over)} requests")  # fmt: skip
