"""Benchmark of the worker pool: scaling with workers, pool overhead per request, client CPU, order.

720p JPEG requests of one image, qwen2_vl (HF default pixel budget), one run. The pools run their
workers as SCHED_IDLE (worker_sched "idle") unless --worker-sched says otherwise: the loops here
sleep between events, the embedding that SCHED_IDLE workers suit; "auto", the default, would pick
"normal" on this 2-core machine (2 workers leave the loop no CPU of its own), for loops that spin.
1. closed loop (2 requests in flight per worker) with 1 and with 2 workers, in alternating phases
   (both pools stay up; the machine's speed drifts over seconds): throughput per phase, and the
   ratio of the medians; and where it goes: the time per image in the worker (its CPU time, and
   its time runnable but waiting for a CPU, from /proc/<pid>/schedstat: with 2 workers on 2 cores,
   a worker waits while the client runs), the workers' busy share of their time and the client's
   CPU in cores;
2. the targets' scenario: a closed loop at 70% load: two callers, each with one request in flight,
   each pausing between its reply and its next request (exponential think time, its mean chosen
   from step 1 so that the 2 workers are ~70% busy; the measured share is printed): pool overhead
   = reply latency - in-worker busy time, p50 and p99, and in its two parts (Reply.to_worker_ms:
   handed over -> the worker began; Reply.returned_ms: the worker finished -> the reply is ready);
   client CPU per accepted request: this thread's CPU inside submit, poll (its waits and wake-ups
   included) and release, plus libzmq's I/O thread; the whole process's CPU, which adds the loop's
   own bookkeeping (random think times, samples), is printed beside it; then (no verdict) the same
   loop sleeping as an event loop does, in select on pool.fileno(), and calling poll(0): its waits
   are then its own, and the client CPU is what the pool's calls cost;
3. (no verdict) open loop at the same 70%, Poisson arrivals, ordered and unordered, and evenly paced
   arrivals, ordered: here requests also wait for a free worker (with Poisson arrivals about half
   of them find both busy); latency percentiles, ordered vs unordered; overhead with and without
   that wait; "delivered" is submit -> returned by poll (ordered delivery adds the wait for
   earlier requests);
4. (no verdict) the floor: bare sockets in the same shape at the same load, with jobs that stream
   memory for the pool's median in-worker time (bench/zmq_floor.py), with the pool's transport
   (inputs left in place, jobs on each worker's SOCK_SEQPACKET pair, replies on a shared one), with
   inputs copied to shared memory and jobs through ZeroMQ instead (the pool's transport before
   ipc.inbox and ipc.peer_memory) and all ZeroMQ: overhead and client CPU that
   the transport and waking up cost here before the pool adds anything, in the same two parts;
5. (no verdict) a busy embedding loop, like SGLang's scheduler while it serves (by default it never
   sleeps: its receive path polls without waiting between steps): pinned to a reserved core, 1
   worker on the other at 70% of its throughput, the loop does ~1 ms of its own work per turn and
   calls poll(0); client CPU = thread CPU inside the submit/poll/release calls of the turns that had
   something to do plus libzmq's I/O thread, per request, and separately the cost of a poll(0)
   that finds nothing. Twice: its own work leaving the caches warm, and copying 8 MB per turn
   (caches cold, as after a decode step). Beside step 2 it splits the client CPU into waking up
   and running the pool's code on cold caches;
6. (no verdict) what one sleep with a timeout costs this thread here, with no pool involved.

    .venv/bin/python bench/bench_pool.py [--seconds 10] [--worker-sched auto|idle|normal] [--worker-nice N]
"""

import argparse
import os
import random
import select
import socket
import statistics
import sys
import time
from typing import NamedTuple

import numpy as np
from yardstick import cpu_steal_s, percentile
from zmq_floor import TRANSPORTS, zmq_floor

from mmworker import PoolConfig, WorkerPool
from mmworker.corpus import encode, photo_like
from mmworker.registry import named_spec

P = 151655
LOAD = 0.7
SCALING_ROUNDS = 3
# What the busy loop's own work copies per turn in its cold variant: more than this VM's L2 per core (2 MiB).
SWEEP_BYTES = 8 << 20


class Sample(NamedTuple):
    """One accepted reply's times, ms."""

    latency: float  # submit -> the reply arrived
    busy: float  # in the worker
    queued: float  # waiting for a free worker (or the I/O process)
    to_worker: float  # handed over -> the worker began
    back: float  # the worker finished -> the reply is ready
    delivered: float  # submit -> returned by poll (ordered delivery adds the wait for earlier ones)

    @property
    def overhead(self) -> float:
        return self.latency - self.busy

    @property
    def own_overhead(self) -> float:
        """The overhead without the wait for a free worker: the pool's and the transport's part."""
        return self.latency - self.busy - self.queued


def _sample(reply, submitted: float, now: float) -> Sample:
    assert reply.ok, reply.error
    return Sample(reply.latency_ms, reply.busy_ms, reply.queued_ms, reply.to_worker_ms, reply.returned_ms,
                  (now - submitted) * 1e3)  # fmt: skip


class Phase(NamedTuple):
    """One closed-loop phase: what it did, and where a worker's time went."""

    workers: int
    rate: float  # requests/s
    busy_ms: float  # mean in-worker (wall) time per request
    on_cpu_ms: float  # the workers' CPU time per request
    waiting_ms: float  # the workers' time runnable but waiting for a CPU, per request
    client_cores: float  # this process's CPU (the client and its loop) in cores

    @property
    def utilisation(self) -> float:
        """The workers' busy share of their time."""
        return self.rate * self.busy_ms / 1e3 / self.workers


def closed_loop(pool, data, seconds, in_flight) -> Phase:
    for _ in range(in_flight):
        pool.submit([P], [data])
    pids = pool.worker_pids()
    done, busy, t0, cpu0, sched0 = 0, [], time.monotonic(), time.process_time(), _schedstat_s(pids)
    while time.monotonic() - t0 < seconds:
        for reply in pool.poll(1.0):
            assert reply.ok, reply.error
            busy.append(reply.busy_ms)
            reply.release()
            done += 1
            pool.submit([P], [data])
    elapsed, cpu = time.monotonic() - t0, time.process_time() - cpu0
    on_cpu, waiting = (b - a for a, b in zip(sched0, _schedstat_s(pids), strict=True))
    while pool.stats().in_flight:
        for reply in pool.poll(1.0):
            reply.release()
    per_request = 1e3 / max(1, done)
    return Phase(len(pids), done / elapsed, statistics.fmean(busy), on_cpu * per_request, waiting * per_request,
                 cpu / elapsed)  # fmt: skip


def _schedstat_ns(path: str) -> tuple[int, int]:
    """A task's ns so far on a CPU and runnable waiting for one (/proc/.../schedstat)."""
    with open(path) as f:
        ran, waited, _ = f.read().split()
    return int(ran), int(waited)


def _schedstat_s(pids: list[int]) -> tuple[float, float]:
    """Seconds so far on a CPU and runnable waiting for one, summed over single-threaded processes."""
    stats = [_schedstat_ns(f"/proc/{pid}/schedstat") for pid in pids]
    return sum(ran for ran, _ in stats) / 1e9, sum(waited for _, waited in stats) / 1e9


def scaling(pools: dict, data, seconds: float, rounds: int) -> dict:
    """{workers: pool} -> {workers: [Phase per phase]}, the phases alternating between the pools."""
    for workers, pool in pools.items():
        closed_loop(pool, data, 1.0, 2 * workers)  # warm-up
    phases: dict = {workers: [] for workers in pools}
    for _ in range(rounds):
        for workers, pool in pools.items():
            phases[workers].append(closed_loop(pool, data, seconds / rounds, 2 * workers))
    return phases


def thinking_callers(pool, data, seconds, callers, think_s, seed=1, on_fd=False):
    """`callers` callers, each with one request in flight: submit, wait for its reply, pause for an
    exponential time of mean `think_s`, again (the loop waits in pool.poll; with `on_fd`, as an
    event loop would, in select on pool.fileno() and then calls poll(0): the wait is then the
    loop's own). Returns (samples, client CPU ms per reply, process CPU ms per reply, elapsed s):
    the client CPU is what this thread spent inside submit, poll and release, plus libzmq's I/O
    thread; the process CPU adds this benchmark's own bookkeeping around the calls."""
    rng = random.Random(seed)
    fd = pool.fileno()
    t0 = time.monotonic()
    next_at = [t0 + rng.expovariate(1 / think_s) for _ in range(callers)]  # None while in flight
    caller_of, samples = {}, []
    cpu0, io0, inside = time.process_time(), _zmq_io_cpu_s(), 0.0
    while time.monotonic() - t0 < seconds or caller_of:
        now = time.monotonic()
        for c, at in enumerate(next_at):
            if at is not None and at <= now and now - t0 < seconds:
                submitted, c0 = time.monotonic(), time.thread_time()
                rid = pool.submit([P], [data])
                inside += time.thread_time() - c0
                caller_of[rid] = (c, submitted)
                next_at[c] = None
        soonest = min((at for at in next_at if at is not None), default=now + 0.05)
        wait = max(0.0, min(soonest - time.monotonic(), 0.05))
        if on_fd:
            select.select([fd], [], [], wait)
            wait = 0.0
        c0 = time.thread_time()
        got = pool.poll(wait)
        inside += time.thread_time() - c0
        now = time.monotonic()
        for reply in got:
            c, submitted = caller_of.pop(reply.request_id)
            samples.append(_sample(reply, submitted, now))
            c0 = time.thread_time()
            reply.release()
            inside += time.thread_time() - c0
            next_at[c] = now + rng.expovariate(1 / think_s)
    n = max(1, len(samples))
    client = (inside + _zmq_io_cpu_s() - io0) / n * 1e3
    return samples, client, (time.process_time() - cpu0) / n * 1e3, time.monotonic() - t0


def open_loop(pool, data, seconds, rate, paced=False, seed=1):
    rng = random.Random(seed)
    samples, t0 = [], time.monotonic()
    next_at = t0
    cpu0 = time.process_time()
    sent = {}
    while time.monotonic() - t0 < seconds or pool.stats().in_flight:
        now = time.monotonic()
        while next_at <= now and now - t0 < seconds:
            sent[pool.submit([P], [data])] = time.monotonic()
            next_at += 1 / rate if paced else rng.expovariate(rate)
        wait = max(0.0, min(next_at - time.monotonic(), 0.05)) if now - t0 < seconds else 0.05
        got = pool.poll(wait)
        now = time.monotonic()
        for reply in got:
            samples.append(_sample(reply, sent.pop(reply.request_id), now))
            reply.release()
    cpu = time.process_time() - cpu0
    return samples, cpu / max(1, len(samples)) * 1e3


def _zmq_io_cpu_s() -> float:
    """CPU seconds so far of this process's libzmq I/O threads (from /proc schedstat)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith("ZMQbg/IO"):
                    continue
            total += _schedstat_ns(f"/proc/self/task/{tid}/schedstat")[0]
        except OSError:  # a thread that just ended
            continue
    return total / 1e9


def busy_loop(pool, data, seconds, rate, sweep_bytes=0, step_s=0.001, seed=1):
    """An embedding loop that never sleeps: its own work, then submit what arrived, poll(0), release.

    The loop's own work takes `step_s` per turn; with `sweep_bytes` it first copies that many bytes
    (more than a core's L2 here), so that each turn's pool calls find the caches holding other data,
    as after a scheduler's decode step. Returns (CPU per request in the turns that submitted or
    received something, of which libzmq's I/O thread, median CPU of a turn that found nothing,
    turns that found nothing per request), in ms; libzmq's thread is per request.
    """
    rng = random.Random(seed)
    source = np.ones(sweep_bytes, np.uint8) if sweep_bytes else None
    target = np.empty_like(source) if sweep_bytes else None
    active, empty, replies = 0.0, [], 0
    io0 = _zmq_io_cpu_s()
    t0 = time.monotonic()
    next_at = t0
    while time.monotonic() - t0 < seconds or pool.stats().in_flight:
        until = time.perf_counter() + step_s
        if sweep_bytes:
            np.copyto(target, source)
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
    per_request = max(1, replies)
    return (active / per_request + io) * 1e3, io * 1e3, percentile(empty, 0.5) * 1e3, len(empty) / per_request


def sleep_cost(n: int = 500) -> tuple[float, float]:
    """This thread's CPU per timed sleep, in us: time.sleep(0), and a 2 ms poll(2) on a socket
    nothing writes to. Both arm a timer and wake from it: what any wait with a timeout costs here
    before the code around it does anything (on a KVM guest each timer costs exits)."""
    quiet, other = socket.socketpair()
    waiting = select.poll()
    waiting.register(quiet.fileno(), select.POLLIN)
    try:
        costs = []
        for sleep in (lambda: time.sleep(0), lambda: waiting.poll(2)):
            c0 = time.thread_time()
            for _ in range(n):
                sleep()
            costs.append((time.thread_time() - c0) / n * 1e6)
        return costs[0], costs[1]
    finally:
        quiet.close()
        other.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--worker-sched",
        choices=("auto", "idle", "normal"),
        default="idle",
        help="the pools' worker_sched (default idle: this benchmark's loop sleeps between events)",
    )
    parser.add_argument("--worker-nice", type=int, default=None, help="override the pool's worker_nice")
    args = parser.parse_args()
    from mmworker.runtime import reexec_tuned

    reexec_tuned()
    steal0, started = cpu_steal_s(), time.monotonic()
    spec = {**named_spec("qwen2_vl"), "max_pixels": 1003520}
    data = encode(photo_like(1280, 720, seed=1), "JPEG")
    overrides = {"worker_sched": args.worker_sched, "worker_nice": args.worker_nice}
    # No feature cache: the same image goes again and again, and the workers' path is what is measured
    # (bench_cache measures the cache).
    base = {"ring_mib": 256, "cache_mib": 0, **{key: value for key, value in overrides.items() if value is not None}}
    # A loop that sleeps between events, as this one does, is what SCHED_IDLE workers suit; "auto" would
    # pick "normal" here (2 workers on 2 cores: no CPU without a worker), for loops that spin.
    config = PoolConfig.from_any({**base, "workers": 2})
    sched = config.plan().worker_sched
    how = f"worker_sched {config.worker_sched}" + (f" -> {sched}" if sched != config.worker_sched else "")
    how += f", nice {config.worker_nice}" if sched == "normal" else ""

    with WorkerPool(spec, {**base, "workers": 1}) as one, WorkerPool(spec, {**base, "workers": 2}) as two:
        phases = scaling({1: one, 2: two}, data, 2 * args.seconds, SCALING_ROUNDS)
    throughput = {workers: statistics.median(p.rate for p in runs) for workers, runs in phases.items()}
    scale = throughput[2] / throughput[1]
    print(f"closed loop, 720p JPEG, 1 image/request, 2 requests in flight per worker; workers: {how}")
    for workers, runs in phases.items():
        rates = " ".join(f"{p.rate:.1f}" for p in runs)
        busy, on_cpu, waiting, used, client = (
            statistics.median(getattr(p, f) for p in runs)
            for f in ("busy_ms", "on_cpu_ms", "waiting_ms", "utilisation", "client_cores")
        )
        print(f"  {workers} worker(s): {throughput[workers]:7.1f} requests/s (median of alternating phases: {rates})\n"
              f"    per image in the worker {busy:.2f} ms (on a CPU {on_cpu:.2f}, waiting for one {waiting:.2f}); "
              f"workers busy {used:.1%} of the time; client {client:.2f} cores")  # fmt: skip
    print(f"  2 workers / 1 worker: {scale:.2f}x (about 2 x busy share, 2 workers / 1 x time per image, 1 worker / 2; "
          "a worker waits for a CPU while the client runs on its core)")  # fmt: skip

    service_s = 2 / throughput[2]  # one request on one worker, as the closed loop saw it
    think_s = service_s * (1 / LOAD - 1)
    with WorkerPool(spec, {**base, "workers": 2}) as pool:
        in_place = pool.stats().workers_reading_in_place
        closed_loop(pool, data, 1.0, 4)
        samples, cpu_ms, process_cpu_ms, elapsed = thinking_callers(pool, data, args.seconds, 2, think_s)
        fd_samples, fd_cpu_ms, _, _ = thinking_callers(pool, data, args.seconds, 2, think_s, on_fd=True)
    busy_share = sum(s.busy for s in samples) / 1e3 / (2 * elapsed)
    over = [s.overhead for s in samples]
    lat50, lat99 = (percentile((s.latency for s in samples), q) for q in (0.5, 0.99))
    over50, over99 = percentile(over, 0.5), percentile(over, 0.99)
    print(
        f"\nclosed loop at {LOAD:.0%} load: 2 callers, one request in flight each, pausing {think_s * 1e3:.1f} ms "
        f"on average between a reply and the next request; the workers were busy {busy_share:.0%} of the time; "
        f"{in_place} of 2 read their inputs in place (ipc.peer_memory), the rest get them copied"
    )
    print(f"  {len(samples)} replies: latency p50 {lat50:.2f} / p99 {lat99:.2f} ms; overhead (latency - in-worker "
          f"time) p50 {over50:.2f} / p99 {over99:.2f} ms; client CPU {cpu_ms:.3f} ms per request (in submit, "
          f"poll, release and libzmq's I/O thread; the whole process, this loop's bookkeeping included: "
          f"{process_cpu_ms:.3f} ms)")  # fmt: skip
    fd_over = [s.overhead for s in fd_samples]
    print(f"  the same, the loop sleeping in select on pool.fileno() and calling poll(0), no verdict: "
          f"{len(fd_samples)} replies, overhead p50 {percentile(fd_over, 0.5):.2f} / p99 "
          f"{percentile(fd_over, 0.99):.2f} ms, client CPU {fd_cpu_ms:.3f} ms per request")  # fmt: skip
    verdicts = [
        (f"2 workers >= 1.8x 1 worker: {scale:.2f}x", scale >= 1.8),
        (f"overhead p50 <= 0.5 ms (closed loop, 70% load): {over50:.2f} ms", over50 <= 0.5),
        (f"overhead p99 <= 2 ms (closed loop, 70% load): {over99:.2f} ms", over99 <= 2.0),
        (f"client CPU per accepted request <= 0.2 ms (closed loop, 70% load, inside the pool's calls incl. "
         f"libzmq's thread): {cpu_ms:.3f} ms", cpu_ms <= 0.2),
    ]  # fmt: skip

    rate = LOAD * throughput[2]
    results = {}
    for ordered, paced in ((True, False), (False, False), (True, True)):
        with WorkerPool(spec, {**base, "workers": 2, "ordered": ordered}) as pool:
            closed_loop(pool, data, 1.0, 4)
            results[ordered, paced] = open_loop(pool, data, args.seconds, rate, paced)
    print(
        f"\nopen loop at {LOAD:.0%} load ({rate:.1f} requests/s), 2 workers, no verdict: requests may also wait "
        "for a free worker"
    )
    print(f"  {'':<18} {'latency p50':>12} {'p99':>8} {'overhead p50':>13} {'p99':>8} "
          f"{'excl. queue p50':>16} {'p99':>8} {'delivered p50':>14} {'p99':>8} {'client CPU/req':>15}")  # fmt: skip
    parts = {"closed loop, 70%": samples}
    for (ordered, paced), (rows, row_cpu_ms) in results.items():
        name = ("ordered" if ordered else "unordered") + (", paced" if paced else ", Poisson")
        parts[name] = rows
        cells = []
        for values in ([s.latency for s in rows], [s.overhead for s in rows], [s.own_overhead for s in rows],
                       [s.delivered for s in rows]):  # fmt: skip
            cells += [percentile(values, 0.5), percentile(values, 0.99)]
        widths = [10, 6, 11, 6, 14, 6, 12, 6]
        row = " ".join(f"{v:{w}.2f}ms" for v, w in zip(cells, widths, strict=True))
        print(f"  {name:<18} {row} {row_cpu_ms:13.3f}ms")

    work_ms = percentile((s.busy for s in samples), 0.5)
    cores = sorted(os.sched_getaffinity(0))[:2]
    floors = {}
    for transport in TRANSPORTS:
        name = f"floor: {transport}"
        to_worker, back, floor_cpu = zmq_floor(data, work_ms, rate, args.seconds, cores, config.worker_nice, sched,
                                               transport)  # fmt: skip
        floors[name] = (to_worker, back)
        floor = [a + b for a, b in zip(to_worker, back, strict=True)]
        print(f"  {name:<18} {'':>33} {percentile(floor, 0.5):14.2f}ms {percentile(floor, 0.99):6.2f}ms "
              f"{'':>32} {floor_cpu:13.3f}ms")  # fmt: skip
    print(
        f"  (floors: open loop, Poisson, same load, {work_ms:.1f} ms jobs, no pool logic; pool: inputs in place, jobs "
        "on each worker's SOCK_SEQPACKET pair, replies on a shared one; zmq jobs: inputs copied, jobs through "
        "ZeroMQ; all zmq)"
    )
    print("\noverhead excluding the wait for a worker, in its two parts, p50 / p99 (ms): to the worker = "
          "handed over -> the worker began; back = the worker finished -> the reply is ready "
          "(floors: received)")  # fmt: skip
    split = {name: ([s.to_worker for s in rows], [s.back for s in rows]) for name, rows in parts.items()}
    for name, (to_worker, back) in {**split, **floors}.items():
        print(f"  {name:<18} to the worker {percentile(to_worker, 0.5):5.2f} / {percentile(to_worker, 0.99):5.2f}"
              f"    back {percentile(back, 0.5):5.2f} / {percentile(back, 0.99):5.2f}")  # fmt: skip

    # The embedding loop on a core of its own (reserved_cores, as a deployment keeps the scheduler's)
    # and one worker on the other: a loop that never sleeps would otherwise starve a worker sharing its core.
    busy_config = {**base, "workers": 1, "reserved_cores": 1}
    with WorkerPool(spec, busy_config) as pool:
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, set(pool.plan.reserved))
        try:
            closed_loop(pool, data, 1.0, 2)
            busy = {
                sweep: busy_loop(pool, data, args.seconds, LOAD * throughput[1], sweep) for sweep in (0, SWEEP_BYTES)
            }
        finally:
            os.sched_setaffinity(0, allowed)
    print(
        "\nbusy embedding loop (never sleeps; its own work ~1 ms per turn, then poll(0)), pinned to a reserved core, "
        f"1 worker ({pool.plan.worker_sched}) on the other at 70% load, Poisson, no verdict:"
    )
    for sweep, (busy_cpu, busy_io, empty_poll, empty_turns) in busy.items():
        how = f"its work sweeps {sweep >> 20} MB per turn (caches cold)" if sweep else "its work leaves the caches warm"
        print(
            f"  {how}: client CPU per request {busy_cpu:.3f} ms (of which libzmq's I/O thread {busy_io:.3f} ms), "
            f"plus {empty_poll * 1e3:.1f} us per poll(0) that finds nothing ({empty_turns:.1f} per request)"
        )
    sleep_us, wait_us = sleep_cost()
    print(f"\none sleep with a timeout on this machine, no verdict: time.sleep(0) {sleep_us:.1f} us of CPU, "
          f"poll(2) for 2 ms on an idle socket {wait_us:.1f} us (the loops above sleep ~2x per request)")  # fmt: skip
    steal = (cpu_steal_s() - steal0) / (os.cpu_count() * (time.monotonic() - started))  # /proc/stat sums all CPUs
    print(f"\nthe host took {steal:.1%} of this VM's CPU time during the run (steal; ~0 on a quiet host)")
    print()
    for text, ok in verdicts:
        print(f"target {text} {'PASS' if ok else 'MISS'}")
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
