"""The load test's tally: percentiles from its histograms against numpy's, the verdict counters, and
memory that stays flat however many requests are answered."""

import math
import tracemalloc

import numpy as np
import pytest

from mmworker.loadtest.tally import LATENCY_PARTS, PERCENTILES, PLOT_SAMPLE, LogHistogram, Tally

GOOD = {"kind": "good", "expected_error": None, "images": 1, "warmup": False, "error": None, "worker": 0}


def add_accepted(tally: Tally, latency: float, **overrides) -> None:
    parts = (latency * 0.1, latency * 0.2, latency * 0.6, latency * 0.1)
    fields = {**GOOD, "ok": True, "answered_s": 1.0, "latency_ms": latency, "parts_ms": parts, **overrides}
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


def test_verdict_counters():
    tally = Tally()
    for _ in range(6):
        tally.submit(warmup=False)
    add_accepted(tally, 5.0)
    add_accepted(tally, 7.0, kind="corrupt", expected_error="image decode")  # a bad request accepted
    bad = {**GOOD, "ok": False, "answered_s": 1.0, "latency_ms": 1.0, "parts_ms": (0.0,) * 4}
    tally.add(**{**bad, "kind": "corrupt", "expected_error": "image decode", "error": "image 0: image decode: x"})
    tally.add(**{**bad, "kind": "corrupt", "expected_error": "image decode", "error": "worker crashed (worker 1)"})
    tally.add(**{**bad, "kind": "too_many", "expected_error": "exceeds 64 media items", "error": "image 0: odd"})
    assert tally.lost == 1 and tally.answered == 5 and tally.accepted == 2 and tally.rejected == 3
    assert tally.expected_bad == 4 and tally.good_rejected == 0
    assert (tally.bad_accepted_count, tally.bad_accepted) == (1, ["corrupt"])
    assert (tally.bad_wrong_count, tally.bad_wrong) == (1, [("too_many", "image 0: odd")])  # a crash is excused
    assert tally.rejects_by_reason == {"image decode": 1, "worker crashed": 1, "image N: odd": 1}
    assert tally.measured_accepted == 2 and tally.per_worker == {0: 2}
    assert tally.latency.summary()["max"] == 7.0 and tally.parts["busy"].summary()["max"] == pytest.approx(4.2)


def test_warm_up_answers_count_but_stay_out_of_the_figures():
    tally = Tally()
    tally.submit(warmup=True)
    add_accepted(tally, 9.0, warmup=True)
    assert tally.warmup == 1 and tally.accepted == 1 and tally.lost == 0
    assert tally.measured_accepted == 0 and tally.latency.n == 0 and len(tally.plot_points) == 0


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
