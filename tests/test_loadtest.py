"""`mmworker loadtest`: option checks, a short real run, the report schema, --verify, sweep and open loop,
and a family other than Qwen's."""

import json
import subprocess
import sys

import pytest
from PIL import Image

from mmworker.corpus import encode, photo_like

REPORT_KEYS = {"version", "machine", "config", "duration_s", "measured_s", "interrupted", "requests", "warmup_requests",
               "throughput", "latency_ms", "latency_parts_ms", "workers", "client", "shm", "rejects_by_kind", "verify",
               "restarts", "ok", "failures"}  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("corpus")
    for k, (w, h, fmt) in enumerate([(320, 240, "JPEG"), (200, 150, "PNG"), (256, 256, "WEBP"), (640, 360, "JPEG"),
                                     (96, 96, "PNG"), (300, 200, "JPEG")]):  # fmt: skip
        (directory / f"img{k}.{fmt.lower()}").write_bytes(encode(photo_like(w, h, seed=k), fmt))
    (directory / "notes.txt").write_text("not an image: skipped")
    return directory


def loadtest(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "mmworker.cli", "loadtest", "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--duration", "1", "--requests", "5"], "--duration and --requests are exclusive"),
     (["--concurrency", "2", "--rate", "5"], "--concurrency (closed loop) and --rate (open loop) are exclusive"),
     (["--rate", "0"], "--rate must be positive"),
     (["--images-per-request", "1:x"], "expected 'N:weight,...'"),
     (["--images-per-request", "70:1"], "counts must be 1..64"),
     (["--sources", "bytes,ftp"], "choose from bytes, data, base64, path, http"),
     (["--bad-fraction", "1.5"], "--bad-fraction must be within 0..1"),
     (["--family", "llava"], "unknown named spec 'llava'"),
     (["--family", "inkling", "--max-pixels", "4096"], "spec inkling has no max_pixels to override")],
)  # fmt: skip
def test_bad_options_are_refused_before_anything_starts(args, message, corpus):
    result = loadtest("--corpus", str(corpus), *args, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr


def test_short_run_report_schema_and_plot(corpus, tmp_path):
    report, png = tmp_path / "r.json", tmp_path / "p.png"
    result = loadtest("--corpus", str(corpus), "--requests", "60", "--warmup", "0", "--bad-fraction", "0.2",
                      "--verify", "8", "--json", str(report), "--plot", str(png), "--compare-inline")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(report.read_text())
    assert set(doc) >= REPORT_KEYS and doc["version"] == 2 and doc["ok"] is True and doc["interrupted"] is False
    r = doc["requests"]
    assert r["submitted"] == r["answered"] == 60 and r["lost"] == 0 and r["duplicated"] == 0
    assert doc["warmup_requests"]["submitted"] == 0
    assert r["expected_bad"] > 0 and r["bad_accepted"] == 0 and r["bad_wrong_reason"] == 0 and r["good_rejected"] == 0
    assert doc["verify"] == {"checked": 8, "mismatches": 0}
    assert set(doc["latency_ms"]) == {"mean", "p50", "p90", "p99", "p99.9", "max"}
    parts = doc["latency_parts_ms"]
    assert list(parts) == ["queued", "to_worker", "busy", "returned"]
    assert all(part["p50"] > 0 for part in parts.values())
    assert sum(part["mean"] for part in parts.values()) == pytest.approx(doc["latency_ms"]["mean"], rel=1e-9)
    assert doc["throughput"]["requests_per_s"] > 0 and doc["inline"]["pool_speedup"] > 0
    assert sum(w["requests"] for w in doc["workers"]) == r["accepted"]
    assert sum(doc["rejects_by_kind"].values()) == r["rejected"] and set(doc["rejects_by_kind"]) == {"bad_input"}
    with Image.open(png) as image:
        assert image.size == (1200, 520)
        # Drawn on: the points (blue) and the CDF (red) are there, not only a frame.
        colours = {colour for _, colour in image.getcolors(1 << 20)}
        assert (31, 119, 180) in colours and (214, 39, 40) in colours
    assert "PASS" in result.stdout and "lost / duplicated" in result.stdout
    assert f"wrote report to {report}\n" in result.stdout and f"wrote plot to {png}\n" in result.stdout


def test_verify_catches_a_corrupted_reply(corpus, tmp_path):
    report = tmp_path / "r.json"
    result = loadtest("--corpus", str(corpus), "--requests", "12", "--warmup", "0", "--bad-fraction", "0",
                      "--verify", "3", "--corrupt-sample", "--json", str(report))  # fmt: skip
    assert result.returncode == 1
    doc = json.loads(report.read_text())
    assert doc["ok"] is False and doc["verify"]["mismatches"] == 3
    assert any("differ from in-process results" in f for f in doc["failures"])


def test_sweep_and_open_loop(corpus, tmp_path):
    report = tmp_path / "r.json"
    result = loadtest("--corpus", str(corpus), "--sweep-workers", "1,2", "--rate", "30", "--duration", "1.5",
                      "--warmup", "0.5", "--json", str(report))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(report.read_text())
    assert [r["config"]["workers"] for r in doc["sweep"]] == [1, 2]
    assert all(r["config"]["mode"] == "open loop 30/s" for r in doc["sweep"])
    assert "knee:" in result.stdout


def test_inkling_family_and_warm_up_counted_apart(corpus, tmp_path):
    # A family without M-RoPE, with uint16 features and another prompt: nothing in the load test is
    # Qwen's. With a warm-up, the measured counts (the "requests" row) are those the figures are of.
    report = tmp_path / "r.json"
    result = loadtest("--corpus", str(corpus), "--family", "inkling", "--requests", "20", "--warmup", "1",
                      "--workers", "1", "--verify", "5", "--json", str(report))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(report.read_text())
    r, w = doc["requests"], doc["warmup_requests"]
    assert r["submitted"] == r["answered"] == 20 and w["submitted"] == w["answered"] > 0
    assert sum(worker["requests"] for worker in doc["workers"]) == r["accepted"]
    assert sum(doc["rejects_by_kind"].values()) == r["rejected"]
    assert doc["verify"] == {"checked": 5, "mismatches": 0} and doc["ok"] is True
    assert doc["config"]["family"].startswith("inkling: patch 40") and doc["config"]["spec_name"] == "inkling"
    assert "1 worker," in result.stdout and "1 workers" not in result.stdout
    assert f"warm-up           │ {w['submitted']} more submitted" in result.stdout


def test_memory_growth_is_reported_for_client_and_workers(capsys):
    # A run long enough for the soak's check (>= 3 min): the client stays flat, the workers grow 10%
    # in the last minute; the report must say so per side and in sum, and print it.
    from types import SimpleNamespace

    from mmworker.loadtest.report import build_report, print_report
    from mmworker.loadtest.runner import RunResult
    from mmworker.loadtest.tally import Tally

    rss = [(float(t), 100.0, 200.0 if t < 180 else 220.0) for t in range(0, 241, 2)]
    result = RunResult(tally=Tally(), started=0.0, ended=240.0, measured_from=5.0, rss=rss)
    config = {"mode": "closed loop, 4 in flight", "warmup_s": 5.0, "workers": 2, "spec_name": "qwen2_5_vl"}
    report = build_report(
        result,
        config=config,
        pool_stats=SimpleNamespace(shm_peak_held_bytes=0, restarts=0),
        worker_pids=[],
        ring_mib=64,
        verified=0,
        mismatches=[],
        inline=None,
    )
    memory = report["rss_mb"]
    assert memory["client_growth_pct"] == pytest.approx(0.0)
    assert memory["workers_growth_pct"] == pytest.approx(10.0)
    assert memory["growth_pct"] == pytest.approx(20 / 300 * 100)
    assert memory["peak"] == 320.0
    print_report(report)
    assert "client +0.0%, workers +10.0%" in capsys.readouterr().out
