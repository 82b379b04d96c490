"""Driving a pool with a workload: closed or open loop, warm-up, live progress, one record per request.

Closed loop keeps `concurrency` requests in flight; open loop submits at Poisson arrivals of
`rate` per second whatever the pool does (so queueing shows). Requests submitted during the first
`warmup_s` seconds are answered and checked like the others but left out of the figures. For
`verify` sampled accepted requests a digest of everything the reply carried (ids, offsets,
positions, features, hashes) is kept, to be recomputed in process afterwards.
"""

import os
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from blake3 import blake3

from mmworker.loadtest.workload import EXPECTED_ERROR, RequestSpec, Workload
from mmworker.pool import Reply, WorkerPool


@dataclass(slots=True)
class Record:
    """One request's outcome. Its spec (prompt and sources) is dropped once answered, unless kept
    for verification or the inline comparison; what stays (~300 bytes with slots) is what the
    percentiles need, so a 10-minute soak's client grows by a few MB of these, not by its traffic."""

    spec: RequestSpec | None
    index: int
    kind: str
    images: int
    answered: float = 0.0
    ok: bool = False
    error: str | None = None
    latency_ms: float = 0.0
    parts_ms: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # see report.LATENCY_PARTS
    worker: int | None = None
    warmup: bool = False
    answers: int = 0

    @property
    def expected_error(self) -> str | None:
        return EXPECTED_ERROR.get(self.kind)


@dataclass
class RunResult:
    records: list[Record]
    started: float
    ended: float
    measured_from: float
    verify: dict[int, str] = field(default_factory=dict)  # request index -> reply digest
    duplicates: int = 0
    cpu_s: float = 0.0
    worker_cpu_s: dict[int, float] = field(default_factory=dict)
    rss: list[tuple[float, float, float]] = field(default_factory=list)  # (s, client MB, workers MB), private
    kills: int = 0
    specs: dict[int, RequestSpec] = field(default_factory=dict)  # the verified requests' specs
    inline_specs: list[RequestSpec] = field(default_factory=list)  # good requests kept for --compare-inline


def digest_parts(input_ids, offsets, positions, delta, items, corrupt: bool = False) -> str:
    """blake3 over everything a result carries, in a fixed order (features byte for byte).

    Takes the parts rather than a Reply so that a pool reply and an in-process driver Output
    digest the same way. `corrupt` is a test hook: the digest a transport that flipped one byte
    of the first feature would produce.
    """
    h = blake3(max_threads=1)
    h.update(np.ascontiguousarray(input_ids, dtype=np.int64).tobytes())
    h.update(repr([(int(s), int(e)) for s, e in offsets]).encode())
    if positions is not None:
        h.update(np.ascontiguousarray(positions, dtype=np.int64).tobytes())
        h.update(str(int(delta)).encode())
    for k, item in enumerate(items):
        feature = np.ascontiguousarray(item.feature)
        if corrupt and k == 0:
            feature = feature.copy()
            feature.view(np.uint8).reshape(-1)[feature.nbytes // 2] ^= 0x01
        h.update(memoryview(feature).cast("B"))
        h.update(int(item.hash).to_bytes(8, "big"))
        for name in sorted(item.aux):
            h.update(np.ascontiguousarray(item.aux[name], dtype=np.int64).tobytes())
    return h.hexdigest()


def reply_digest(reply: Reply, corrupt: bool = False) -> str:
    return digest_parts(reply.input_ids, reply.offsets, reply.positions, reply.delta, reply.items, corrupt)


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
        window = [r for r in run.records[-2000:] if r.answers and not r.warmup and r.answered > now - 5]
        lat = sorted(r.latency_ms for r in window)
        p50 = lat[len(lat) // 2] if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
        rate = len(window) / min(5.0, max(elapsed, 1e-9))
        images = sum(r.images for r in window if r.ok) / min(5.0, max(elapsed, 1e-9))
        text = (
            f"{elapsed:6.1f}s  answered {run.answered:6d}  {rate:7.1f} req/s  {images:7.1f} img/s  "
            f"p50 {p50:7.1f} ms  p99 {p99:7.1f} ms  rejects {run.rejected:5d}  in flight {run.in_flight:4d}"
        )
        if self.live is not None:
            self.live.update(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


class Runner:
    def __init__(self, pool: WorkerPool, workload: Workload, *, verify: int, seed: int, corrupt_sample: bool) -> None:
        self.pool, self.workload = pool, workload
        self.records: list[Record] = []  # request id = index into it (the workload numbers them 0, 1, ...)
        self.answered = 0
        self.rejected = 0
        self.in_flight = 0
        self.verify_k = verify
        self.sample: list[tuple[int, str]] = []  # (request index, digest): a uniform sample of accepted replies
        self.sample_specs: dict[int, RequestSpec] = {}
        self.inline_specs: list[RequestSpec] = []
        self.rng = random.Random(seed)
        self.accepted_seen = 0
        self.corrupt_sample = corrupt_sample
        self.duplicates = 0
        self.started = 0.0

    def _submit(self, spec: RequestSpec, now: float, warmup: bool) -> None:
        if spec.index != len(self.records):
            raise RuntimeError(f"loadtest: request {spec.index} submitted out of sequence")
        self.records.append(Record(spec, spec.index, spec.kind, spec.images, warmup=warmup))
        self.pool.submit(spec.input_ids, spec.sources, request_id=spec.index)
        self.in_flight += 1

    def _on_reply(self, reply: Reply, now: float) -> None:
        rid = reply.request_id
        record = self.records[rid] if isinstance(rid, int) and 0 <= rid < len(self.records) else None
        if record is None or record.answers:
            self.duplicates += 1
            reply.release()
            return
        record.answers += 1
        record.answered, record.ok, record.error = now, reply.ok, reply.error
        record.latency_ms, record.worker = reply.latency_ms, reply.worker
        record.parts_ms = (reply.queued_ms, reply.to_worker_ms, reply.busy_ms, reply.returned_ms)
        self.answered += 1
        self.rejected += not reply.ok
        self.in_flight -= 1
        spec, record.spec = record.spec, None
        if reply.ok:
            if record.kind == "good" and len(self.inline_specs) < INLINE_KEEP:
                self.inline_specs.append(spec)
            # Reservoir sampling: every accepted request has the same chance to be verified.
            self.accepted_seen += 1
            slot = len(self.sample) if len(self.sample) < self.verify_k else self.rng.randrange(self.accepted_seen)
            if slot < self.verify_k:
                entry = (record.index, reply_digest(reply, corrupt=self.corrupt_sample))
                if slot < len(self.sample):
                    self.sample_specs.pop(self.sample[slot][0], None)
                    self.sample[slot] = entry
                else:
                    self.sample.append(entry)
                self.sample_specs[record.index] = spec
            reply.release()

    def run(self, *, concurrency: int | None, rate: float | None, duration: float | None, requests: int | None,
            warmup_s: float, progress: bool, kill_every: float | None = None) -> RunResult:  # fmt: skip
        stream = iter(self.workload)
        cpu0 = time.process_time()
        # Worker CPU per slot, summed over restarts: (slot, CPU at first sight, CPU at last sight) per pid.
        seen: dict[int, list] = {pid: [k, _cpu_of(pid), 0.0] for k, pid in enumerate(self.pool.worker_pids())}
        self.started = time.monotonic()
        measured_from = self.started + warmup_s
        display = Progress(progress)
        arrivals = random.Random(7)
        next_arrival = self.started
        submitted = 0
        rss: list[tuple[float, float, float]] = []
        next_sample = self.started
        next_kill = self.started + warmup_s + kill_every if kill_every else float("inf")
        kills = 0
        chaos = random.Random(11)

        def more() -> bool:
            now = time.monotonic()
            if requests is not None:
                return submitted < requests
            return now < self.started + warmup_s + (duration or 0.0)

        try:
            while True:
                now = time.monotonic()
                if more():
                    if rate is None:
                        while self.in_flight < (concurrency or 1) and more():
                            self._submit(next(stream), now, now < measured_from)
                            submitted += 1
                    else:
                        while next_arrival <= now and more():
                            self._submit(next(stream), now, now < measured_from)
                            submitted += 1
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
        for k, pid in enumerate(self.pool.worker_pids()):
            seen.setdefault(pid, [k, 0.0, 0.0])[2] = _cpu_of(pid)
        wcpu: dict[int, float] = {}
        for slot, first, last in seen.values():
            wcpu[slot] = wcpu.get(slot, 0.0) + max(0.0, last - first)
        return RunResult(self.records, self.started, ended, measured_from, dict(self.sample), self.duplicates,
                         time.process_time() - cpu0, wcpu, rss, kills, dict(self.sample_specs),
                         list(self.inline_specs))  # fmt: skip
