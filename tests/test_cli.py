"""The `mmworker` command, run as a user runs it (a subprocess): demo, process (images and videos),
plan, --version, `python -m mmworker`, every mistake ending in one line and exit status 2 before any
work starts, Ctrl-C during a load test, the first run's corpus generation, and a family other than
Qwen's."""

import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from processes import all_end_within, ended, line_within, segments_of

from mmworker.corpus import encode, photo_like
from mmworker.driver import MmInput, item_name, process
from mmworker.qwen_vl import NAMED_SPECS, QwenVL
from mmworker.qwen_vl.video_layout import TIMESTAMP_PIECES
from mmworker.runtime import TUNED_ENV, is_tuned, tuned_environ

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: str | None = None, env: dict | None = None, timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "mmworker", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small image directory, so that a load test starts in seconds."""
    directory = tmp_path_factory.mktemp("corpus")
    for k, (w, h, fmt) in enumerate([(320, 240, "JPEG"), (200, 150, "PNG"), (256, 256, "WEBP")]):
        (directory / f"img{k}.{fmt.lower()}").write_bytes(encode(photo_like(w, h, seed=k), fmt))
    return directory


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache directory, so that no test reads or writes the user's built-in corpus."""
    home = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


def test_demo_on_bundled_sample():
    result = run_cli("demo")
    assert result.returncode == 0, result.stderr
    assert "bundled sample (sample.jpg): JPEG" in result.stdout
    assert "decode      640x480 RGB" in result.stdout
    for resample in ("pil_lanczos", "pil_bicubic", "aten_u8"):
        assert f"resize      {resample}" in result.stdout


def test_demo_on_a_file_with_explicit_size(tmp_path):
    path = tmp_path / "img.png"
    path.write_bytes(encode(photo_like(40, 30, seed=3), "PNG"))
    result = run_cli("demo", str(path), "--size", "17", "9")
    assert result.returncode == 0, result.stderr
    assert "PNG" in result.stdout and "-> 17x9" in result.stdout


def test_demo_reports_a_bad_source_as_an_error():
    result = run_cli("demo", "/no/such/image.png")
    assert result.returncode == 2
    assert "mmworker: error: media fetch: /no/such/image.png: No such file or directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_corpus_is_deterministic_and_photo_like():
    a, b = photo_like(64, 48, seed=7), photo_like(64, 48, seed=7)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, photo_like(64, 48, seed=8))
    assert a.shape == (48, 64, 3) and a.std() > 10  # neither flat nor constant


def test_tuned_environment():
    env = tuned_environ({"PATH": "/bin"})
    assert env["PATH"] == "/bin" and is_tuned(env)
    assert all(env[k] == v for k, v in TUNED_ENV.items())
    assert not is_tuned({})


def test_process_describes_the_request(tmp_path):
    path = tmp_path / "img.jpg"
    path.write_bytes(encode(photo_like(640, 480, seed=4), "JPEG"))
    result = run_cli("process", str(path), str(path), "--prompt-ids", "7,151655,8,151655")
    assert result.returncode == 0, result.stderr
    assert "image 0: grid 1x34x46, 391 tokens at (1, 391)" in result.stdout
    assert "image 1: grid 1x34x46, 391 tokens at (393, 783)" in result.stdout
    assert "feature float32[1564, 1176]" in result.stdout
    assert "prompt 4 -> 784 token(s)" in result.stdout


def test_process_errors_name_the_cause(tmp_path):
    result = run_cli("process", "/no/such.png", "--family", "qwen3_5")
    assert result.returncode == 2 and "image 0: media fetch: /no/such.png" in result.stderr
    result = run_cli("process", "/no/such.png", "--family", "llava")
    assert result.returncode == 2 and "unknown named spec 'llava'" in result.stderr


def test_plan_prints_the_core_map_and_how_workers_are_scheduled(tmp_path):
    core = sorted(os.sched_getaffinity(0))[0]
    config = tmp_path / "pool.toml"
    config.write_text(f'workers = 1\ncores = "{core}"\nring_mib = 64\nworker_sched = "normal"\nworker_nice = 5\n')
    result = run_cli("plan", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert f"worker 0: core {core}" in result.stdout
    assert "workers: ordinary tasks, 5 nicer than this process\n" in result.stdout
    assert "ring per worker: 64 MiB" in result.stdout
    config.write_text(f'workers = 1\ncores = "{core}"\n')  # "auto"
    result = run_cli("plan", "--config", str(config))
    others = len(os.sched_getaffinity(0)) > 1
    assert ("workers: SCHED_IDLE" in result.stdout) == others, result.stdout
    assert 'worker_sched "auto" chose this' in result.stdout
    config.write_text('worker_sched = "batch"\n')
    result = run_cli("plan", "--config", str(config))
    assert result.returncode == 2 and 'worker_sched must be "auto", "idle" or "normal"' in result.stderr


def test_version_everywhere_is_pyproject_s():
    import mmworker

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert mmworker.__version__ == version
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout == f"mmworker {version}\n", result.stderr
    script = Path(sys.executable).with_name("mmworker")  # the console script pip installed
    if script.exists():
        result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
        assert result.stdout == f"mmworker {version}\n", result.stderr


def test_python_dash_m_mmworker_runs_the_command():
    result = subprocess.run([sys.executable, "-m", "mmworker"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "the following arguments are required: command" in result.stderr
    result = run_cli("--help")
    assert result.returncode == 0 and all(c in result.stdout for c in ("demo", "process", "loadtest", "plan"))


def test_process_a_relative_path_and_the_inkling_family(tmp_path):
    (tmp_path / "img.png").write_bytes(encode(photo_like(300, 200, seed=1), "PNG"))
    result = run_cli("process", "--family", "inkling", "img.png", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("spec inkling: inkling: patch 40")
    assert "image 0: grid 1x10x16, 160 tokens at (0, 159)" in lines[1] and "feature uint16[160, 4800]" in lines[1]
    assert lines[2].startswith("prompt 1 -> 160 token(s), 1-D positions, ")  # no M-RoPE delta to show
    result = run_cli("process", "img.png", cwd=str(tmp_path))  # the default family, its own image prompt
    assert result.returncode == 0, result.stderr
    assert "prompt 3 -> 79 token(s), M-RoPE delta -66" in result.stdout


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Two small clips made with PyAV (no ffmpeg command line): H.264 in MP4 (or MPEG-4 part 2 where
    PyAV's FFmpeg has no libx264) and MJPEG in AVI, 2 and 3 s."""
    pytest.importorskip("av", reason="the `video` extra (PyAV) is not installed: pip install -e '.[video]'")
    from mmworker.loadtest.clips import ClipRecipe, available_codec, encode_clip

    directory = tmp_path_factory.mktemp("clips")
    codec, ext = available_codec(ClipRecipe("cli", (("libx264", "mp4"), ("mpeg4", "mp4")), 0, 0, 0, 0))
    first = directory / f"pan.{ext}"
    first.write_bytes(encode_clip(codec, ext, 320, 180, 25, 2.0, seed=5))
    second = directory / "cam.avi"
    second.write_bytes(encode_clip("mjpeg", "avi", 160, 96, 15, 3.0, seed=6))
    return first, second


def _expected_lines(family, ids: list[int], images: list, videos: list) -> list[str]:
    """What `process` must print per item (its time apart), from the same request run here."""
    out = process(family, MmInput(ids, images, videos))
    lines = []
    for i, (item, runs) in enumerate(zip(out.items, out.runs, strict=True)):
        g = item.geometry
        tokens = sum(e - s + 1 for s, e in runs)
        where = f"at {runs[0]}" if len(runs) == 1 else f"in {len(runs)} runs, first {runs[0]}, last {runs[-1]}"
        lines.append(f"{item_name(i, len(images))}: grid {g.t}x{g.h}x{g.w}, {tokens} tokens {where}, "
                     f"hash {item.hash:#018x}, feature {item.feature.dtype}{list(item.feature.shape)}, ")  # fmt: skip
    return lines


def test_process_describes_images_and_videos(tmp_path, clips):
    # An image and two videos (a path, a data: URL), the default prompt: each item as the driver
    # computes it, the videos' timing, and the prompt in the order image, video, video.
    first, second = clips
    image = tmp_path / "img.jpg"
    image.write_bytes(encode(photo_like(640, 480, seed=4), "JPEG"))
    data_url = "data:video/x-msvideo;base64," + base64.b64encode(second.read_bytes()).decode()
    result = run_cli("process", "--family", "qwen2_5_vl", str(image), "--video", str(first), "--video", data_url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    family = QwenVL.from_spec(NAMED_SPECS["qwen2_5_vl"])
    ids = [*family.image_prompt(), *family.video_prompt() * 2]
    expected = _expected_lines(family, ids, [image.read_bytes()], [first.read_bytes(), second.read_bytes()])
    assert lines[1].startswith(expected[0]) and lines[1].endswith(" ms"), (lines, expected)
    assert lines[2].startswith(expected[1]) and lines[3] == "  second_per_grid 0.0833333 s", lines
    assert lines[4].startswith(expected[2]) and lines[5] == "  second_per_grid 0.0833333 s", lines
    # 2 s and 3 s, sampled at 2 frames a second, two frames a temporal patch
    assert "video 0: grid 2x" in lines[2] and "video 1: grid 3x" in lines[4]
    assert lines[6].startswith("prompt 9 -> ") and "M-RoPE delta" in lines[6] and "(fetching" in lines[6]
    # A video alone, the default family (qwen2_vl: no timing in its positions), a relative path.
    result = run_cli("process", "--video", first.name, cwd=str(first.parent))
    assert result.returncode == 0, result.stderr
    family = QwenVL.from_spec(NAMED_SPECS["qwen2_vl"])
    expected = _expected_lines(family, list(family.video_prompt()), [], [first.read_bytes()])
    lines = result.stdout.splitlines()
    assert lines[1].startswith(expected[0]) and lines[2] == "  no timing (this model's positions do not use it)"
    assert lines[3].startswith("prompt 3 -> ")


def test_process_a_qwen3_video_with_a_timestamp_table(tmp_path, clips):
    # Qwen3's bundled specs have no timestamp table (only the checkpoint's tokenizer gives one): with
    # one added to a spec file, a video is one run per temporal patch, its timestamps between.
    table = {piece: [1000 + k] if len(piece) == 1 else [2000, 2001] for k, piece in enumerate(TIMESTAMP_PIECES)}
    spec = {**NAMED_SPECS["qwen3_vl"], "family": "qwen_vl", "timestamp_table": table}
    path = tmp_path / "qwen3.json"
    path.write_text(json.dumps(spec))
    _, second = clips
    result = run_cli("process", "--spec", str(path), "--video", str(second))
    assert result.returncode == 0, result.stderr
    family = QwenVL.from_spec(spec)
    [expected] = _expected_lines(family, list(family.video_prompt()), [], [second.read_bytes()])
    lines = result.stdout.splitlines()
    assert lines[1].startswith(expected) and " in 3 runs, first " in lines[1], (lines, expected)
    # 45 frames at 15 fps, frames 0, 8, 17, 26, 35, 44 sampled: each pair's mean time
    assert lines[2] == "  timestamps 0.3, 1.4, 2.6 s (3, one per temporal patch)", lines


def _mistakes(tmp: Path, corpus: Path) -> list[tuple[list[str], str]]:
    (tmp / "notes.txt").write_text("these are notes, not a spec\n")
    (tmp / "list.json").write_text("[1, 2]")
    load = ["loadtest", "--no-progress", "--requests", "5", "--corpus", str(corpus)]
    return [
        ([*load, "--json", str(tmp / "missing" / "r.json")], f"--json {tmp}/missing/r.json: no such directory"),
        ([*load, "--plot", str(tmp / "missing" / "p.png")], f"--plot {tmp}/missing/p.png: no such directory"),
        ([*load, "--json", str(tmp)], "is a directory"),
        (["loadtest", "--corpus", "/nonexistent"], "--corpus /nonexistent: no such directory"),
        ([*load, "--sweep-workers", "1,x"], "--sweep-workers '1,x': expected worker counts separated by commas"),
        ([*load, "--sweep-workers", "0"], "--sweep-workers '0': every worker count must be 1 or more"),
        ([*load, "--sweep-workers", "1,2", "--workers", "1"], "--workers and --sweep-workers are exclusive"),
        ([*load, "--spec", str(tmp / "missing.json")], f"--spec {tmp}/missing.json: no such file"),
        ([*load, "--spec", str(tmp / "notes.txt")], f"--spec {tmp}/notes.txt: not a JSON spec"),
        ([*load, "--compare-inline", "--rate", "5"], "--compare-inline compares the pool's throughput"),
        ([*load, "--plot", str(tmp / "p.png"), "--sweep-workers", "1,2"], "--plot draws one run"),
        (["process", "--spec", str(tmp / "missing.json"), "x.jpg"], f"--spec {tmp}/missing.json: no such file"),
        (["process", "--spec", str(tmp / "notes.txt"), "x.jpg"], f"--spec {tmp}/notes.txt: not a JSON spec"),
        (["process", "--spec", str(tmp / "list.json"), "x.jpg"], "a JSON object is expected, not list"),
        (["process", "nope.jpg"], "image 0: media fetch: nope.jpg: No such file or directory"),
        (["process", "--video", "nope.mp4"], "video 0: media fetch: nope.mp4: No such file or directory"),
        (["process"], "process: give at least one image, or a video with --video"),
        (["process", "--family", "inkling", "--video", "v.mp4"], "--video: spec inkling serves no videos (inkling: "),
        (["process", "--family", "qwen3_vl", "--video", "v.mp4"],
         "--video: spec qwen3_vl serves no videos: qwen3_vl needs the spec's `timestamp_table`"),
        (["process", "--family", "qwen3_5", "--video", "v.mp4"], "pass it with --spec FILE"),
        (["demo", "nope.jpg"], "media fetch: nope.jpg: No such file or directory"),
    ]  # fmt: skip


def test_every_mistake_is_one_line_and_exit_status_2_before_anything_runs(tmp_path, corpus, cache):
    mistakes = _mistakes(tmp_path, corpus)
    # All at once: each is a fresh interpreter that spends its time importing.
    procs = [subprocess.Popen([sys.executable, "-m", "mmworker", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=str(tmp_path)) for args, _ in mistakes]  # fmt: skip
    try:
        for (args, message), proc in zip(mistakes, procs, strict=True):
            out, err = proc.communicate(timeout=120)
            where = f"mmworker {' '.join(args)}"
            assert proc.returncode == 2, (where, out, err)
            assert err.count("\n") == 1 and err.startswith("mmworker: error: "), (where, err)
            assert message in err, (where, err)
            assert out == "", (where, out)  # no corpus, no run, no report
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not cache.exists()  # nothing generated either


def test_first_run_announces_the_corpus_it_generates(corpus, cache):
    # The built-in corpus, all but its last image already there (stand-ins: the real ones take long
    # to make), as an interrupted first run leaves it: the generator makes the one missing, once.
    from mmworker.loadtest.corpus import default_dir, default_images

    directory = default_dir(0)
    directory.mkdir(parents=True)
    stand_in = (corpus / "img0.jpeg").read_bytes()
    *present, (missing, _, _, _) = default_images()
    for name, *_ in present:
        (directory / name).write_bytes(stand_in)
    args = ("loadtest", "--no-progress", "--requests", "4", "--warmup", "0", "--workers", "1", "--verify", "2")
    result = run_cli(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"generating the image corpus in {directory} (first run only)\n")
    assert (directory / missing).exists() and (directory / ".complete").exists()
    result = run_cli(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "generating" not in result.stdout


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def test_ctrl_c_stops_cleanly_with_the_partial_report(tmp_path, corpus):
    report = tmp_path / "r.json"
    # Its own process group, SIGINT at its default: as a command started from an interactive shell.
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmworker", "loadtest", "--duration", "120", "--warmup", "0", "--workers", "2",
         "--corpus", str(corpus), "--json", str(report)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        first = line_within(proc.stdout, 120, "the first progress line")  # the load has started
        assert "answered" in first, first
        children = _children(proc.pid)
        assert len(children) >= 4, children  # media server, I/O process, two workers
        workers = [pid for pid in children if "mmworker.pool.worker" in Path(f"/proc/{pid}/cmdline").read_text()]
        busy, deadline = _cpu_s(workers) + 0.5, time.monotonic() + 60
        while _cpu_s(workers) < busy and time.monotonic() < deadline:  # the workers have done some work
            time.sleep(0.05)
        assert _cpu_s(workers) >= busy, "the workers did not get to work within 60 s"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: the foreground group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "INTERRUPTED" in out and "verdict" in out and f"wrote report to {report}" in out, out
    doc = json.loads(report.read_text())
    r = doc["requests"]
    assert doc["interrupted"] is True and doc["ok"] is True, doc["failures"]
    assert r["answered"] > 0 and r["lost"] == 0 and r["submitted"] == r["answered"] + r["abandoned"]
    assert sum(w["requests"] for w in doc["workers"]) == r["accepted"]
    assert all_end_within(children, 10), [pid for pid in children if not ended(pid)]
    assert segments_of(proc.pid) == []
    assert not list(Path(tempfile.gettempdir()).glob(f"mmworker-{proc.pid}-*"))  # the pool's socket directory
    assert not list(Path(tempfile.gettempdir()).glob(f"mmworker-loadtest-{proc.pid}-*"))  # the path sources' files
