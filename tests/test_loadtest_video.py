"""`mmworker loadtest --video-fraction`: the built-in clips (PyAV, no ffmpeg command line), the video
mix of the request stream (and the image-only stream unchanged without it), video sources of every
kind including the media server's, the bad videos and how they are rejected, the verification digest
(videos covered, image-only digests as before), the report's video figures (and a version 3 report
still printed), and short real runs whose video requests are accepted, verified and counted apart."""

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mmworker.corpus import encode, photo_like
from mmworker.driver import ItemOutput, MmInput, process
from mmworker.errors import MmError, Outcome
from mmworker.loadtest import clips as clips_mod
from mmworker.loadtest.corpus import CorpusImage
from mmworker.loadtest.report import build_report, print_report
from mmworker.loadtest.runner import RunResult, digest_parts
from mmworker.loadtest.tally import Tally
from mmworker.loadtest.workload import BAD_KINDS, VIDEO_BAD_KINDS, ClipRef, Workload
from mmworker.pipeline import VIDEO, Grid, VideoGrid
from mmworker.registry import pipeline_from_spec

pytest.importorskip("av", reason="the `video` extra (PyAV) is not installed: pip install -e '.[video]'")

S, P, E, V = 151652, 151655, 151653, 151656  # Qwen2's vision start, image pad, vision end, video pad


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    """A cache directory holding the built-in clips, made as the load test makes them (their module
    run as a program), so that no test reads or writes the user's cache."""
    home = tmp_path_factory.mktemp("cache")
    directory = home / "mmworker" / clips_mod.default_dir(0).name
    subprocess.run([sys.executable, "-m", "mmworker.loadtest.clips", str(directory), "0"], check=True, timeout=300)
    return home


@pytest.fixture(scope="module")
def clips(cache_home):
    return clips_mod.load(cache_home / "mmworker" / clips_mod.default_dir(0).name)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("corpus")
    for k, (w, h, fmt) in enumerate([(320, 240, "JPEG"), (200, 150, "PNG"), (256, 256, "WEBP")]):
        (directory / f"img{k}.{fmt.lower()}").write_bytes(encode(photo_like(w, h, seed=k), fmt))
    return directory


def _images(directory: Path) -> list[CorpusImage]:
    fmts = {".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP"}
    return [CorpusImage(p, p.read_bytes(), fmts[p.suffix]) for p in sorted(directory.iterdir())]


def test_clips_are_what_their_recipes_say(clips, tmp_path):
    from mmworker.common.video import probe

    by_name = {clip.name: clip for clip in clips}
    assert len(clips) == len(clips_mod.DEFAULT_CLIPS)
    for name, recipe, _, _ in clips_mod.default_clips():
        clip = by_name[name]
        info = probe(clip.data)
        assert (info.width, info.height) == (recipe.width, recipe.height), clip.name
        assert info.frames == round(recipe.fps * recipe.seconds) and info.fps == pytest.approx(recipe.fps), clip.name
    assert {clip.path.suffix for clip in clips} >= {".mp4", ".avi"} and any(c.truncatable for c in clips)
    # Deterministic: made again, the same bytes (a cached corpus stays valid).
    name, recipe, codec, ext = clips_mod.default_clips()[3]
    again = clips_mod.encode_clip(codec, ext, recipe.width, recipe.height, recipe.fps, recipe.seconds, 4)
    assert again == next(c for c in clips if c.name == name).data


def _workload(images, clips, fraction, bad=0.0, seed=3, kinds=("bytes", "data", "base64", "path", "http"), **extra):
    scratch = extra.pop("scratch")
    video = {"clips": clips, "video_prompt": (S, V, E), "video_fraction": fraction} if clips is not None else {}
    return Workload(images, (S, P, E), {1: 60, 2: 25, 3: 10, 4: 5}, kinds, bad, "http://127.0.0.1:1", seed, 0.0,
                    scratch, **video)  # fmt: skip


def test_without_videos_the_stream_is_the_image_only_one(corpus, clips, tmp_path):
    # --video-fraction 0 changes nothing, draw for draw: the same requests, none with a video.
    images = _images(corpus)
    before = _workload(images, None, 0.0, bad=0.2, scratch=tmp_path)
    after = _workload(images, clips, 0.0, bad=0.2, scratch=tmp_path)
    for index in range(400):
        a, b = before.make(index), after.make(index)
        assert (a.input_ids, a.refs, a.kind, a.images, a.repeats) == (b.input_ids, b.refs, b.kind, b.images, b.repeats)
        assert b.videos == ()


def test_the_video_mix(corpus, clips, tmp_path):
    images = _images(corpus)
    workload = _workload(images, clips, 0.4, bad=0.2, scratch=tmp_path)
    specs = [workload.make(index) for index in range(2000)]
    with_video = [spec for spec in specs if spec.videos]
    assert 0.35 <= len(with_video) / len(specs) <= 0.45
    video_first = image_first = 0
    for spec in specs:
        ids = spec.input_ids
        assert ids.count(V) == len(spec.videos)
        assert ids.count(P) == spec.images or spec.kind == "placeholder"
        if not spec.videos:
            assert spec.kind == "good" or spec.kind in BAD_KINDS
            continue
        assert len(spec.videos) == 1 and spec.images in (0, 1) and ids[ids.index(V) - 1] == S
        if spec.images:
            video_first += ids.index(V) < ids.index(P)
            image_first += ids.index(P) < ids.index(V)
        assert spec.kind == "good" or spec.kind in VIDEO_BAD_KINDS
        if spec.kind == "video_truncated":
            assert spec.videos[0].cut and clips[spec.videos[0].clip].truncatable
    assert video_first > 50 and image_first > 50  # mixed prompts: the video anywhere among the text and images
    bad = [spec for spec in with_video if spec.kind != "good"]
    assert 0.15 <= len(bad) / len(with_video) <= 0.25 and {spec.kind for spec in bad} == set(VIDEO_BAD_KINDS)
    kinds = {spec.videos[0].kind for spec in with_video if isinstance(spec.videos[0], ClipRef)}
    assert kinds == {"bytes", "data", "base64", "path", "http"}


def test_video_sources_of_every_kind_carry_the_clip(corpus, clips, tmp_path):
    workload = _workload(_images(corpus), clips, 1.0, scratch=tmp_path)
    for k, clip in enumerate(clips):
        sources = {
            kind: workload.video_source(ClipRef(k, kind)) for kind in ("bytes", "data", "base64", "path", "http")
        }
        assert sources["bytes"] == clip.data
        assert base64.b64decode(sources["data"].split(",", 1)[1]) == clip.data
        assert sources["data"].startswith("data:video/")
        assert base64.b64decode(sources["base64"]) == clip.data
        assert Path(sources["path"]).read_bytes() == clip.data
        assert sources["http"] == f"http://127.0.0.1:1/videos/{clip.name}"
        assert workload.video_source(ClipRef(k, "bytes", cut=True)) == clip.data[: len(clip.data) // 3]


def test_the_media_server_serves_the_clips(corpus, clips):
    clip_dir = clips[0].path.parent
    server = subprocess.Popen([sys.executable, "-m", "mmworker.loadtest.mediaserver", str(corpus), str(os.getpid()),
                               str(clip_dir)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        base = f"http://127.0.0.1:{server.stdout.readline().strip()}"
        for clip in clips:
            with urllib.request.urlopen(f"{base}/videos/{clip.name}", timeout=10) as response:
                assert response.read() == clip.data
        with urllib.request.urlopen(f"{base}/img0.jpeg", timeout=10) as response:  # the images still
            assert response.read() == (corpus / "img0.jpeg").read_bytes()
        for missing in ("/videos/nope.mp4", "/videos/..%2Fimg0.jpeg", "/videos/.complete"):
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(base + missing, timeout=10)
            assert caught.value.code == 404, missing
    finally:
        server.kill()
        server.wait()
        server.stdout.close()


def test_bad_videos_are_rejected_in_process_for_their_reason(corpus, clips, tmp_path):
    # What the load test expects of each bad video, checked on the driver (the pool's workers run it).
    family = pipeline_from_spec("qwen2_5_vl")
    workload = _workload(_images(corpus), clips, 1.0, bad=1.0, kinds=("bytes",), scratch=tmp_path)
    seen = set()
    for spec in (workload.make(index) for index in range(16)):
        assert spec.kind in VIDEO_BAD_KINDS
        seen.add(spec.kind)
        with pytest.raises(MmError) as caught:
            process(family, MmInput(spec.input_ids, workload.acquire(spec), workload.video_sources(spec)))
        outcome, text = spec.expected
        assert caught.value.kind is outcome is Outcome.BAD_INPUT and text in str(caught.value), str(caught.value)
        assert str(caught.value).startswith("video 0: ")
    assert seen == set(VIDEO_BAD_KINDS)


def _image_items() -> list[ItemOutput]:
    first = np.arange(48, dtype=np.float32).reshape(8, 6) / 7
    second = np.arange(24, dtype=np.uint16).reshape(4, 6) * 2711
    return [ItemOutput(first, {"image_grid_thw": np.array([1, 2, 4], np.int64)}, 0x1234_5678_9ABC_DEF0, Grid(1, 2, 4)),
            ItemOutput(second, {"image_grid_thw": np.array([1, 2, 2], np.int64)}, 42, Grid(1, 2, 2))]  # fmt: skip


def test_the_digest_of_image_only_requests_is_as_before_and_videos_are_covered():
    ids, positions = np.arange(20, dtype=np.int64), np.arange(60, dtype=np.int64).reshape(3, 20)
    items = _image_items()
    offsets, runs = [(2, 3), (8, 8)], [((2, 3),), ((8, 8),)]
    # The digest version 3 of the load test computed for this request (its runs are its offsets).
    before = "d23bddb63eb8c5773e110989b0c781e40097a48e195e4efd5e82bb2ea1bd9c5b"
    assert digest_parts(ids, offsets, positions, -5, items) == before
    assert digest_parts(ids, offsets, positions, -5, items, runs) == before
    # A video: its runs, its modality and its float aux (second_per_grid_ts) all count.
    grid = {"video_grid_thw": np.array([2, 2, 2], np.int64), "second_per_grid_ts": np.array([2 / 24], np.float32)}
    video = ItemOutput(np.ones((8, 6), np.float32), grid, 7, VideoGrid(2, 2, 2, 2 / 24), VIDEO)
    offsets, runs = [(2, 3), (10, 15)], [((2, 3),), ((10, 11), (14, 15))]
    digest = digest_parts(ids, offsets, positions, -5, [items[0], video], runs)
    other_runs = [((2, 3),), ((10, 12), (14, 15))]
    assert digest_parts(ids, offsets, positions, -5, [items[0], video], other_runs) != digest
    as_image = ItemOutput(video.feature, video.aux, 7, video.geometry)
    assert digest_parts(ids, offsets, positions, -5, [items[0], as_image], runs) != digest
    later = {**grid, "second_per_grid_ts": np.array([2 / 25], np.float32)}
    slower = ItemOutput(video.feature, later, 7, video.geometry, VIDEO)
    assert digest_parts(ids, offsets, positions, -5, [items[0], slower], runs) != digest
    assert digest_parts(ids, offsets, positions, -5, [items[0], video], runs, corrupt=True) != digest


def _report(tally: Tally, config: dict) -> dict:
    result = RunResult(tally=tally, started=0.0, ended=10.0, measured_from=0.0)
    config = {"mode": "closed loop, 2 in flight", "warmup_s": 0.0, "workers": 1, "spec_name": "qwen2_vl", **config}
    stats = SimpleNamespace(shm_peak_held_bytes=0, restarts=0)
    return build_report(result, config=config, pool_stats=stats, worker_pids=[1], ring_mib=64, verified=0,
                        mismatches=[], inline=None)  # fmt: skip


def test_the_report_counts_video_requests_apart_and_still_prints_version_3(capsys):
    tally = Tally()
    answer = {"kind": "good", "expected": None, "warmup": False, "error": None, "answered_s": 1.0,
              "parts_ms": (1.0, 1.0, 1.0, 1.0), "worker": 0}  # fmt: skip
    for k in range(6):
        tally.submit(False, 1, 0, videos=1, good_videos=1)
        tally.add(**answer, images=1, outcome=Outcome.ACCEPTED, latency_ms=100.0 + k, videos=1, cache_hits=1)
    for k in range(10):
        tally.submit(False, 2)
        tally.add(**answer, images=2, outcome=Outcome.ACCEPTED, latency_ms=10.0 + k)
    tally.submit(False, 0, videos=1)
    bad = {**answer, "kind": "video_corrupt", "expected": (Outcome.BAD_INPUT, "video decode")}
    tally.add(**{**bad, "error": "video 0: video decode: cannot read the container"}, images=0,
              outcome=Outcome.BAD_INPUT, latency_ms=1.0, videos=1)  # fmt: skip
    report = _report(tally, {"video_fraction": 0.4, "video_clips": 5})
    videos = report["videos"]
    assert report["version"] == 4 and videos["fraction"] == 0.4 and videos["clips"] == 5 and videos["videos_sent"] == 6
    assert videos["requests"]["submitted"] == 7 and videos["requests"]["accepted"] == 6
    assert videos["requests"]["expected_bad"] == videos["requests"]["rejected"] == 1 and report["ok"] is True
    assert videos["rejects_by_kind"] == {"bad_input": 1} and report["requests"]["submitted"] == 17
    latency = videos["latency_ms"]
    assert latency["video"]["count"] == 6 and latency["image_only"]["count"] == 10
    assert 100 <= latency["video"]["p50"] <= 105 and 10 <= latency["image_only"]["p99"] <= 19
    # A request with a video is never "all hits", whatever its images were.
    assert report["cache"]["latency_ms"]["all_hit"]["count"] == 0
    assert report["throughput"]["videos_per_s"] == pytest.approx(0.6) and report["workers"][0]["videos"] == 6
    print_report(report)
    out = capsys.readouterr().out
    assert "0.60 videos/s" in out and "with a video" in out and "video / image-only" in out and "6 videos" in out
    # A version 3 report (no video figures) is still printed, without video rows.
    old = json.loads(json.dumps(report))
    del old["videos"], old["throughput"]["videos_per_s"]
    for worker in old["workers"]:
        del worker["videos"]
    old["version"] = 3
    print_report(old)
    out = capsys.readouterr().out
    assert "PASS" in out and "video" not in out


def loadtest(*args, cache_home, timeout=300):
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    return subprocess.run([sys.executable, "-m", "mmworker", "loadtest", "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)  # fmt: skip


def test_short_run_with_videos_accepts_verifies_and_rejects_them(corpus, cache_home, tmp_path):
    # Every accepted request verified (K above the count): video requests' features, runs and
    # positions are byte for byte those of the driver in process; bad videos are rejected for their
    # reason and counted as expected.
    report = tmp_path / "r.json"
    result = loadtest("--corpus", str(corpus), "--requests", "40", "--warmup", "0", "--workers", "1",
                      "--video-fraction", "0.5", "--bad-fraction", "0.3", "--verify", "100", "--json", str(report),
                      cache_home=cache_home)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(report.read_text())
    r, v = doc["requests"], doc["videos"]["requests"]
    assert doc["ok"] is True and r["submitted"] == r["answered"] == 40 and r["good_rejected"] == 0
    assert doc["verify"] == {"checked": r["accepted"], "mismatches": 0}
    assert v["accepted"] > 0 and v["accepted"] == doc["videos"]["videos_sent"] == doc["workers"][0]["videos"]
    assert v["expected_bad"] > 0 and v["rejected"] == v["expected_bad"] and v["bad_wrong_reason"] == 0
    assert doc["videos"]["rejects_by_kind"] == {"bad_input": v["rejected"]}
    assert doc["videos"]["latency_ms"]["video"]["count"] == v["accepted"] and doc["throughput"]["videos_per_s"] > 0
    assert doc["config"]["video_fraction"] == 0.5 and doc["config"]["video_clips"] == len(clips_mod.DEFAULT_CLIPS)
    assert "with a video" in result.stdout and "videos/s" in result.stdout and "PASS" in result.stdout


def test_verify_catches_a_corrupted_video_reply(corpus, cache_home, tmp_path):
    # Every request has a video, fetched from the media server; the corrupted digest is the video's
    # feature's (the last item's): --verify must see it.
    report = tmp_path / "r.json"
    result = loadtest("--corpus", str(corpus), "--requests", "8", "--warmup", "0", "--workers", "1",
                      "--video-fraction", "1", "--bad-fraction", "0", "--sources", "http", "--verify", "3",
                      "--corrupt-sample", "--json", str(report), cache_home=cache_home)  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    doc = json.loads(report.read_text())
    assert doc["requests"]["accepted"] == doc["videos"]["requests"]["accepted"] == 8
    assert doc["verify"]["mismatches"] == 3 and any("differ from in-process" in f for f in doc["failures"])
