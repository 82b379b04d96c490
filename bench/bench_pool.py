"""Benchmark of the worker pool: scaling with workers, pool overhead per request, client CPU, order.

720p JPEG requests of one image, qwen2_vl (HF default pixel budget), one run:
1. closed loop (2 requests in flight per worker) with 1 and with 2 workers: throughput and ratio;
2. open loop at 70% of the 2-worker throughput, Poisson arrivals, ordered and unordered, and
   (for comparison, no verdict) evenly paced arrivals, ordered: latency percentiles; pool
   overhead = latency - in-worker busy time (with and without the time spent waiting for a free
   worker); client CPU (this process: submit, poll, views, release, libzmq's I/O thread) per
   accepted request; "delivered" is submit -> returned by poll (latency is submit -> the reply
   arrived; ordered delivery adds the wait for earlier requests). Poisson arrivals often queue
   behind busy workers at 70% load, paced ones rarely: their overhead is mostly the pool's own.
3. (no verdict) the floor: bare sockets in the same shape and at the same load, with jobs that stream
   memory for the pool's median in-worker time (bench/zmq_floor.py), once with the pool's transport
   (jobs through ZeroMQ, replies on a SOCK_SEQPACKET pair) and once all ZeroMQ: overhead and client CPU that
   the transport and waking up cost here before the pool adds anything; then, for every row, the
   overhead excluding the wait for a worker in its two parts (Reply.to_worker_ms, Reply.returned_ms):
   handed over -> the worker began, and the worker finished -> the reply is ready;
4. (no verdict) a busy embedding loop, like SGLang's scheduler while it serves: 1 worker at 70% of
   its throughput, the loop does ~1 ms of its own Python work per turn and calls poll(0) (never
   sleeps); client CPU = thread CPU inside the submit/poll/release calls of the turns that had
   something to do plus libzmq's I/O thread, per request, and separately the cost of a poll(0)
   that finds nothing. Beside row 2 it shows how much of the client CPU there is waking up.

    .venv/bin/python bench/bench_pool.py [--seconds 10] [--worker-nice N]
"""

import argparse
import os
import random
import sys
import time

from yardstick import percentile
from zmq_floor import zmq_floor

from mmworker import PoolConfig, WorkerPool
from mmworker.corpus import encode, photo_like
from mmworker.registry import named_spec

P = 151655


def closed_loop(pool, data, seconds, in_flight):
    for _ in range(in_flight):
        pool.submit([P], [data])
    done, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for reply in pool.poll(1.0):
            assert reply.ok, reply.error
            reply.release()
            done += 1
            pool.submit([P], [data])
    elapsed = time.monotonic() - t0
    while pool.stats().in_flight:
        for reply in pool.poll(1.0):
            reply.release()
    return done / elapsed


def open_loop(pool, data, seconds, rate, paced=False, seed=1):
    rng = random.Random(seed)
    replies, t0 = [], time.monotonic()
    next_at = t0
    cpu0 = time.process_time()
    submitted, sent = 0, {}
    while time.monotonic() - t0 < seconds or pool.stats().in_flight:
        now = time.monotonic()
        while next_at <= now and now - t0 < seconds:
            sent[pool.submit([P], [data])] = time.monotonic()
            submitted += 1
            next_at += 1 / rate if paced else rng.expovariate(rate)
        wait = max(0.0, min(next_at - time.monotonic(), 0.05)) if now - t0 < seconds else 0.05
        got = pool.poll(wait)
        now = time.monotonic()
        for reply in got:
            assert reply.ok, reply.error
            delivered = (now - sent.pop(reply.request_id)) * 1e3  # incl. waiting for earlier ones if ordered
            replies.append((reply.latency_ms, reply.busy_ms, reply.queued_ms, delivered, reply.to_worker_ms,
                            reply.returned_ms))  # fmt: skip
            reply.release()
    cpu = time.process_time() - cpu0
    return replies, cpu / max(1, len(replies)) * 1e3


def _zmq_io_cpu_s() -> float:
    """CPU seconds so far of this process's libzmq I/O threads (from /proc schedstat)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith("ZMQbg/IO"):
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:  # a thread that just ended
            continue
    return total / 1e9


def busy_loop(pool, data, seconds, rate, step_s=0.001, seed=1):
    """An embedding loop that never sleeps: its own work, then submit what arrived, poll(0), release.

    Returns (CPU per request in the turns that submitted or received something, of which libzmq's
    I/O thread, median CPU of a turn that found nothing), in ms; libzmq's thread is per request.
    """
    rng = random.Random(seed)
    active, empty, replies = 0.0, [], 0
    io0 = _zmq_io_cpu_s()
    t0 = time.monotonic()
    next_at = t0
    while time.monotonic() - t0 < seconds or pool.stats().in_flight:
        until = time.perf_counter() + step_s
        while time.perf_counter() < until:  # the loop's own work, not counted
            pass
        now = time.monotonic()
        c = time.thread_time()
        did = False
        while next_at <= now and now - t0 < seconds:
            pool.submit([P], [data])
            next_at += rng.expovariate(rate)
            did = True
        for reply in pool.poll(0):
            assert reply.ok, reply.error
            reply.release()
            replies += 1
            did = True
        spent = time.thread_time() - c
        if did:
            active += spent
        else:
            empty.append(spent)
    io = (_zmq_io_cpu_s() - io0) / max(1, replies)
    return (active / max(1, replies) + io) * 1e3, io * 1e3, percentile(empty, 0.5) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--worker-nice", type=int, default=None, help="override the pool's worker_nice")
    args = parser.parse_args()
    from mmworker.runtime import reexec_tuned

    reexec_tuned()
    spec = {**named_spec("qwen2_vl"), "max_pixels": 1003520}
    data = encode(photo_like(1280, 720, seed=1), "JPEG")
    base = {"ring_mib": 256} if args.worker_nice is None else {"ring_mib": 256, "worker_nice": args.worker_nice}
    throughput = {}
    for workers in (1, 2):
        with WorkerPool(spec, {**base, "workers": workers}) as pool:
            closed_loop(pool, data, 1.0, 2 * workers)  # warm-up
            throughput[workers] = closed_loop(pool, data, args.seconds, 2 * workers)
    print(f"closed loop, 720p JPEG, 1 image/request, {args.seconds:g} s each")
    for workers, rps in throughput.items():
        print(f"  {workers} worker(s): {rps:7.1f} requests/s")
    scale = throughput[2] / throughput[1]
    print(f"  2 workers / 1 worker: {scale:.2f}x")

    rate = 0.7 * throughput[2]
    results = {}
    for ordered, paced in ((True, False), (False, False), (True, True)):
        with WorkerPool(spec, {**base, "workers": 2, "ordered": ordered}) as pool:
            closed_loop(pool, data, 1.0, 4)
            results[ordered, paced] = open_loop(pool, data, args.seconds, rate, paced)
    print(f"\nopen loop at 70% load ({rate:.1f} requests/s), 2 workers")
    print(f"  {'':<18} {'latency p50':>12} {'p99':>8} {'overhead p50':>13} {'p99':>8} "
          f"{'excl. queue p50':>16} {'p99':>8} {'delivered p50':>14} {'p99':>8} {'client CPU/req':>15}")  # fmt: skip
    verdicts = [(f"2 workers >= 1.8x 1 worker: {scale:.2f}x", scale >= 1.8)]
    parts = {}  # row name -> (to the worker, back to the caller) per request, ms
    for (ordered, paced), (replies, cpu_ms) in results.items():
        lat = [r[0] for r in replies]
        over = [r[0] - r[1] for r in replies]
        transport = [r[0] - r[1] - r[2] for r in replies]
        name = ("ordered" if ordered else "unordered") + (", paced" if paced else ", Poisson")
        parts[name] = ([r[4] for r in replies], [r[5] for r in replies])
        cells = [
            percentile(lat, 0.5),
            percentile(lat, 0.99),
            percentile(over, 0.5),
            percentile(over, 0.99),
            percentile(transport, 0.5),
            percentile(transport, 0.99),
            percentile([r[3] for r in replies], 0.5),
            percentile([r[3] for r in replies], 0.99),
        ]
        widths = [10, 6, 11, 6, 14, 6, 12, 6]
        row = " ".join(f"{v:{w}.2f}ms" for v, w in zip(cells, widths, strict=True))
        print(f"  {name:<18} {row} {cpu_ms:13.3f}ms")
        if ordered and not paced:
            where = "ordered, Poisson arrivals at 70% load"
            verdicts += [
                (f"overhead p50 <= 0.5 ms ({where}, incl. waiting for a free worker): {percentile(over, .5):.2f} ms "
                 f"(excluding that wait {percentile(transport, .5):.2f})", percentile(over, .5) <= 0.5),
                (f"overhead p99 <= 2 ms ({where}, incl. waiting for a free worker): {percentile(over, .99):.2f} ms "
                 f"(excluding that wait {percentile(transport, .99):.2f})", percentile(over, .99) <= 2.0),
                (f"client CPU per accepted request <= 0.2 ms ({where}, process CPU incl. libzmq's thread): "
                 f"{cpu_ms:.3f} ms", cpu_ms <= 0.2),
            ]  # fmt: skip

    replies, _ = results[True, False]
    work_ms = percentile([r[1] for r in replies], 0.5)
    nice = PoolConfig().worker_nice if args.worker_nice is None else args.worker_nice
    cores = sorted(os.sched_getaffinity(0))[:2]
    for name, seqpacket in (("floor: the pool's", True), ("floor: all ZeroMQ", False)):
        to_worker, back, floor_cpu = zmq_floor(data, work_ms, rate, args.seconds, cores, nice, seqpacket=seqpacket)
        parts[name] = (to_worker, back)
        floor = [a + b for a, b in zip(to_worker, back, strict=True)]
        print(f"  {name:<18} {'':>33} {percentile(floor, 0.5):14.2f}ms {percentile(floor, 0.99):6.2f}ms "
              f"{'':>32} {floor_cpu:13.3f}ms")  # fmt: skip
    print(
        f"  (floors: same shape and load, {work_ms:.1f} ms jobs, no pool logic; the pool's sends jobs through "
        "ZeroMQ and gets replies on a SOCK_SEQPACKET pair)"
    )
    print("\n  overhead excl. queue in its two parts, p50 / p99 (ms): to the worker = handed over -> the worker "
          "began; back = the worker finished -> the reply is ready (the floors: received)")  # fmt: skip
    for name, (to_worker, back) in parts.items():
        print(f"  {name:<18} to the worker {percentile(to_worker, 0.5):5.2f} / {percentile(to_worker, 0.99):5.2f}"
              f"    back {percentile(back, 0.5):5.2f} / {percentile(back, 0.99):5.2f}")  # fmt: skip

    with WorkerPool(spec, {**base, "workers": 1}) as pool:
        closed_loop(pool, data, 1.0, 2)
        busy_cpu, busy_io, empty_poll = busy_loop(pool, data, args.seconds, 0.7 * throughput[1])
    print("\nbusy embedding loop (never sleeps, poll(0) every ~1 ms), 1 worker at 70% load, no verdict:")
    print(f"  client CPU per request {busy_cpu:.3f} ms (of which libzmq's I/O thread {busy_io:.3f} ms), "
          f"plus {empty_poll * 1e3:.1f} us per poll(0) that finds nothing")  # fmt: skip
    print()
    for text, ok in verdicts:
        print(f"target {text} {'PASS' if ok else 'MISS'}")
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
