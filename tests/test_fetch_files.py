"""Local sources: file:// and absolute paths through the bounded reader (docs/behaviour.md §3.1, §3.3, TV-F3)."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from mmworker.common.budget import CHUNK_BYTES, MAX_FETCH_BYTES, MAX_VIDEO_FETCH_BYTES, ByteBudget
from mmworker.common.fetch import fetch_bytes, read_bounded
from mmworker.common.policy import MediaPolicy
from mmworker.errors import MmError


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def _no_fd_leak():
    before = _fd_count()
    yield
    assert _fd_count() == before, "a file descriptor was left open"


@contextlib.contextmanager
def _deadline(seconds: float):
    """Fail (instead of hanging the suite) if the block blocks: SIGALRM interrupts a blocking open/read."""

    def on_alarm(signum, frame):
        raise TimeoutError(f"blocked for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def image_file(tmp_path):
    path = tmp_path / "img.bin"
    data = os.urandom(CHUNK_BYTES * 2 + 123)  # crosses chunk boundaries and ends mid-chunk
    path.write_bytes(data)
    return path, data


def test_regular_file_via_path_and_file_uri(image_file):
    path, data = image_file
    with _no_fd_leak():
        assert fetch_bytes(str(path)) == data
        assert fetch_bytes(f"file://{path}") == data


def test_short_reads_release_their_claims(image_file):
    path, data = image_file
    budget = ByteBudget(10 * CHUNK_BYTES)
    assert fetch_bytes(str(path), budget) == data
    assert budget.used == len(data)  # not a whole number of chunks


def test_empty_file_and_dev_null(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with _no_fd_leak():
        assert fetch_bytes(str(empty)) == b""
        assert fetch_bytes("/dev/null") == b""


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_missing_file(tmp_path, prefix):
    path = tmp_path / "nope.png"
    with _no_fd_leak(), pytest.raises(MmError) as exc:
        fetch_bytes(f"{prefix}{path}")
    assert str(exc.value) == f"media fetch: {path}: No such file or directory (os error 2)"
    assert isinstance(exc.value.__cause__, FileNotFoundError)


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_directory(tmp_path, prefix):
    with _no_fd_leak(), pytest.raises(MmError) as exc:
        fetch_bytes(f"{prefix}{tmp_path}")
    assert str(exc.value) == f"media fetch: {tmp_path}: Is a directory (os error 21)"


def test_permission_denied(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files regardless of mode")
    path = tmp_path / "secret"
    path.write_bytes(b"x")
    path.chmod(0)
    with _no_fd_leak(), pytest.raises(MmError, match=r"Permission denied \(os error 13\)$"):
        fetch_bytes(str(path))


def test_nul_in_path():
    with _no_fd_leak(), pytest.raises(MmError, match="unexpected NUL byte"):
        fetch_bytes("/tmp/a\0b")


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    start = time.monotonic()
    with _deadline(2.0), _no_fd_leak(), pytest.raises(MmError) as exc:
        fetch_bytes(str(fifo))
    assert time.monotonic() - start < 2.0
    assert str(exc.value) == f"media fetch: {fifo}: not a regular file"


def test_fifo_with_a_writer_is_still_refused(tmp_path):
    # With a writer attached the open would not block anyway; the type check must still refuse it.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY)
    try:
        os.write(writer, b"data")
        with _deadline(2.0), _no_fd_leak(), pytest.raises(MmError, match=r"not a regular file$"):
            fetch_bytes(f"file://{fifo}")
    finally:
        os.close(writer)
        os.close(reader)


def test_unix_socket_is_refused_without_blocking(tmp_path):
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(path))
        srv.listen(1)
        # open(2) on a socket fails with ENXIO before the type check can run.
        with _deadline(2.0), _no_fd_leak(), pytest.raises(MmError, match=r"\(os error 6\)$"):
            fetch_bytes(str(path))


def test_dev_zero_hits_the_64_mib_cap():
    budget = ByteBudget()  # the 1.25 GiB request budget: the cap, not the budget, must stop it
    start = time.monotonic()
    with _no_fd_leak(), pytest.raises(MmError) as exc:
        fetch_bytes("/dev/zero", budget)
    assert str(exc.value) == "media fetch: /dev/zero: exceeds 67108864 bytes"
    assert budget.used == 0
    assert time.monotonic() - start < 5.0


def test_dev_zero_with_the_default_budget_reports_the_cap():
    # The standalone 64 MiB budget runs out at the same byte as the cap; the cap message wins.
    with pytest.raises(MmError, match=r"^media fetch: /dev/zero: exceeds 67108864 bytes$"):
        fetch_bytes("file:///dev/zero")


def test_dev_zero_peak_memory_stays_near_the_cap():
    # ru_maxrss is a lifetime high-water mark, so measure in a fresh interpreter where this is the peak.
    code = (
        "import resource\n"
        "from mmworker.common.budget import ByteBudget\n"
        "from mmworker.common.fetch import fetch_bytes\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    fetch_bytes('/dev/zero', ByteBudget())\n"
        "except ValueError:\n"
        "    pass\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    delta_kib = int(out.stdout.strip())
    assert delta_kib < 200 * 1024, f"peak grew by {delta_kib} KiB"


def test_regular_file_exactly_at_the_cap_is_read_and_one_byte_more_is_not(tmp_path):
    path = tmp_path / "sparse"
    with open(path, "wb") as f:
        f.truncate(MAX_FETCH_BYTES)  # sparse: costs no disk
    budget = ByteBudget()
    assert len(fetch_bytes(str(path), budget)) == MAX_FETCH_BYTES
    assert budget.used == MAX_FETCH_BYTES
    os.truncate(path, MAX_FETCH_BYTES + 1)
    budget = ByteBudget()
    with (
        _no_fd_leak(),
        pytest.raises(MmError, match=rf"^media fetch: {re.escape(str(path))}: exceeds 67108864 bytes$"),
    ):
        fetch_bytes(str(path), budget)
    assert budget.used == 0


# --- a per-stream cap other than 64 MiB (videos: MAX_VIDEO_FETCH_BYTES) ----------------------------------
_BIG_CAP = MAX_FETCH_BYTES + (1 << 20)  # above 64 MiB, yet a test reads no more than 65 MiB


def test_a_larger_cap_admits_a_file_over_64_mib_and_refuses_one_byte_past_itself(tmp_path):
    path = tmp_path / "video.sparse"
    with open(path, "wb") as f:
        f.truncate(_BIG_CAP)  # sparse, and exactly at the cap: the cap's own size is allowed
    budget = ByteBudget()
    with _no_fd_leak():
        assert len(fetch_bytes(str(path), budget, cap=_BIG_CAP)) == _BIG_CAP
    assert budget.used == _BIG_CAP
    os.truncate(path, _BIG_CAP + 1)
    budget = ByteBudget()
    with (
        _no_fd_leak(),
        pytest.raises(MmError, match=rf"^media fetch: file://{re.escape(str(path))}: exceeds {_BIG_CAP} bytes$"),
    ):
        read_bounded(str(path), budget, what=f"file://{path}", cap=_BIG_CAP)
    assert budget.used == 0
    # The same file without the keyword meets the 64 MiB cap.
    with pytest.raises(MmError, match=rf"exceeds {MAX_FETCH_BYTES} bytes$"):
        fetch_bytes(f"file://{path}", ByteBudget())


def test_the_cap_reaches_the_read_under_a_media_policy(tmp_path):
    # With a policy the path is resolved first and read with O_NOFOLLOW: the cap must survive that route.
    path = tmp_path / "clip"
    path.write_bytes(os.urandom(3000))
    policy = MediaPolicy(allowed_local_roots=(str(tmp_path),))
    assert len(fetch_bytes(str(path), ByteBudget(), policy=policy, cap=3000)) == 3000
    with pytest.raises(MmError, match=rf"^media fetch: {re.escape(str(path))}: exceeds 2999 bytes$"):
        fetch_bytes(str(path), ByteBudget(), policy=policy, cap=2999)


def test_dev_zero_runs_into_the_callers_cap_and_the_fresh_budget_is_the_cap():
    cap = CHUNK_BYTES * 3 + 17  # not a whole number of chunks: the last read is cut to the cap + 1
    with _no_fd_leak(), pytest.raises(MmError, match=rf"^media fetch: /dev/zero: exceeds {cap} bytes$"):
        fetch_bytes("/dev/zero", ByteBudget(), cap=cap)
    # No budget given: a fresh one of `cap` bytes runs out at the same byte; the cap message wins.
    with pytest.raises(MmError, match=rf"^media fetch: /dev/zero: exceeds {cap} bytes$"):
        fetch_bytes("/dev/zero", cap=cap)


def test_the_budget_still_wins_where_it_is_smaller_than_the_cap(tmp_path):
    path = tmp_path / "video.sparse"
    with open(path, "wb") as f:
        f.truncate(MAX_FETCH_BYTES + (512 << 10))
    budget = ByteBudget(MAX_FETCH_BYTES)  # what is left of the request: less than this video
    with _no_fd_leak(), pytest.raises(MmError) as exc:
        fetch_bytes(str(path), budget, cap=MAX_VIDEO_FETCH_BYTES)
    assert str(exc.value) == f"media fetch: {path}: exceeds the request media byte budget"
    assert budget.used == 0


@pytest.mark.parametrize("cap", [0, -1, 1 << 63, True, 2.5, "64"])
def test_a_cap_that_bounds_nothing_is_refused(tmp_path, cap):
    path = tmp_path / "x"
    path.write_bytes(b"x")
    with _no_fd_leak():
        for call in (lambda: fetch_bytes(str(path), cap=cap), lambda: read_bounded(str(path), ByteBudget(), cap=cap)):
            with pytest.raises(
                MmError, match=rf"byte cap must be an int from 1 to 2\*\*63 - 1, got {re.escape(repr(cap))}$"
            ):
                call()


def test_budget_exhaustion_mid_file(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(os.urandom(CHUNK_BYTES * 3))
    budget = ByteBudget(CHUNK_BYTES * 2 + 5)
    with _no_fd_leak(), pytest.raises(MmError) as exc:
        fetch_bytes(str(path), budget)
    assert str(exc.value) == f"media fetch: {path}: exceeds the request media byte budget"
    assert budget.used == 0  # a failed source gives its claims back


def test_file_exactly_filling_the_budget_is_accepted(tmp_path):
    path = tmp_path / "fit"
    data = os.urandom(1000)
    path.write_bytes(data)
    budget = ByteBudget(1000)
    assert fetch_bytes(str(path), budget) == data
    assert budget.remaining == 0
    with pytest.raises(MmError, match="exceeds the request media byte budget"):
        fetch_bytes(str(path), ByteBudget(999))


def test_two_files_share_a_budget(image_file):
    path, data = image_file
    budget = ByteBudget(len(data) * 2 - 1)
    assert fetch_bytes(str(path), budget) == data
    with pytest.raises(MmError, match="exceeds the request media byte budget"):
        fetch_bytes(f"file://{path}", budget)
    assert budget.used == len(data)


def test_file_uri_keeps_the_rest_verbatim(tmp_path, monkeypatch):
    # Rust strips "file://" and reads the rest as-is: no host part, no percent-decoding.
    (tmp_path / "a%20b").write_bytes(b"pct")
    monkeypatch.chdir(tmp_path)
    assert fetch_bytes(f"file://{tmp_path}/a%20b") == b"pct"
    assert fetch_bytes("file://a%20b") == b"pct"  # relative to the working directory, as upstream
    with pytest.raises(MmError, match="No such file"):
        fetch_bytes(f"file://localhost{tmp_path}/a%20b")


def test_read_bounded_is_the_same_reader(image_file):
    path, data = image_file
    assert read_bounded(str(path), ByteBudget()) == data
