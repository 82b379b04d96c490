"""What the benchmarks share: the reference Rust extension (a yardstick, loaded only here), timing, percentiles."""

import importlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

REF_EXT = Path(__file__).resolve().parent.parent / ".cache" / "ref_ext"
GET_REF_EXT = "scripts/get_reference_ext.sh"  # what fetches it, for messages that say it is missing


def load_reference_extension():
    """The sglang 0.5.23 `_multimodal` module, single-threaded, or None if it was not fetched
    (scripts/get_reference_ext.sh). Benchmarks only: mmworker never imports it."""
    if not REF_EXT.is_dir():
        return None
    os.environ["SGL_MM_RS_THREADS"] = "1"  # read when the extension builds its pool
    sys.path.insert(0, str(REF_EXT))
    try:
        return importlib.import_module("_multimodal")
    except ImportError as exc:
        print(f"(Rust extension not importable: {exc})")
        return None
    finally:
        sys.path.remove(str(REF_EXT))


def median_seconds(fn: Callable[[], object], budget_s: float, min_runs: int = 3, max_runs: int = 200) -> float:
    """Median wall time of `fn` after one warm-up call, over runs filling `budget_s` seconds."""
    fn()
    runs: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(runs) < min_runs or (time.perf_counter() < deadline and len(runs) < max_runs):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def local_timer(fn: Callable[[], object]) -> Callable[[int], float]:
    """A timer for `interleaved_medians`: `warm_calls` untimed calls of `fn`, then the seconds of one timed call."""

    def timer(warm_calls: int) -> float:
        for _ in range(warm_calls):
            fn()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return timer


def interleaved_medians(timers: dict, budget_s: float, min_calls: int = 3, warm_calls: int = 1) -> dict:
    """{name: timer} -> {name: median seconds}, the timers taking their turn, one timed call each per cycle.

    A timer is called as `timer(warm_calls)` and returns the seconds of one timed call made right
    after `warm_calls` untimed ones of the same implementation (`local_timer` for a function of
    this process; a timer may also ask another process, which then times its own call). On a
    shared machine whose speed drifts over seconds, neighbouring calls see the same machine, so
    ratios between the implementations hold even when their absolute times do not. The untimed
    calls bring an implementation's code, tables and allocator state back (as a worker processing
    images back to back has them), though not all of its cache contents (a long back-to-back series
    of one implementation runs faster than this, with no page fault either way). Every
    implementation, wherever it runs, follows the others' calls alike, so each pays that alike.
    Cycles continue until `budget_s` has passed and each has been timed `min_calls` times.
    """
    runs: dict = {name: [] for name in timers}
    deadline = time.perf_counter() + budget_s
    while len(next(iter(runs.values()))) < min_calls or time.perf_counter() < deadline:
        for name, timer in timers.items():
            runs[name].append(timer(warm_calls))
    return {name: statistics.median(r) for name, r in runs.items()}


def percentile(values: Iterable[float], q: float) -> float:
    """The q-quantile (0..1) of `values` (any iterable) by rank, nan for none."""
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def alternating_medians(fns: dict, rounds: int, budget_s: float) -> dict:
    """{name: fn} -> {name: median ms}: every round times each function in turn (median_seconds), so
    a slow minute of a shared machine hits all of them alike; the result is the median over rounds."""
    samples: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(median_seconds(fn, budget_s))
    return {name: statistics.median(s) * 1e3 for name, s in samples.items()}


def cpu_steal_s() -> float:
    """Seconds of this VM's vCPU time taken by the host so far (/proc/stat "steal", all CPUs).

    On a shared VM a run with steal is a run on a slower, jittery machine: tail latencies
    measured while the host takes a few percent of the vCPU time are the host's, not ours.
    """
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")
