"""What the benchmarks share: the reference Rust extension (a yardstick, loaded only here), timing, percentiles."""

import importlib
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path

REF_ROOT_ENV = "MMWORKER_REF_ROOT"  # where the yardsticks were built, if not in this checkout
GET_REF_EXT = "scripts/get_reference_ext.sh"  # what fetches it, for messages that say it is missing


def ref_root() -> Path:
    """The checkout whose scripts built the yardsticks (.cache/ref_ext, .venv-ref): $MMWORKER_REF_ROOT,
    else this one. The scripts build them inside the checkout they run from (gitignored), so a git
    worktree of the same repository finds them by pointing here at the tree that has them."""
    env = os.environ.get(REF_ROOT_ENV)
    return Path(env).resolve() if env else Path(__file__).resolve().parent.parent


def load_reference_extension(root: Path | None = None):
    """The sglang 0.5.23 `_multimodal` module under `root` (default `ref_root()`), single-threaded, or
    None if it was not fetched (scripts/get_reference_ext.sh). Benchmarks only: mmworker never imports it."""
    ref_ext = (root or ref_root()) / ".cache" / "ref_ext"
    if not ref_ext.is_dir():
        return None
    os.environ["SGL_MM_RS_THREADS"] = "1"  # read when the extension builds its pool
    sys.path.insert(0, str(ref_ext))
    try:
        return importlib.import_module("_multimodal")
    except ImportError as exc:
        print(f"(Rust extension not importable: {exc})")
        return None
    finally:
        sys.path.remove(str(ref_ext))


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
    order = list(timers)
    return _timed_cycles(timers, lambda: order, budget_s, min_calls, warm_calls)


def cold_medians(
    timers: dict,
    budget_s: float,
    min_calls: int = 3,
    family: Callable[[str], Hashable] = lambda name: name,
    seed: int = 0,
) -> dict:
    """{(implementation, image): timer} -> {(implementation, image): median seconds}, each call cold.

    The cold-cache schedule: every cycle times each (implementation, image) once, with no untimed
    call before it (`timer(0)`), in an order where every call follows a call of another
    implementation on another image, the previous cycle's last call included. So a timed call finds
    neither its input bytes nor its output buffer nor, beyond what the previous call shares with it,
    its code and tables in cache: a pool worker's previous call was another image, and between two
    calls of a worker other processes run on its core. `family(implementation)` names what must
    differ from one call to the next: implementations of one family (two modes of one library) share
    code and tables, so one would warm the other's. Each cycle's order is drawn anew (seeded), so a
    call does not always follow the same one. The timers are those of `interleaved_medians`, and the
    cycles continue on the same terms: until `budget_s` has passed and each was timed `min_calls` times.
    """
    orders = _cold_orders(list(timers), family, random.Random(seed))
    return _timed_cycles(timers, lambda: next(orders), budget_s, min_calls, warm_calls=0)


def _timed_cycles(timers: dict, cycle: Callable[[], list], budget_s: float, min_calls: int, warm_calls: int) -> dict:
    """{key: timer} -> {key: median seconds}, timing the keys in the order `cycle()` gives, cycle after cycle."""
    runs: dict = {key: [] for key in timers}
    deadline = time.perf_counter() + budget_s
    while min(len(r) for r in runs.values()) < min_calls or time.perf_counter() < deadline:
        for key in cycle():
            runs[key].append(timers[key](warm_calls))
    return {key: statistics.median(r) for key, r in runs.items()}


def _cold_orders(keys: list, family: Callable[[str], Hashable], rng: random.Random) -> Iterator[list]:
    """Orders of the (implementation, image) `keys`, one per cycle, no two neighbours (across cycles
    too) of one family or one image. Greedy, the family with the most calls left first (the usual way
    to keep one family's calls apart), ties broken at random; a dead end starts the cycle afresh."""

    def apart(a: tuple, b: tuple) -> bool:
        return family(a[0]) != family(b[0]) and a[1] != b[1]

    last = None
    while True:
        for _ in range(1000):
            left, order, prev = list(keys), [], last
            rng.shuffle(left)
            while left:
                choices = [k for k in left if prev is None or apart(prev, k)]
                if not choices:
                    break
                count = {}
                for k in left:
                    count[family(k[0])] = count.get(family(k[0]), 0) + 1
                prev = max(choices, key=lambda k: count[family(k[0])])  # first of the most: shuffled
                left.remove(prev)
                order.append(prev)
            if not left:
                break
        else:
            raise ValueError(
                f"no cold-cache order of {len(keys)} calls: it needs at least two families of implementations and "
                "two images (every call must follow another family's call on another image)"
            )
        last = order[-1]
        yield order


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


def cpu_busy_s(cpu: int) -> float:
    """Seconds CPU `cpu` has run anything so far (/proc/stat: user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in line.split()[1:8])
                return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    raise ValueError(f"no cpu{cpu} in /proc/stat")


def process_cpu_s(pid: int | str = "self") -> float:
    """Seconds of CPU time process `pid` has used so far, all its threads (/proc/<pid>/stat utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
