"""Benchmark of the pool's feature cache: throughput with half the images repeated, and all-hit reply latency.

qwen2_vl (HF default pixel budget), 2 workers per pool, the pool's configuration otherwise but for
replies delivered as they come (POOL).
1. A stream in which half the images repeat earlier ones: the load test's default mix (its
   built-in corpus, 1-4 images per request at 60/25/10/5%) as raw bytes, no bad requests, each
   image of a request repeating with probability 0.5 one of the last few images answered
   (mmworker.loadtest.workload, --repeat-fraction 0.5; every other image a distinct variant, so
   nothing repeats by accident). Two pools stay up side by side, cache on (--cache-mib, default
   512) and cache off, each fed its own copy of the stream (same seed); a closed loop with 2
   requests in flight per worker runs on one pool, then the other, for --seconds each, the order
   swapped every round (the machine's speed drifts over seconds). Per round: images/s of each
   side and their ratio; reported as the median over rounds with the range. Target: ratio >= 1.9
   (the ideal is ~2: half the images cost nothing). Beside it, no verdict: each side's CPU per
   image (its workers' and this process's: the work saved, whatever other processes take of the
   machine), and the cache side's hit rate (the pool's counters) against the share of repeats
   sent: when the cache keeps every image computed, each distinct image misses once and the hits
   are exactly the repeats.
2. Requests whose images are all cached (answered by the client, no worker): reply latency, wall
   time of the call as the caller sees it, one request at a time, p50 and p99, with the
   synchronous `process()` and with `await aprocess()` in an asyncio loop, taking turns round by
   round; for a 720p JPEG (the target: p50 <= 0.5 ms) and, no verdict, a 12 MP JPEG (the key is
   a hash of the bytes, so a larger file costs more) and four 720p JPEGs in one request. Beside
   it the process's CPU per call.
Machine load: the load average at the start and the end, the CPU time other processes took of the
allowed CPUs while measuring (their busy time less this process tree's), and the host's steal.

    .venv/bin/python bench/bench_cache.py [--rounds 8] [--seconds 5] [--calls 2000] [--cache-mib 512] [--json out.json]
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path

from yardstick import cpu_busy_s, cpu_steal_s, percentile, process_cpu_s

SPEC_NAME = "qwen2_vl"
MAX_PIXELS = 1003520
WORKERS = 2
IN_FLIGHT = 2 * WORKERS  # the load test's default closed loop
REPEAT_FRACTION = 0.5
TARGET_RATIO = 1.9
# Replies as they come: with submission order kept (the pool's default, for poll), an all-hit reply
# would wait behind the request submitted before it and hold its place in the closed loop, leaving
# a worker without a job; aprocess, as a server's asyncio path uses it, never waits so.
POOL = {"workers": WORKERS, "ordered": False}
TARGET_HIT_P50_MS = 0.5


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def spread(values: list[float], digits: int = 2) -> str:
    """'median (min-max)'."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process and every live descendant (the pools' workers and I/O
    processes)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError):
                pass
    ours, grew = {os.getpid()}, True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in ours} - ours
        ours |= found
        grew = bool(found)
    total = 0.0
    for pid in ours:
        with suppress(FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            total += process_cpu_s(pid)
    return total


class Usage:
    """What other processes took of the allowed CPUs while we measured: their busy time less this
    process tree's CPU, summed over the `measuring()` blocks (each inside a pool's life, so that
    its workers are counted at both ends)."""

    def __init__(self) -> None:
        self.cpus = sorted(os.sched_getaffinity(0))
        self.others_s = self.seconds = 0.0

    @contextmanager
    def measuring(self):
        busy0, ours0, t0 = self._busy(), tree_cpu_s(), time.monotonic()
        try:
            yield
        finally:
            self.others_s += self._busy() - busy0 - (tree_cpu_s() - ours0)
            self.seconds += time.monotonic() - t0

    def _busy(self) -> float:
        return sum(cpu_busy_s(cpu) for cpu in self.cpus)


class Side:
    """One pool and its own copy of the request stream."""

    def __init__(self, pool, workload) -> None:
        self.pool, self.workload, self.stream = pool, workload, iter(workload)

    def cpu_s(self) -> float:
        """CPU seconds so far of this pool's workers and of this process (which answers the all-hit
        requests; the other pool's client side is idle meanwhile)."""
        return process_cpu_s() + sum(process_cpu_s(pid) for pid in self.pool.worker_pids())

    def phase(self, seconds: float) -> dict:
        """A closed loop with IN_FLIGHT requests for `seconds`: images/s and requests/s of the replies
        that arrived within it, and the cache's counters over it (the requests still in flight at
        the end are answered afterwards, uncounted)."""
        pool, flight = self.pool, {}
        before = pool.stats()
        images = requests = sent = repeats = 0
        cpu0 = self.cpu_s()
        t0 = time.monotonic()
        end = t0 + seconds
        while True:
            now = time.monotonic()
            if now < end:
                while len(flight) < IN_FLIGHT:
                    spec = next(self.stream)
                    flight[spec.index] = spec
                    sent, repeats = sent + spec.images, repeats + spec.repeats
                    pool.submit(spec.input_ids, self.workload.acquire(spec), request_id=spec.index)
            elif not flight:
                break
            for reply in pool.poll(0.05):
                spec = flight.pop(reply.request_id)
                if not reply.ok:
                    raise RuntimeError(f"request {spec.index} rejected: {reply.kind.value}: {reply.error}")
                self.workload.release(spec, accepted=True)
                if time.monotonic() <= end:
                    images += spec.images
                    requests += 1
                reply.release()
        after = pool.stats()
        cpu = self.cpu_s() - cpu0  # (the drain's included: it is work for the images counted)
        hits, misses = after.cache_hits - before.cache_hits, after.cache_misses - before.cache_misses
        return {
            "cpu_ms_per_image": cpu / max(1, images) * 1e3,
            "images_per_s": images / seconds,
            "requests_per_s": requests / seconds,
            "hits": hits,
            "misses": misses,
            "evictions": after.cache_evictions - before.cache_evictions,
            "images_sent": sent,
            "repeats_sent": repeats,
        }


def throughput(spec: dict, seconds: float, rounds: int, seed: int, cache_mib: int, usage: Usage) -> dict:
    from mmworker import WorkerPool
    from mmworker.loadtest import corpus as corpus_mod
    from mmworker.loadtest.workload import Workload
    from mmworker.registry import pipeline_from_spec

    directory = corpus_mod.default_dir(0)
    if not corpus_mod.is_complete(directory):
        print(f"generating the load test's corpus in {directory} (first run only)", file=sys.stderr)
        corpus_mod.build(directory, 0)
    images = corpus_mod.load(directory)
    prompt = pipeline_from_spec(spec).image_prompt()

    def workload() -> Workload:
        return Workload(images, prompt, {1: 60, 2: 25, 3: 10, 4: 5}, ("bytes",), 0.0, "", seed, REPEAT_FRACTION)

    samples: dict[str, list[dict]] = {"on": [], "off": []}
    with WorkerPool(spec, {**POOL, "cache_mib": cache_mib}) as on, WorkerPool(spec, {**POOL, "cache_mib": 0}) as off:
        sides = {"on": Side(on, workload()), "off": Side(off, workload())}
        how = f"worker_sched {on.plan.worker_sched}"
        for side in sides.values():  # kernels loaded, the cache filled: the measured phases are steady
            side.phase(min(3.0, seconds))
        with usage.measuring():
            for turn in range(rounds):
                for name in ("on", "off") if turn % 2 == 0 else ("off", "on"):
                    samples[name].append(sides[name].phase(seconds))
                ratio = samples["on"][-1]["images_per_s"] / samples["off"][-1]["images_per_s"]
                print(f"throughput round {turn + 1} of {rounds}: on/off {ratio:.2f}x", file=sys.stderr)
    return {"samples": samples, "how": how, "corpus": len(images)}


def all_hit_latency(spec: dict, calls: int, rounds: int, usage: Usage) -> dict:
    """{case: {"sync"|"async": {"p50": [per round], "p99": [...], "cpu_ms": [...]}}}."""
    from mmworker import WorkerPool
    from mmworker.corpus import encode, photo_like

    p = 151655  # <|image_pad|>
    jpeg720 = encode(photo_like(1280, 720, seed=1), "JPEG")
    cases = {
        "720p JPEG": [jpeg720],
        "12 MP JPEG": [encode(photo_like(4032, 3024, seed=2), "JPEG")],
        "4 x 720p JPEG": [jpeg720, *(encode(photo_like(1280, 720, seed=k), "JPEG") for k in (3, 4, 5))],
    }
    out = {case: {how: {"p50": [], "p99": [], "cpu_ms": []} for how in ("sync", "async")} for case in cases}
    with WorkerPool(spec, {"workers": WORKERS}) as pool:
        for images in cases.values():  # computed once: from now on every call is all hits
            reply = pool.process([p] * len(images), images)
            assert reply.ok, reply.error
            reply.release()

        def check(reply, images) -> None:
            if not (reply.ok and reply.worker is None and reply.cache_hits == len(images)):
                raise RuntimeError(f"not answered from the cache: {reply}")
            reply.release()

        def sync(images, calls: int) -> list[float]:
            ids, times = [p] * len(images), []
            for _ in range(calls):
                t0 = time.perf_counter()
                reply = pool.process(ids, images)
                times.append(time.perf_counter() - t0)
                check(reply, images)
            return times

        async def asynchronous(images, calls: int) -> list[float]:
            ids, times = [p] * len(images), []
            for _ in range(calls):
                t0 = time.perf_counter()
                reply = await pool.aprocess(ids, images)
                times.append(time.perf_counter() - t0)
                check(reply, images)
            return times

        runners = {"sync": sync, "async": lambda images, calls: asyncio.run(asynchronous(images, calls))}
        with usage.measuring():
            for turn in range(rounds):
                for case, images in cases.items():
                    for how in ("sync", "async") if turn % 2 == 0 else ("async", "sync"):
                        runners[how](images, 20)  # untimed: this path's code and data back in cache
                        cpu0 = time.process_time()
                        times = runners[how](images, calls)
                        cell = out[case][how]
                        cell["cpu_ms"].append((time.process_time() - cpu0) / calls * 1e3)
                        cell["p50"].append(percentile(times, 0.5) * 1e3)
                        cell["p99"].append(percentile(times, 0.99) * 1e3)
                print(f"latency round {turn + 1} of {rounds} measured", file=sys.stderr)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per throughput phase (default 5)")
    parser.add_argument("--calls", type=int, default=2000, help="all-hit calls per round and case (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache-mib", type=int, default=512, help="the cache side's cache_mib (default 512, the pool's)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0 or args.calls < 10 or args.cache_mib < 1:
        parser.error("--rounds must be >= 1, --seconds > 0, --calls >= 10, --cache-mib >= 1")
    from mmworker.runtime import reexec_tuned

    reexec_tuned()
    from mmworker.registry import named_spec

    spec = {**named_spec(SPEC_NAME), "max_pixels": MAX_PIXELS}
    usage = Usage()
    load_start = os.getloadavg()
    steal0, started = cpu_steal_s(), time.monotonic()
    found = throughput(spec, args.seconds, args.rounds, args.seed, args.cache_mib, usage)
    latency = all_hit_latency(spec, args.calls, args.rounds, usage)
    elapsed = time.monotonic() - started
    load_end = os.getloadavg()
    steal = (cpu_steal_s() - steal0) / (os.cpu_count() * elapsed)
    others, cpus = usage.others_s, usage.cpus

    samples = found["samples"]
    on, off = samples["on"], samples["off"]
    ratios = [a["images_per_s"] / b["images_per_s"] for a, b in zip(on, off, strict=True)]
    cpu_ratios = [a["cpu_ms_per_image"] / b["cpu_ms_per_image"] for a, b in zip(on, off, strict=True)]
    hit_rates = [s["hits"] / max(1, s["hits"] + s["misses"]) for s in on]
    print(f"\n1. half the images repeated: {SPEC_NAME} (max_pixels {MAX_PIXELS}), {WORKERS} workers each "
          f"({found['how']}), closed loop {IN_FLIGHT} in flight, the load test's mix ({found['corpus']} corpus "
          f"images, 1-4 per request) as bytes, repeat fraction {REPEAT_FRACTION}, cache_mib {args.cache_mib} on "
          f"the cache side, replies unordered; {plural(args.rounds, 'round')} of "
          f"{args.seconds:g} s per side, median (range)")  # fmt: skip
    print(f"  {'':<12} {'images/s':>22} {'requests/s':>22} {'CPU ms per image':>22}")
    for name, rows in samples.items():
        print(f"  cache {name:<6} {spread([r['images_per_s'] for r in rows], 1):>22} "
              f"{spread([r['requests_per_s'] for r in rows], 1):>22} "
              f"{spread([r['cpu_ms_per_image'] for r in rows], 2):>22}")  # fmt: skip
    print(f"  on / off     {spread(ratios):>22} {'':>22} {spread(cpu_ratios):>22}")
    print("  (CPU per image: the workers' and this process's, no verdict; beside throughput it shows the work saved "
          "whatever other processes take of the machine)")  # fmt: skip
    hits, misses = sum(s["hits"] for s in on), sum(s["misses"] for s in on)
    repeated = [s["repeats_sent"] / max(1, s["images_sent"]) for s in on]
    print(f"  cache on: hit rate {spread(hit_rates, 3)} per round ({hits} hits, {misses} misses in all), for a "
          f"share of repeats sent of {spread(repeated, 3)} (a repeat whose image was not kept misses); "
          f"{sum(s['evictions'] for s in on)} evictions")  # fmt: skip

    print(f"\n2. requests whose images are all cached, one at a time, {args.calls} calls per round and case; "
          "ms per call (wall, as the caller waits), median over rounds (range)")  # fmt: skip
    print(f"  {'':<16} {'':<6} {'p50':>20} {'p99':>20} {'CPU per call':>20}")
    for case, hows in latency.items():
        for how, cell in hows.items():
            print(f"  {case:<16} {how:<6} {spread(cell['p50'], 3):>20} {spread(cell['p99'], 3):>20} "
                  f"{spread(cell['cpu_ms'], 3):>20}")  # fmt: skip

    print(f"\nmachine: load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end; other "
          f"processes took {others:.1f} CPU-s of the {len(cpus)} allowed CPUs in the {usage.seconds:.0f} s "
          f"measured ({others / (len(cpus) * usage.seconds):.1%}); host steal {steal:.1%} over the run's "
          f"{elapsed:.0f} s")  # fmt: skip
    ratio = statistics.median(ratios)
    verdicts = [(f"throughput cache on / off >= {TARGET_RATIO}x (half the images repeated)", ratio,
                 ratio >= TARGET_RATIO)]  # fmt: skip
    for how in ("sync", "async"):
        p50 = statistics.median(latency["720p JPEG"][how]["p50"])
        verdicts.append((f"all-hit reply p50 <= {TARGET_HIT_P50_MS} ms, 720p JPEG, {how}", p50,
                         p50 <= TARGET_HIT_P50_MS))  # fmt: skip
    print()
    for text, value, ok in verdicts:
        print(f"target {text}: {value:.3f} {'PASS' if ok else 'MISS'}")
    if args.json:
        args.json.write_text(json.dumps({
            "rounds": args.rounds, "seconds": args.seconds, "calls": args.calls,
            "throughput": {"samples": samples, "ratio_per_round": ratios, "cpu_ratio_per_round": cpu_ratios,
                           "hit_rate_per_round": hit_rates,
                           "repeats_sent_per_round": repeated},
            "all_hit_latency_ms": latency,
            "machine": {"load_start": load_start, "load_end": load_end, "others_cpu_s": others,
                        "measured_s": usage.seconds, "elapsed_s": elapsed, "steal": steal},
            "targets": [{"target": t, "value": v, "pass": ok} for t, v, ok in verdicts],
        }, indent=2))  # fmt: skip
    return 0 if all(ok for *_, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
