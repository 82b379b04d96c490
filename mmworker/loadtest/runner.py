"""Driving a pool with a workload: closed or open loop, warm-up, live progress, the tally of answers,
and stopping early on Ctrl-C.

Closed loop keeps `concurrency` requests in flight; open loop submits at Poisson arrivals of
`rate` per second whatever the pool does (so queueing shows). Requests submitted during the first
`warmup_s` seconds are answered and checked like the others but counted apart and left out of the
figures. For `verify` sampled accepted requests a digest of everything the reply carried (ids,
offsets, placeholder runs, positions, features, aux tensors, hashes, modalities) is kept, to be
recomputed in process afterwards. Only the
requests in flight are known one by one; an answer goes into the tally (mmworker.loadtest.tally)
and is forgotten. A request's sources are made when it is submitted (`Workload.acquire`) and
given up when it is answered. The pool's cache counters are read when the first measured request
is submitted (`RunResult.cache_from`), so that the report's hit rate leaves the warm-up out.

Ctrl-C (SIGINT) is a request to stop, not an exception (`Interrupt`): an exception could strike in
the middle of the pool's bookkeeping, and the run's figures are worth keeping. The loop stops
submitting, waits a little for the requests in flight (a second Ctrl-C stops the wait) and ends
the run as if it had been this short; what was still in flight is counted as abandoned, not lost.
"""

import collections
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from blake3 import blake3

from mmworker.loadtest.tally import Tally, reservoir_slot
from mmworker.loadtest.workload import RequestSpec, Workload
from mmworker.pipeline import IMAGE
from mmworker.pool import PoolStats, Reply, WorkerPool

# After Ctrl-C, how long the run waits for the requests in flight before it abandons them.
DRAIN_S = 3.0


class Interrupt:
    """SIGINT (Ctrl-C) turned into a flag the load test polls, while the context is entered.

    A process that started with SIGINT ignored (a background job of a shell without job control,
    `nohup`) keeps ignoring it, as such a process should. `count` is how many arrived: the first
    asks the run to stop, the second to stop waiting for anything.
    """

    def __init__(self) -> None:
        self.count = 0
        self._previous = None

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1

    @property
    def requested(self) -> bool:
        return self.count > 0

    @property
    def hurried(self) -> bool:
        return self.count > 1

    def __enter__(self) -> "Interrupt":
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


@dataclass
class RunResult:
    tally: Tally
    started: float
    ended: float
    measured_from: float
    interrupted: bool = False
    verify: dict[int, str] = field(default_factory=dict)  # request index -> reply digest
    duplicates: int = 0
    cpu_s: float = 0.0
    worker_cpu_s: dict[int, float] = field(default_factory=dict)
    rss: list[tuple[float, float, float]] = field(default_factory=list)  # (s, client MB, workers MB), private
    kills: int = 0
    specs: dict[int, RequestSpec] = field(default_factory=dict)  # the verified requests' specs
    inline_specs: list[RequestSpec] = field(default_factory=list)  # good requests kept for --compare-inline
    cache_from: PoolStats | None = None  # the pool's stats when the first measured request was submitted


def digest_parts(input_ids, offsets, positions, delta, items, runs=(), corrupt: bool = False) -> str:
    """blake3 over everything a result carries, in a fixed order (features byte for byte).

    Takes the parts rather than a Reply so that a pool reply and an in-process driver Output
    digest the same way. A request with a video also has its items' placeholder runs and
    modalities digested; an image-only request's digest is what it was before videos (an image's
    one run is its offsets). Integer aux tensors are digested as int64, others (Qwen2.5-VL's
    float32 `second_per_grid_ts`) as their own bytes and dtype. `corrupt` is a test hook: the
    digest a transport that flipped one byte of the last feature (the video's, in a request with
    one) would produce.
    """
    h = blake3(max_threads=1)
    h.update(np.ascontiguousarray(input_ids, dtype=np.int64).tobytes())
    h.update(repr([(int(s), int(e)) for s, e in offsets]).encode())
    if any(item.modality != IMAGE for item in items):
        h.update(repr([item.modality for item in items]).encode())
        h.update(repr([[(int(s), int(e)) for s, e in item_runs] for item_runs in runs]).encode())
    if positions is not None:
        h.update(np.ascontiguousarray(positions, dtype=np.int64).tobytes())
        h.update(str(int(delta)).encode())
    for k, item in enumerate(items):
        feature = np.ascontiguousarray(item.feature)
        if corrupt and k == len(items) - 1:
            feature = feature.copy()
            feature.view(np.uint8).reshape(-1)[feature.nbytes // 2] ^= 0x01
        h.update(memoryview(feature).cast("B"))
        h.update(int(item.hash).to_bytes(8, "big"))
        for name in sorted(item.aux):
            aux = np.asarray(item.aux[name])
            if aux.dtype.kind in "iu":
                h.update(np.ascontiguousarray(aux, dtype=np.int64).tobytes())
            else:
                h.update(aux.dtype.str.encode())
                h.update(np.ascontiguousarray(aux).tobytes())
    return h.hexdigest()


def reply_digest(reply: Reply, corrupt: bool = False) -> str:
    return digest_parts(reply.input_ids, reply.offsets, reply.positions, reply.delta, reply.items, reply.runs,
                        corrupt)  # fmt: skip


def _private_mb(pid: int) -> float:
    """RssAnon: a process's private memory (the rings' shared pages would otherwise count in every
    process that maps them, and say nothing about leaks)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def _cpu_of(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


_CLK_TCK = os.sysconf("SC_CLK_TCK")
INLINE_KEEP = 2000  # good requests kept for --compare-inline (it runs at most 30 s of them)
RECENT_KEPT = 2000  # answers the live progress figures look at (those of the last 5 s)


class Progress:
    """Live figures: a rich display on a terminal, a line every few seconds otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = sys.stdout.isatty()
        self.last = 0.0
        self.live = None
        if enabled and self.tty:
            from rich.live import Live

            self.live = Live(refresh_per_second=4, transient=True)
            self.live.start()

    def update(self, now: float, run: "Runner") -> None:
        if not self.enabled or now - self.last < (0.25 if self.tty else 5.0):
            return
        self.last = now
        elapsed = now - run.started
        window = [entry[1:] for entry in run.recent if entry[0] > now - 5]
        lat = sorted(latency for latency, _, _, _ in window)
        p50 = lat[len(lat) // 2] if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
        span = min(5.0, max(elapsed, 1e-9))
        rate = len(window) / span
        images = sum(n for _, ok, n, _ in window if ok) / span
        videos = f"{sum(v for _, ok, _, v in window if ok) / span:6.1f} vid/s  " if run.workload.video_fraction else ""
        answered, rejected = run.tally.total("answered"), run.tally.total("rejected")
        text = (
            f"{elapsed:6.1f}s  answered {answered:6d}  {rate:7.1f} req/s  {images:7.1f} img/s  {videos}"
            f"p50 {p50:7.1f} ms  p99 {p99:7.1f} ms  rejects {rejected:5d}  in flight {run.in_flight:4d}"
        )
        if self.live is not None:
            self.live.update(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        """Stop the display (idempotent): nothing more is shown after this."""
        self.enabled = False
        if self.live is not None:
            self.live.stop()
            self.live = None


class Runner:
    def __init__(self, pool: WorkerPool, workload: Workload, *, verify: int, seed: int, corrupt_sample: bool) -> None:
        self.pool, self.workload = pool, workload
        # Requests in flight: request id (the workload numbers them 0, 1, ...) -> (spec, submitted in warm-up).
        self.flight: dict[int, tuple[RequestSpec, bool]] = {}
        self.tally = Tally(seed)
        # (answered at, latency ms, accepted, images, videos) of the latest answers
        self.recent: collections.deque[tuple[float, float, bool, int, int]] = collections.deque(maxlen=RECENT_KEPT)
        self.verify_k = verify
        self.sample: list[tuple[int, str]] = []  # (request index, digest): a uniform sample of accepted replies
        self.sample_specs: dict[int, RequestSpec] = {}
        self.inline_specs: list[RequestSpec] = []
        self.rng = random.Random(seed)
        self.corrupt_sample = corrupt_sample
        self.duplicates = 0
        self.started = 0.0
        self.cache_from: PoolStats | None = None

    def _submit(self, spec: RequestSpec, now: float, warmup: bool) -> None:
        if spec.index != self.tally.total("submitted"):
            raise RuntimeError(f"loadtest: request {spec.index} submitted out of sequence")
        if not warmup and self.cache_from is None:
            self.cache_from = self.pool.stats()
        sources = self.workload.acquire(spec)
        videos = self.workload.video_sources(spec)
        self.flight[spec.index] = (spec, warmup)
        good = spec.expected is None
        self.tally.submit(warmup, spec.images if good else 0, spec.repeats, len(videos), len(videos) if good else 0)
        self.pool.submit(spec.input_ids, sources, videos=videos, request_id=spec.index)

    @property
    def in_flight(self) -> int:
        return len(self.flight)

    def _on_reply(self, reply: Reply, now: float) -> None:
        entry = self.flight.pop(reply.request_id, None)
        if entry is None:  # answered before (or never asked)
            self.duplicates += 1
            reply.release()
            return
        spec, warmup = entry
        self.workload.release(spec, reply.ok)
        self.tally.add(kind=spec.kind, expected=spec.expected, images=spec.images, warmup=warmup,
                       outcome=reply.kind, error=reply.error, answered_s=now - self.started,
                       latency_ms=reply.latency_ms,
                       parts_ms=(reply.queued_ms, reply.to_worker_ms, reply.busy_ms, reply.returned_ms),
                       worker=reply.worker, cache_hits=reply.cache_hits, videos=len(spec.videos))  # fmt: skip
        if not warmup:
            self.recent.append((now, reply.latency_ms, reply.ok, spec.images, len(spec.videos)))
        if reply.ok:
            if spec.kind == "good" and len(self.inline_specs) < INLINE_KEEP:
                self.inline_specs.append(spec)
            # Every accepted request has the same chance to be verified.
            slot = reservoir_slot(self.rng, self.verify_k, self.tally.total("accepted"))
            if slot < self.verify_k:
                sampled = (spec.index, reply_digest(reply, corrupt=self.corrupt_sample))
                if slot < len(self.sample):
                    self.sample_specs.pop(self.sample[slot][0], None)
                    self.sample[slot] = sampled
                else:
                    self.sample.append(sampled)
                self.sample_specs[spec.index] = spec
            reply.release()

    def run(self, *, concurrency: int | None, rate: float | None, duration: float | None, requests: int | None,
            warmup_s: float, progress: bool, kill_every: float | None = None,
            interrupt: Interrupt | None = None) -> RunResult:  # fmt: skip
        """Drive the pool until `requests` were submitted after the warm-up, or `duration` seconds
        passed after it, and every request was answered; or, once `interrupt` is requested, until
        the requests in flight are answered, DRAIN_S passed, or it is requested again."""
        interrupt = interrupt or Interrupt()
        stream = iter(self.workload)
        cpu0 = time.process_time()
        # Worker CPU per slot, summed over restarts: (slot, CPU at first sight, CPU at last sight) per pid.
        seen: dict[int, list] = {pid: [k, _cpu_of(pid), 0.0] for k, pid in enumerate(self.pool.worker_pids())}
        self.started = time.monotonic()
        measured_from = self.started + warmup_s
        display = Progress(progress)
        arrivals = random.Random(7)
        next_arrival = self.started
        rss: list[tuple[float, float, float]] = []
        next_sample = self.started
        next_kill = self.started + warmup_s + kill_every if kill_every else float("inf")
        kills = 0
        chaos = random.Random(11)
        drain_until: float | None = None  # once interrupted: when to stop waiting for the requests in flight

        def more() -> bool:
            if interrupt.requested:
                return False
            now = time.monotonic()
            if requests is not None:  # measured requests: the warm-up's come on top
                return now < measured_from or self.tally.measured.submitted < requests
            return now < measured_from + (duration or 0.0)

        try:
            while True:
                now = time.monotonic()
                if interrupt.requested and drain_until is None:
                    drain_until = now + DRAIN_S
                    if self.in_flight:
                        display.close()
                        print(f"mmworker: interrupted: waiting up to {DRAIN_S:g} s for {self.in_flight} request(s) "
                              "in flight (Ctrl-C again to stop now)", file=sys.stderr, flush=True)  # fmt: skip
                if drain_until is not None and (interrupt.hurried or now >= drain_until):
                    break
                if more():
                    if rate is None:
                        while self.in_flight < (concurrency or 1) and more():
                            self._submit(next(stream), now, now < measured_from)
                    else:
                        while next_arrival <= now and more():
                            self._submit(next(stream), now, now < measured_from)
                            next_arrival += arrivals.expovariate(rate)
                elif self.in_flight == 0:
                    break
                wait = 0.05 if rate is None else max(0.0, min(next_arrival - time.monotonic(), 0.05))
                for reply in self.pool.poll(wait):
                    self._on_reply(reply, time.monotonic())
                now = time.monotonic()
                display.update(now, self)
                if now >= next_sample:  # memory and CPU of the whole pool, once a second
                    pids = self.pool.worker_pids()
                    for k, pid in enumerate(pids):
                        seen.setdefault(pid, [k, 0.0, 0.0])[2] = _cpu_of(pid)
                    rss.append((now - self.started, _private_mb(os.getpid()), sum(_private_mb(p) for p in pids)))
                    next_sample = now + 1.0
                if now >= next_kill and more():  # chaos: a worker dies, the pool must absorb it
                    os.kill(chaos.choice(self.pool.worker_pids()), 9)
                    kills += 1
                    next_kill = now + kill_every
        finally:
            display.close()
        ended = time.monotonic()
        for spec, warmup in self.flight.values():  # only when interrupted: stopped waiting for them
            self.tally.abandon(
                warmup, len(spec.videos)
            )  # (their files stay: the pool may still read them; the scratch goes at the end)
        for k, pid in enumerate(self.pool.worker_pids()):
            seen.setdefault(pid, [k, 0.0, 0.0])[2] = _cpu_of(pid)
        wcpu: dict[int, float] = {}
        for slot, first, last in seen.values():
            wcpu[slot] = wcpu.get(slot, 0.0) + max(0.0, last - first)
        return RunResult(self.tally, self.started, ended, measured_from, interrupt.requested, dict(self.sample),
                         self.duplicates, time.process_time() - cpu0, wcpu, rss, kills, dict(self.sample_specs),
                         list(self.inline_specs), self.cache_from)  # fmt: skip
