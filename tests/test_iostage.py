"""The I/O process on its own: per-source byte caps in its Job args, driven over its real channel.

Each test starts `python -m mmworker.pool.iostage` as the pool does (a Router in a private runtime
directory, the child connecting as IO_IDENTITY) and sends it Jobs the way the pool client would, so
the args contract (module docstring of mmworker.pool.iostage) is checked end to end: real downloads
from a server on 127.0.0.1, real file reads, the bytes coming back as payload frames.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from httpserver import MediaServer, pattern

from ipc.channels import Router, RuntimeDir, new_context
from ipc.wire import Done, Failed, Hello, Job
from mmworker.common.budget import MAX_FETCH_BYTES, MAX_REQUEST_BYTES, MAX_VIDEO_FETCH_BYTES
from mmworker.errors import Outcome
from mmworker.pool.protocol import IO_IDENTITY

ROOT = Path(__file__).resolve().parent.parent
BIG_CAP = MAX_FETCH_BYTES + (1 << 20)  # above 64 MiB, yet no test moves more than 65 MiB per source
OVER_64_MIB = MAX_FETCH_BYTES + (512 << 10)


class IoProcess:
    """One I/O process and the Router it answers; `run` sends a Job and returns its answer."""

    def __init__(self, media: dict) -> None:
        self.rundir = RuntimeDir()
        self.ctx = new_context()
        self.router = Router(self.ctx, self.rundir.endpoint("io"))
        args = {"endpoint": self.router.endpoint, "parent": os.getpid(), "cores": None, "nice": 0,
                "sched": "normal", "concurrency": 4, "media": media}  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "mmworker.pool.iostage", json.dumps(args)], env=env)
        peer, hello, _ = self._recv(30.0)
        assert peer == IO_IDENTITY and isinstance(hello, Hello) and hello.pid == self.proc.pid

    def _recv(self, timeout: float) -> tuple:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.router.recv()
            if got is not None:
                return got
            assert self.proc.poll() is None, f"the I/O process exited with code {self.proc.returncode}"
            self.router.poll(50)
        raise AssertionError(f"no message from the I/O process within {timeout} s")

    def run(self, rid: int, args: dict, timeout: float = 60.0) -> tuple[Done | Failed, list[bytes]]:
        self.router.send(IO_IDENTITY, Job(rid, 0, 0, args))
        peer, answer, payload = self._recv(timeout)
        assert peer == IO_IDENTITY and answer.rid == rid
        return answer, [bytes(frame.buffer) for frame in payload]

    def close(self) -> None:
        self.proc.terminate()  # how the pool ends it
        self.proc.wait(10)
        self.router.close()
        self.ctx.term()
        self.rundir.close()


@pytest.fixture
def server():
    srv = MediaServer()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def io(tmp_path):
    stage = IoProcess({"allow_private": True, "allowed_local_roots": [str(tmp_path)]})
    try:
        yield stage
    finally:
        stage.close()
    assert stage.proc.returncode == -15  # it was still serving: no job made it exit


def _sparse(path: Path, size: int) -> str:
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


def _job(sources: list[str], caps: list | None = None, budget: int = MAX_REQUEST_BYTES, **extra) -> dict:
    args = {"sources": sources, "indices": list(range(len(sources))), "budget": budget, **extra}
    if caps is not None:
        args["caps"] = caps
    return args


def test_each_source_is_fetched_under_its_own_cap(io, server, tmp_path):
    video_url = server.url(f"/chunked/{OVER_64_MIB}")
    video_file = _sparse(tmp_path / "clip.mp4", OVER_64_MIB)
    sources = [server.url("/bytes/1000"), video_url, video_file, f"file://{video_file}"]
    done, payload = io.run(1, _job(sources, caps=[1000, BIG_CAP, BIG_CAP, MAX_VIDEO_FETCH_BYTES]))
    assert isinstance(done, Done) and done.frames == 4, done
    assert [len(p) for p in payload] == [1000, OVER_64_MIB, OVER_64_MIB, OVER_64_MIB]
    assert payload[0] == pattern(1000)
    assert payload[1][-4096:] == pattern(OVER_64_MIB)[-4096:]


def test_without_caps_every_source_keeps_the_64_mib_cap(io, server, tmp_path):
    video_file = _sparse(tmp_path / "clip.mp4", OVER_64_MIB)
    failed, _ = io.run(2, _job([server.url("/bytes/10"), video_file]))
    assert isinstance(failed, Failed) and failed.kind == Outcome.BAD_INPUT.value
    assert failed.error == f"image 1: media fetch: {video_file}: exceeds {MAX_FETCH_BYTES} bytes"
    url = server.url(f"/chunked/{OVER_64_MIB}")
    failed, _ = io.run(3, _job([url], caps=None))
    assert failed.error == f"image 0: media fetch: {url}: exceeds {MAX_FETCH_BYTES} bytes"


@pytest.mark.parametrize("route", ["bytes", "chunked"])
def test_a_source_past_its_cap_fails_naming_that_cap(io, server, tmp_path, route):
    url = server.url(f"/{route}/{BIG_CAP + 1}")
    failed, _ = io.run(4, _job([server.url("/bytes/10"), url], caps=[10, BIG_CAP]))
    assert isinstance(failed, Failed)
    assert failed.error == f"image 1: media fetch: {url}: exceeds {BIG_CAP} bytes"
    small = tmp_path / "small"
    small.write_bytes(os.urandom(100))
    failed, _ = io.run(5, _job([str(small), url], caps=[99, MAX_VIDEO_FETCH_BYTES]))
    assert failed.error == f"image 0: media fetch: {small}: exceeds 99 bytes"  # the lowest failing index


def test_the_shared_budget_still_wins_where_it_is_smaller_than_a_cap(io, server, tmp_path):
    url = server.url(f"/chunked/{2 << 20}")
    failed, _ = io.run(6, _job([url], caps=[MAX_VIDEO_FETCH_BYTES], budget=1 << 20))
    assert failed.error == f"image 0: media fetch: {url}: exceeds the request media byte budget"
    video_file = _sparse(tmp_path / "clip.mp4", 2 << 20)
    failed, _ = io.run(7, _job([video_file], caps=[MAX_VIDEO_FETCH_BYTES], budget=1 << 20))
    assert failed.error == f"image 0: media fetch: {video_file}: exceeds the request media byte budget"


@pytest.mark.parametrize(
    "caps",
    [[], [BIG_CAP], [BIG_CAP, BIG_CAP, BIG_CAP], [BIG_CAP, 0], [-1, BIG_CAP], [BIG_CAP, True], [2.5, BIG_CAP],
     [BIG_CAP, "64"], [BIG_CAP, None], [[1], BIG_CAP], [1 << 63, BIG_CAP], "all", 5],
)  # fmt: skip
def test_malformed_caps_reject_the_job_before_anything_is_fetched(io, server, caps):
    sources = [server.url("/bytes/10"), server.url("/bytes/20")]
    failed, payload = io.run(8, _job(sources, caps=caps))
    assert isinstance(failed, Failed) and payload == []
    assert (failed.error, failed.kind) == ("malformed I/O job", Outcome.INTERNAL.value)
    # Nothing of it was fetched, and the stage serves the next job as before.
    done, payload = io.run(9, _job(sources, caps=[10, 20]))
    assert isinstance(done, Done) and payload == [pattern(10), pattern(20)]
    assert sorted(server.server.received) == ["/bytes/10", "/bytes/20"]  # concurrent: either order


def test_a_negative_budget_is_a_malformed_job_not_the_end_of_the_stage(io, server):
    failed, _ = io.run(10, _job([server.url("/bytes/10")], budget=-1))
    assert (failed.error, failed.kind) == ("malformed I/O job", Outcome.INTERNAL.value)
    done, payload = io.run(11, _job([server.url("/bytes/10")]))
    assert isinstance(done, Done) and payload == [pattern(10)]


def test_a_failed_source_is_named_by_its_kind_when_the_job_says_how_many_items_are_images(io, server):
    url = server.url("/status/404")
    job = {**_job([server.url("/bytes/10"), url]), "indices": [1, 3], "images": 2}
    failed, _ = io.run(12, job)
    assert failed.error.startswith("video 1: media fetch: ") and "404" in failed.error, failed.error  # item 3
    for images in (-1, True, "2", 1.0):
        failed, _ = io.run(13, {**job, "images": images})
        assert (failed.error, failed.kind) == ("malformed I/O job", Outcome.INTERNAL.value)
