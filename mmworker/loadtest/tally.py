"""What a load test keeps of its answered requests: counters, latency histograms and a bounded
sample, in memory that does not grow with the run's length.

A soak runs for as long as its operator likes and checks that the pool's memory stays flat, so the
load generator in the same process must not grow either. One record object per request (~500
bytes with its floats, and the heap around them) made the client of a 10-minute soak grow 21% and
fail that check by itself. Here every answer updates counters and histograms and is then forgotten;
only the requests in flight are known one by one (by the runner).

Percentiles come from log-spaced histograms whose bucket edges grow by 0.1%: each is within 0.05%
of the exact sample percentile (numpy's "higher" method), clipped to the exact minimum and maximum;
means are exact (float64 sums), as are the maxima.
"""

import math
import random
import re
from collections import Counter

import numpy as np

# Reply fields whose sum is an accepted request's latency, in `Tally.add` order.
LATENCY_PARTS = ("queued", "to_worker", "busy", "returned")
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99.9", 99.9))
_REASONS = (
    "queue full", "shared memory full", "deadline exceeded", "worker crashed", "pool closed", "aborted",
    "exceeds 64 media items", "total media bytes", "media placeholder", "status code 404", "image decode",
    "media fetch", "smart_resize", "aspect ratio",
)  # fmt: skip
# Rejections that say something about the pool's state, not about the request.
INFRASTRUCTURE = ("worker crashed", "deadline exceeded", "I/O process crashed", "queue full", "shared memory full",
                  "pool closed", "aborted")  # fmt: skip
EXAMPLES_KEPT = 5  # of each kind of failure, for the report's messages
PLOT_SAMPLE = 20_000  # (time, latency) points kept for the plot, a uniform sample


def reason_of(error: str) -> str:
    """A stable category for a reject message (the known causes, else its start without numbers)."""
    for reason in _REASONS:
        if reason in error:
            return reason
    return re.sub(r"\d+", "N", error)[:60]


def reservoir_slot(rng: random.Random, capacity: int, seen: int) -> int:
    """Reservoir sampling: where the `seen`-th item (counting from 1) goes in a uniform sample of
    `capacity` (which then holds min(seen - 1, capacity) items): appended while it is not full, then
    a random place; a slot of `capacity` or more means the item is not kept."""
    return seen - 1 if seen <= capacity else rng.randrange(seen)


class LogHistogram:
    """Counts of values (ms) in buckets whose edges grow by 0.1% from 0.1 us to 10^4 s (~200 KB).

    Values at or below the lowest edge (0 and clock noise below it) share the first bucket.
    """

    _LOW = 1e-4
    _LOG_STEP = math.log(1.001)
    _BUCKETS = int(math.log(1e7 / _LOW) / _LOG_STEP) + 2

    def __init__(self) -> None:
        self.counts = np.zeros(self._BUCKETS, np.int64)
        self.n = 0
        self.total = 0.0
        self.low = math.inf
        self.high = -math.inf

    def add(self, value: float) -> None:
        k = int(math.log(value / self._LOW) / self._LOG_STEP) + 1 if value > self._LOW else 0
        self.counts[min(k, self._BUCKETS - 1)] += 1
        self.n += 1
        self.total += value
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def summary(self) -> dict[str, float]:
        """mean, p50, p90, p99, p99.9, max (NaN for no values)."""
        if not self.n:
            return {k: float("nan") for k in ("mean", *(name for name, _ in PERCENTILES), "max")}
        cumulative = np.cumsum(self.counts)
        out = {"mean": self.total / self.n}
        for name, q in PERCENTILES:
            rank = math.ceil(q / 100 * (self.n - 1))  # numpy's "higher": the sorted value at this index
            k = int(np.searchsorted(cumulative, rank + 1))
            middle = self._LOW * math.exp((k - 0.5) * self._LOG_STEP) if k else self._LOW / 2
            out[name] = min(max(middle, self.low), self.high)
        out["max"] = self.high
        return out


class Tally:
    """What the report needs of a run's requests: `submit` once per request, `add` once per answer."""

    def __init__(self, seed: int = 0) -> None:
        self.submitted = self.warmup = 0  # requests, and those of them submitted during the warm-up
        self.answered = self.accepted = self.rejected = 0
        self.measured_accepted = self.measured_images = 0
        self.expected_bad = self.good_rejected = 0
        self.bad_accepted: list[str] = []  # kinds, the first few
        self.bad_accepted_count = 0
        self.bad_wrong: list[tuple[str, str]] = []  # (kind, error), the first few
        self.bad_wrong_count = 0
        self.rejects_by_reason: Counter[str] = Counter()
        self.per_worker: Counter[int] = Counter()
        self.per_worker_images: Counter[int] = Counter()
        self.latency = LogHistogram()
        self.parts = {name: LogHistogram() for name in LATENCY_PARTS}
        # (answered s, latency ms) of measured accepted requests: a uniform sample, in its first
        # min(measured_accepted, PLOT_SAMPLE) rows.
        self._plot = np.empty((PLOT_SAMPLE, 2))
        self._plot_rng = random.Random(seed)

    def submit(self, warmup: bool) -> None:
        self.submitted += 1
        self.warmup += warmup

    @property
    def lost(self) -> int:
        """Submitted and (so far) never answered."""
        return self.submitted - self.answered

    def add(self, *, kind: str, expected_error: str | None, images: int, warmup: bool, ok: bool, error: str | None,
            answered_s: float, latency_ms: float, parts_ms: tuple[float, float, float, float],
            worker: int | None) -> None:  # fmt: skip
        self.answered += 1
        bad = kind != "good"
        self.expected_bad += bad
        if not ok:
            self.rejected += 1
            text = error or ""
            self.rejects_by_reason[reason_of(text)] += 1
            self.good_rejected += not bad
            # A bad request whose worker was killed (or that ran out of time) never got to its own
            # check: that is not a wrong answer, only an unattributed one.
            if bad and (expected_error or "") not in text and not any(r in text for r in INFRASTRUCTURE):
                self.bad_wrong_count += 1
                if len(self.bad_wrong) < EXAMPLES_KEPT:
                    self.bad_wrong.append((kind, text))
            return
        self.accepted += 1
        if bad:
            self.bad_accepted_count += 1
            if len(self.bad_accepted) < EXAMPLES_KEPT:
                self.bad_accepted.append(kind)
        if warmup:
            return
        self.measured_accepted += 1
        self.measured_images += images
        self.per_worker[worker] += 1
        self.per_worker_images[worker] += images
        self.latency.add(latency_ms)
        for name, value in zip(LATENCY_PARTS, parts_ms, strict=True):
            self.parts[name].add(value)
        # Every measured accepted request has the same chance to be plotted.
        slot = reservoir_slot(self._plot_rng, PLOT_SAMPLE, self.measured_accepted)
        if slot < PLOT_SAMPLE:
            self._plot[slot] = answered_s, latency_ms

    @property
    def plot_points(self) -> np.ndarray:
        """(answered s after the start, latency ms) rows: every measured accepted request, or a uniform
        sample of PLOT_SAMPLE of them."""
        return self._plot[: min(self.measured_accepted, PLOT_SAMPLE)]
