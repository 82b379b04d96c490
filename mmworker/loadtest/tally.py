"""What a load test keeps of its answered requests: counters, latency histograms and a bounded
sample, in memory that does not grow with the run's length.

A soak runs for as long as its operator likes and checks that the pool's memory stays flat, so the
load generator in the same process must not grow either: keeping one record object per request
would grow the client by itself, without bound. Here every answer updates counters and histograms
and is then forgotten; only the requests in flight are known one by one (by the runner).

Requests submitted during the warm-up are counted apart (`Tally.warmup`) from the measured ones
(`Tally.measured`): the figures, the per-worker counts and the report's request counts all describe
the same measured requests, while the verdict's checks cover both. Replies are classified by their
kind (`Reply.kind`, an mmworker.errors.Outcome), never by their message's text.

Accepted measured requests whose images all came from the pool's feature cache (answered by the
client, no worker involved) have a latency histogram of their own beside the others': the two are
different populations, a fraction of a millisecond against the workers' time. The images of the
good requests sent (and how many repeat an earlier one) are counted as the workload made them, to
be set against the pool's cache counters.

Measured requests that carry a video (mmworker.loadtest.workload's video mix) are also counted on
their own (`Tally.video`), and accepted ones have their latency histogram apart from the image-only
requests': a video costs its worker tens to hundreds of times an image, so one mixed histogram
would say little about either.

Percentiles come from log-spaced histograms whose bucket edges grow by 0.1%: each is within 0.05%
of the exact sample percentile (numpy's "higher" method), clipped to the exact minimum and maximum;
means are exact (float64 sums), as are the maxima.
"""

import math
import random
from collections import Counter
from dataclasses import dataclass, field, fields

import numpy as np

from mmworker.errors import Outcome

# Reply fields whose sum is an accepted request's latency, in `Tally.add` order.
LATENCY_PARTS = ("queued", "to_worker", "busy", "returned")
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99.9", 99.9))
# Rejections that say something about the pool's state, not about the request: a bad request
# answered so never reached its own check, which is not a wrong answer, only an unattributed one.
POOL_STATE = frozenset({Outcome.WORKER_CRASHED, Outcome.DEADLINE_EXCEEDED, Outcome.QUEUE_FULL, Outcome.MEMORY_FULL,
                        Outcome.POOL_CLOSED, Outcome.ABORTED})  # fmt: skip
EXAMPLES_KEPT = 5  # of each kind of failure, for the report's messages
PLOT_SAMPLE = 20_000  # (time, latency) points kept for the plot, a uniform sample


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


@dataclass
class Counts:
    """The requests of one phase of a run (warm-up or measured) and what became of them."""

    submitted: int = 0
    answered: int = 0
    accepted: int = 0
    rejected: int = 0
    abandoned: int = 0  # still in flight when an interrupted run stopped waiting for them
    expected_bad: int = 0  # deliberately bad requests (workload.BAD_KINDS) among the answered
    bad_accepted: int = 0  # ... accepted: a failure
    bad_wrong_reason: int = 0  # ... rejected as something else than they are: a failure
    good_rejected: int = 0  # good requests rejected (a refused image of a user's corpus, a full queue)
    internal: int = 0  # rejected with Outcome.INTERNAL (mmworker's own fault): a failure
    rejects_by_kind: Counter[str] = field(default_factory=Counter)  # Outcome values

    @property
    def lost(self) -> int:
        """Submitted and never answered (those abandoned on purpose apart)."""
        return self.submitted - self.answered - self.abandoned

    def answer(self, outcome: Outcome, bad: bool, wrong_reason: bool) -> None:
        """One answer of `outcome` to a request deliberately `bad` or not; `wrong_reason`: a bad one
        rejected as something else than it is."""
        self.answered += 1
        self.expected_bad += bad
        if outcome is Outcome.ACCEPTED:
            self.accepted += 1
            self.bad_accepted += bad
            return
        self.rejected += 1
        self.rejects_by_kind[outcome.value] += 1
        self.good_rejected += not bad
        self.internal += outcome is Outcome.INTERNAL
        self.bad_wrong_reason += wrong_reason

    def as_dict(self) -> dict[str, int]:
        """The counters and `lost` (not the rejects by kind)."""
        counters = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rejects_by_kind"}
        return {**counters, "lost": self.lost}


class Tally:
    """What the report needs of a run's requests: `submit` once per request, `add` once per answer."""

    def __init__(self, seed: int = 0) -> None:
        self.warmup = Counts()  # requests submitted during the warm-up
        self.measured = Counts()  # requests submitted after it: the run's figures
        self.video = Counts()  # the measured requests that carry a video (also in `measured`)
        self.measured_images = 0  # of measured accepted requests
        self.measured_videos = 0  # of measured accepted requests
        self.sent_images = 0  # of measured good requests, as submitted
        self.sent_repeats = 0  # ... of which repeat an image of an earlier request
        self.sent_videos = 0  # of measured good requests, as submitted
        self.bad_accepted: list[str] = []  # kinds, the first few
        self.bad_wrong: list[tuple[str, str]] = []  # (kind, error), the first few
        self.internal_errors: list[str] = []  # the first few messages
        self.per_worker: Counter[int] = Counter()
        self.per_worker_images: Counter[int] = Counter()
        self.per_worker_videos: Counter[int] = Counter()
        self.latency = LogHistogram()
        self.latency_all_hit = LogHistogram()  # accepted requests whose images were all cached (and no video)
        self.latency_others = LogHistogram()
        self.latency_video = LogHistogram()  # accepted requests with a video
        self.latency_image_only = LogHistogram()  # ... and without
        self.parts = {name: LogHistogram() for name in LATENCY_PARTS}
        # (answered s, latency ms) of measured accepted requests: a uniform sample, in its first
        # min(measured.accepted, PLOT_SAMPLE) rows.
        self._plot = np.empty((PLOT_SAMPLE, 2))
        self._plot_rng = random.Random(seed)

    def submit(self, warmup: bool, images: int = 0, repeats: int = 0, videos: int = 0, good_videos: int = 0) -> None:
        """One request submitted, with `videos` videos; a good one with `images` images, of which
        `repeats` repeat earlier ones, and `good_videos` videos."""
        (self.warmup if warmup else self.measured).submitted += 1
        if not warmup:
            self.sent_images += images
            self.sent_repeats += repeats
            self.sent_videos += good_videos
            self.video.submitted += videos > 0

    def abandon(self, warmup: bool, videos: int = 0) -> None:
        """A request (with `videos` videos) still in flight when an interrupted run stopped waiting:
        not lost, not answered."""
        (self.warmup if warmup else self.measured).abandoned += 1
        if not warmup:
            self.video.abandoned += videos > 0

    def total(self, count: str) -> int:
        """One of the `Counts` (e.g. "submitted", "lost") over both phases."""
        return getattr(self.warmup, count) + getattr(self.measured, count)

    def add(self, *, kind: str, expected: tuple[Outcome, str] | None, images: int, warmup: bool, outcome: Outcome,
            error: str | None, answered_s: float, latency_ms: float, parts_ms: tuple[float, float, float, float],
            worker: int | None, cache_hits: int = 0, videos: int = 0) -> None:  # fmt: skip
        """One answer: `kind` and `expected` are the workload's (what the request is, how it must be
        rejected), `outcome` and `error` the reply's kind and message; `cache_hits` its images that
        came from the pool's cache; `videos` how many videos the request carried."""
        phases = [self.warmup if warmup else self.measured]
        if videos and not warmup:
            phases.append(self.video)
        bad = expected is not None
        text = error or ""
        # The message must name the expected cause too: bad input rejected for another reason than
        # the one built into it means a check missed or misfired.
        wrong = (bad and outcome is not Outcome.ACCEPTED and outcome not in POOL_STATE
                 and (outcome is not expected[0] or expected[1] not in text))  # fmt: skip
        for counts in phases:
            counts.answer(outcome, bad, wrong)
        if outcome is Outcome.INTERNAL and len(self.internal_errors) < EXAMPLES_KEPT:
            self.internal_errors.append(text)
        if wrong and len(self.bad_wrong) < EXAMPLES_KEPT:
            self.bad_wrong.append((kind, f"{outcome.value}: {text}"))
        if outcome is not Outcome.ACCEPTED:
            return
        if bad and len(self.bad_accepted) < EXAMPLES_KEPT:
            self.bad_accepted.append(kind)
        if warmup:
            return
        self.measured_images += images
        self.measured_videos += videos
        self.per_worker[worker] += 1
        self.per_worker_images[worker] += images
        self.per_worker_videos[worker] += videos
        self.latency.add(latency_ms)
        # A request with a video needs a worker whatever the cache holds: never an all-hit one.
        all_hit = images and not videos and cache_hits >= images
        (self.latency_all_hit if all_hit else self.latency_others).add(latency_ms)
        (self.latency_video if videos else self.latency_image_only).add(latency_ms)
        for name, value in zip(LATENCY_PARTS, parts_ms, strict=True):
            self.parts[name].add(value)
        # Every measured accepted request has the same chance to be plotted.
        slot = reservoir_slot(self._plot_rng, PLOT_SAMPLE, self.measured.accepted)
        if slot < PLOT_SAMPLE:
            self._plot[slot] = answered_s, latency_ms

    @property
    def plot_points(self) -> np.ndarray:
        """(answered s after the start, latency ms) rows: every measured accepted request, or a uniform
        sample of PLOT_SAMPLE of them."""
        return self._plot[: min(self.measured.accepted, PLOT_SAMPLE)]
