"""`mmworker loadtest`: option checks, a short real run, the report schema, --verify, sweep and open loop,
a family other than Qwen's, distinct images (variants that decode alike) and repeated ones (the
cache's hit rate against what was sent), and the files of path sources not piling up."""

import base64
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmworker.corpus import encode, photo_like
from mmworker.driver import MmInput, process
from mmworker.loadtest.corpus import CorpusImage
from mmworker.loadtest.variants import Variants
from mmworker.loadtest.workload import REPEAT_WINDOW, Ref, Workload
from mmworker.registry import pipeline_from_spec

REPORT_KEYS = {"version", "machine", "config", "duration_s", "measured_s", "interrupted", "requests", "warmup_requests",
               "throughput", "latency_ms", "latency_parts_ms", "workers", "client", "cache", "shm", "rejects_by_kind",
               "verify", "restarts", "ok", "failures", "videos"}  # fmt: skip


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
     (["--repeat-fraction", "1.01"], "--repeat-fraction must be within 0..1, got 1.01"),
     (["--repeat-fraction", "-0.5"], "--repeat-fraction must be within 0..1, got -0.5"),
     (["--family", "llava"], "unknown named spec 'llava'"),
     (["--family", "inkling", "--max-pixels", "4096"], "spec inkling has no max_pixels to override"),
     (["--video-fraction", "1.5"], "--video-fraction must be within 0..1, got 1.5"),
     (["--video-fraction", "0.1", "--family", "inkling"], "loadtest: --video-fraction: spec inkling serves no videos"),
     (["--video-fraction", "0.1", "--family", "qwen3_5"],
      "loadtest: --video-fraction: spec qwen3_5 serves no videos: qwen3_5 needs the spec's `timestamp_table`")],
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
    assert set(doc) >= REPORT_KEYS and doc["version"] == 4 and doc["ok"] is True and doc["interrupted"] is False
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
    # --repeat-fraction 0 (the default): every image distinct, so the cache (on by default) finds none.
    cache = doc["cache"]
    assert cache["enabled"] is True and cache["repeat_fraction"] == 0 and cache["repeated_images"] == 0
    assert cache["hits"] == 0 and cache["hit_rate"] == 0.0 and cache["misses"] >= cache["good_images_sent"] > 0
    assert cache["latency_ms"]["all_hit"]["count"] == 0 and cache["latency_ms"]["others"]["count"] == r["accepted"]
    with Image.open(png) as image:
        assert image.size == (1200, 520)
        # Drawn on: the points (blue) and the CDF (red) are there, not only a frame.
        colours = {colour for _, colour in image.getcolors(1 << 20)}
        assert (31, 119, 180) in colours and (214, 39, 40) in colours
    assert "PASS" in result.stdout and "lost / duplicated" in result.stdout
    assert "hit rate 0.0% (0 hits," in result.stdout
    # Without --video-fraction: no video anywhere, and the terminal report says nothing of them.
    videos = doc["videos"]
    assert videos["fraction"] == 0 and videos["requests"]["submitted"] == 0 and videos["videos_sent"] == 0
    assert doc["throughput"]["videos_per_s"] == 0 and "video" not in result.stdout
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


def test_repeated_images_hit_the_cache_as_often_as_they_were_sent(corpus, tmp_path):
    # Half the images repeat one of the last few answered (same bytes, same kind of source), the rest
    # are fresh. Each distinct image is then looked up once without success and every other time
    # with success, nothing being evicted (small images, a 512 MiB cache): the pool's hits over the
    # run are exactly the repeats the workload sent.
    report = tmp_path / "r.json"
    result = loadtest("--corpus", str(corpus), "--requests", "40", "--warmup", "0", "--bad-fraction", "0",
                      "--repeat-fraction", "0.5", "--verify", "8", "--json", str(report))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(report.read_text())
    cache, r = doc["cache"], doc["requests"]
    sent, repeats = cache["good_images_sent"], cache["repeated_images"]
    assert doc["config"]["repeat_fraction"] == cache["repeat_fraction"] == 0.5
    assert 0.35 <= repeats / sent <= 0.65  # (the first request has nothing to repeat yet)
    assert cache["evictions"] == 0
    assert (cache["hits"], cache["misses"]) == (repeats, sent - repeats)
    assert cache["hit_rate"] == pytest.approx(repeats / sent, rel=1e-12)
    assert cache["entries"] == sent - repeats and 0 < cache["bytes"] <= cache["capacity_bytes"] == 512 << 20
    # Requests whose images were all cached were answered without a worker; the rest by one.
    hit, other = cache["latency_ms"]["all_hit"], cache["latency_ms"]["others"]
    assert hit["count"] > 0 and hit["count"] + other["count"] == r["accepted"] == 40
    assert sum(worker["requests"] for worker in doc["workers"]) == other["count"]
    assert doc["verify"] == {"checked": 8, "mismatches": 0} and doc["ok"] is True
    assert f"hit rate {repeats / sent * 100:.1f}% ({repeats} hits, {sent - repeats} misses" in result.stdout
    assert "all hits / others" in result.stdout


CASES = {  # every format the load test accepts in a corpus, and the variants of each format that matter
    "JPEG": {}, "JPEG progressive": {"progressive": True}, "JPEG grey": {"mode": "L"},
    "PNG": {}, "PNG RGBA": {"mode": "RGBA"}, "PNG palette": {"mode": "P"},
    "WEBP": {}, "WEBP lossless RGBA": {"mode": "RGBA", "lossless": True},
    "GIF": {}, "GIF animated": {"save_all": True}, "BMP": {}, "BMP palette": {"mode": "P"},
}  # fmt: skip


def _encoded(case: str) -> bytes:
    options = dict(CASES[case])
    image = Image.fromarray(photo_like(97, 61, seed=3)).convert(options.pop("mode", "RGB"))
    if options.get("save_all"):
        options["append_images"] = [image.rotate(90)]
    buffer = io.BytesIO()
    image.save(buffer, case.split()[0], **options)
    return buffer.getvalue()


@pytest.mark.parametrize("case", list(CASES))
def test_variants_decode_to_the_same_features_under_another_hash(case):
    data = _encoded(case)
    variants = Variants(data, case.split()[0])
    copies = [variants.bytes(tag) for tag in (0, 1, 2**40 + 7)]
    assert len({data, *copies}) == 4 and len({len(c) for c in copies}) == 1
    for tag, copy in zip((0, 1, 2**40 + 7), copies, strict=True):  # base64 text mostly sliced from the original's
        assert variants.b64(tag, "data:x;base64,") == "data:x;base64," + base64.b64encode(copy).decode()
    for name in ("qwen2_vl", "inkling"):
        family = pipeline_from_spec(name)
        [original, *others] = [process(family, MmInput(family.image_prompt(), [d])).items[0] for d in [data, *copies]]
        for item in others:
            assert item.feature.dtype == original.feature.dtype
            np.testing.assert_array_equal(item.feature, original.feature)
            assert item.geometry == original.geometry and item.hash != original.hash
        assert len({item.hash for item in others}) == len(others)


def test_path_sources_files_go_once_nothing_needs_them(tmp_path):
    # Every path source is a file of its own in the scratch directory: it must go once no request in
    # flight reads it and no later request may repeat it, or a long run fills the disk.
    images = [CorpusImage(tmp_path / f"i{k}.png", encode(photo_like(40, 30, seed=k), "PNG"), "PNG") for k in range(3)]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    workload = Workload(images, (7,), {1: 1, 3: 1}, ("path", "bytes"), 0.0, "http://x", 1, 0.5, scratch)
    in_flight, repeats, most = [], 0, 0
    for spec in (workload.make(index) for index in range(300)):
        sources = workload.acquire(spec)
        for ref, source in zip(spec.refs, sources, strict=True):
            if ref.kind == "path":  # the file is there, and it is this variant
                assert Path(source).read_bytes() == workload.variants[ref.image].bytes(ref.tag)
        repeats += spec.repeats
        in_flight.append(spec)
        if len(in_flight) > 4:
            workload.release(in_flight.pop(0), accepted=True)  # its images may be repeated from now on
        most = max(most, len(list(scratch.iterdir())))
        assert workload.files == len(list(scratch.iterdir()))
    assert repeats > 100 and all(isinstance(ref, Ref) for spec in in_flight for ref in spec.refs)
    assert most <= REPEAT_WINDOW + 5 * 3  # the images repeats may choose, and those of the requests in flight
    for spec in in_flight:
        workload.release(spec)
    assert len(list(scratch.iterdir())) <= REPEAT_WINDOW


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
