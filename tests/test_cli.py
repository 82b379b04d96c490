"""The `mmworker` command: the demo on the bundled sample, on a user file, and its error path."""

import os
import subprocess
import sys

import numpy as np

from mmworker.corpus import encode, photo_like
from mmworker.runtime import TUNED_ENV, is_tuned, tuned_environ


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmworker.cli", *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


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
