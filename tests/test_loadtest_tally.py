"""The load test's tally: percentiles from its histograms against numpy's, the verdict counters (by
reply kind), warm-up counted apart, and memory that stays flat however many requests are answered."""

import math
import tracemalloc

import numpy as np
import pytest

from mmworker.errors import Outcome
from mmworker.loadtest.tally import LATENCY_PARTS, PERCENTILES, PLOT_SAMPLE, LogHistogram, Tally
from mmworker.loadtest.workload import EXPECTED_REJECTION

GOOD = {"kind": "good", "expected": None, "images": 1, "warmup": False, "error": None, "worker": 0}
CORRUPT = {"kind": "corrupt", "expected": EXPECTED_REJECTION["corrupt"]}
TOO_MANY = {"kind": "too_many", "expected": EXPECTED_REJECTION["too_many"]}


def add_accepted(tally: Tally, latency: float, **overrides) -> None:
    parts = (latency * 0.1, latency * 0.2, latency * 0.6, latency * 0.1)
    fields = {**GOOD, "outcome": Outcome.ACCEPTED, "answered_s": 1.0, "latency_ms": latency, "parts_ms": parts,
              **overrides}  # fmt: skip
    tally.add(**fields)


def add_rejected(tally: Tally, outcome: Outcome, error: str, **overrides) -> None:
    fields = {**GOOD, "outcome": outcome, "error": error, "answered_s": 1.0, "latency_ms": 1.0, "parts_ms": (0.0,) * 4,
              **overrides}  # fmt: skip
    tally.add(**fields)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_histogram_percentiles_are_within_a_twentieth_of_a_percent_of_numpys(seed):
    rng = np.random.default_rng(seed)
    values = np.concatenate([rng.lognormal(1.5, 1.0, 20_000), rng.uniform(0.2, 0.4, 500), [0.0, 1e-6]])
    histogram = LogHistogram()
    for v in values:
        histogram.add(float(v))
    got = histogram.summary()
    for name, q in PERCENTILES:
        exact = float(np.percentile(values, q, method="higher"))
        assert got[name] == pytest.approx(exact, rel=5e-4), name
    assert got["max"] == values.max() and got["mean"] == pytest.approx(values.mean(), rel=1e-12)


def test_histogram_edges_empty_and_constant():
    assert all(math.isnan(v) for v in LogHistogram().summary().values())
    histogram = LogHistogram()
    for _ in range(10):
        histogram.add(3.25)
    assert set(histogram.summary().values()) == {3.25}  # clipped to the exact min and max
    zeros = LogHistogram()
    zeros.add(0.0)
    assert zeros.summary()["p50"] == 0.0


def test_verdict_counters_classify_by_reply_kind():
    tally = Tally()
    for _ in range(9):
        tally.submit(warmup=False)
    add_accepted(tally, 5.0)
    add_accepted(tally, 7.0, **CORRUPT)  # a bad request accepted
    add_rejected(tally, Outcome.BAD_INPUT, "image 0: image decode: x", **CORRUPT)  # as it should be
    # Killed or out of time before its own check: excused, whatever the message says.
    add_rejected(tally, Outcome.WORKER_CRASHED, "image decode: worker 1 crashed", **CORRUPT)
    add_rejected(tally, Outcome.BAD_INPUT, "image 0: odd", **TOO_MANY)  # bad input, but not for its reason
    # The right words under the wrong kind are wrong too: the kind classifies, not the text.
    add_rejected(tally, Outcome.INTERNAL, "multimodal request exceeds 64 media items", **TOO_MANY)
    add_rejected(tally, Outcome.QUEUE_FULL, "queue full")  # a good request the pool could not take
    add_rejected(tally, Outcome.INTERNAL, "internal error: boom")
    m = tally.measured
    assert tally.total("lost") == m.lost == 1 and m.answered == 8 and m.accepted == 2 and m.rejected == 6
    assert m.expected_bad == 5 and m.good_rejected == 2 and m.internal == 2
    assert (m.bad_accepted, tally.bad_accepted) == (1, ["corrupt"])
    assert m.bad_wrong_reason == 2
    assert tally.bad_wrong == [("too_many", "bad_input: image 0: odd"),
                               ("too_many", "internal: multimodal request exceeds 64 media items")]  # fmt: skip
    assert tally.internal_errors == ["multimodal request exceeds 64 media items", "internal error: boom"]
    assert m.rejects_by_kind == {"bad_input": 2, "worker_crashed": 1, "internal": 2, "queue_full": 1}
    assert tally.warmup.as_dict() == {name: 0 for name in tally.warmup.as_dict()}
    assert m.accepted == 2 and tally.per_worker == {0: 2}
    assert tally.latency.summary()["max"] == 7.0 and tally.parts["busy"].summary()["max"] == pytest.approx(4.2)


def test_warm_up_answers_are_counted_apart_and_stay_out_of_the_figures():
    tally = Tally()
    tally.submit(warmup=True)
    tally.submit(warmup=True)
    tally.submit(warmup=False)
    add_accepted(tally, 9.0, warmup=True)
    add_rejected(tally, Outcome.BAD_INPUT, "image 0: image decode: x", warmup=True, **CORRUPT)
    add_accepted(tally, 4.0)
    w, m = tally.warmup, tally.measured
    assert (w.submitted, w.answered, w.accepted, w.rejected, w.expected_bad) == (2, 2, 1, 1, 1)
    assert (m.submitted, m.answered, m.accepted, m.rejected, m.expected_bad) == (1, 1, 1, 0, 0)
    assert w.rejects_by_kind == {"bad_input": 1} and m.rejects_by_kind == {}
    assert tally.total("submitted") == 3 and tally.total("accepted") == 2 and tally.total("lost") == 0
    assert tally.latency.n == 1 and len(tally.plot_points) == 1 and tally.per_worker == {0: 1}


def test_requests_answered_from_the_cache_have_a_latency_of_their_own():
    tally = Tally()
    tally.submit(warmup=True, images=2, repeats=1)  # the warm-up's images are not counted
    tally.submit(warmup=False, images=3, repeats=2)
    tally.submit(warmup=False, images=2, repeats=2)
    tally.submit(warmup=False, images=1)
    add_accepted(tally, 50.0, warmup=True, cache_hits=1, images=1)
    add_accepted(tally, 40.0, images=3, cache_hits=2)  # one image computed: a worker's
    add_accepted(tally, 0.25, images=2, cache_hits=2, worker=None)  # all cached: the client's
    add_accepted(tally, 30.0, images=1)
    assert (tally.sent_images, tally.sent_repeats) == (6, 4)
    assert tally.latency_all_hit.n == 1 and tally.latency_all_hit.summary()["p50"] == 0.25
    assert tally.latency_others.n == 2 and tally.latency_others.summary()["max"] == 40.0
    assert tally.latency.n == 3 and tally.per_worker == {0: 2, None: 1}


def test_abandoned_requests_are_not_lost():
    tally = Tally()
    for warmup in (True, False, False):
        tally.submit(warmup=warmup)
    add_accepted(tally, 3.0)
    tally.abandon(warmup=True)
    tally.abandon(warmup=False)
    assert tally.total("lost") == 0 and tally.warmup.abandoned == 1 and tally.measured.abandoned == 1
    assert tally.measured.as_dict()["lost"] == 0


def test_memory_stays_flat_and_the_plot_sample_is_bounded_and_uniform():
    tally = Tally(seed=5)
    for k in range(PLOT_SAMPLE):
        tally.submit(warmup=False)
        add_accepted(tally, 1.0 + k % 50, answered_s=float(k))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(PLOT_SAMPLE, 5 * PLOT_SAMPLE):
            tally.submit(warmup=False)
            add_accepted(tally, 1.0 + k % 50, answered_s=float(k), worker=k % 4)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 16 * 1024, f"{grown} bytes more after {4 * PLOT_SAMPLE} more answers"
    points = tally.plot_points
    assert points.shape == (PLOT_SAMPLE, 2)
    # A uniform sample of 5 * PLOT_SAMPLE answers: a fifth of it from each fifth of the run.
    share = np.histogram(points[:, 0], bins=5, range=(0, 5 * PLOT_SAMPLE))[0] / PLOT_SAMPLE
    assert np.all(np.abs(share - 0.2) < 0.02), share
    assert tally.latency.n == 5 * PLOT_SAMPLE and set(tally.parts) == set(LATENCY_PARTS)
