"""mmworker.common.video on the generated corpus: counts, rates, sizes, rotation and every frame's bytes, budgets, refusals.

The frames are compared with the ffmpeg command line's own decode (Debian's FFmpeg 5.1, converting with
bicubic swscale from the frame's tags: what torchcodec does), a different FFmpeg from the 8.0 that PyAV
bundles; tests/sglang_env/test_video_decode_torchcodec.py compares with torchcodec itself. The corpus
needs the ffmpeg command line (tests/videos.py); without it these tests skip, saying how to install it.
"""

import contextlib
import gc
import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import videos

av = pytest.importorskip("av", reason="PyAV is not installed (pip install 'mmworker[video]'; scripts/setup.sh does)")

import mmworker.common.video as video  # noqa: E402
from mmworker.errors import BudgetExceeded, MmError, Outcome, UsageError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus() -> dict[str, videos.Clip]:
    videos.require_ffmpeg()
    return videos.corpus()


def ffmpeg_frames(path: Path, width: int, height: int, autorotate: bool = False) -> np.ndarray:
    """Every frame as ffmpeg's command line decodes it: rgb24, bicubic swscale, timestamps passed through."""
    args = ["ffmpeg", "-nostdin", "-v", "error", *([] if autorotate else ["-noautorotate"]), "-i", str(path),
            "-map", "0:v:0", "-fps_mode", "passthrough", "-sws_flags", "bicubic", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"]  # fmt: skip
    out = subprocess.run(args, capture_output=True, check=True, timeout=120).stdout
    return np.frombuffer(out, np.uint8).reshape(-1, height, width, 3)


def tasks() -> set[str]:
    """This process's threads, by id (threads of earlier tests may still end meanwhile: compare as sets)."""
    return set(os.listdir("/proc/self/task"))


def sglang_indices(total: int, fps: float) -> np.ndarray:
    """The frame indices SGLang 0.5.23 samples for Qwen-VL (smart_nframes with no per-video settings)."""
    min_frames = 4  # ceil to 2 of FPS_MIN_FRAMES
    max_frames = min(768, total) // 2 * 2
    n = min(min(max(total / fps * 2.0, min_frames), max_frames), total)
    n = int(n // 2 * 2)
    assert 2 <= n <= total
    return np.unique(np.linspace(0, total - 1, num=n, dtype=np.int64))


DECODABLE = videos.names()


# --- What the container says ---------------------------------------------------------------------


@pytest.mark.parametrize("name", DECODABLE)
def test_probe_describes_the_clip(corpus, name):
    clip = corpus[name]
    info = video.probe(clip.path)
    assert (info.width, info.height) == (clip.width, clip.height)
    assert info.rotation == clip.rotation
    assert info.codec == clip.codec and info.pixel_format == clip.pixel_format
    if clip.frames is not None:
        assert info.frames == clip.frames
    if clip.fps is not None:  # a constant rate: count / span is that rate, up to float rounding
        assert info.fps == pytest.approx(clip.fps, rel=1e-12)
    assert len(info.frame_pts) == info.frames and list(info.frame_pts) == sorted(info.frame_pts)


def test_probe_colour_tags_and_rates(corpus):
    tagged = video.probe(corpus["h264_420_bt709_bframes"].path)
    assert (tagged.color_space, tagged.color_primaries, tagged.color_transfer, tagged.color_range) == (
        "bt709", "bt709", "bt709", "tv")  # fmt: skip
    assert tagged.fps == 90 / (90 * 1001 / 30000) and tagged.duration == pytest.approx(3.003)
    untagged = video.probe(corpus["h264_420_untagged"].path)
    assert (untagged.color_space, untagged.color_range) == (None, None)
    assert video.probe(corpus["hevc_bt2020_10bit"].path).color_transfer == "smpte2084"
    # Variable rate: 30 frames whose timestamps span 1.36 s (the last one's 40 ms included).
    assert video.probe(corpus["h264_vfr"].path).fps == 30 / 1.36
    # MPEG-TS timestamps start at 1.4667 s, not 0: the span is what counts.
    ts = video.probe(corpus["h264_bframes_ts"].path)
    assert ts.fps == pytest.approx(30000 / 1001, rel=1e-12) and ts.frames == 90


def test_edit_list_discarded_frames_are_not_counted(corpus):
    # The cut at 1.1 s leaves 90 packets in the file; those before the cut are flagged discarded.
    with av.open(str(corpus["h264_edit_list"].path)) as container:
        packets = [p for p in container.demux(container.streams.video[0]) if p.size]
    assert len(packets) == 90 and sum(p.is_discard for p in packets) == 33
    assert video.probe(corpus["h264_edit_list"].path).frames == 57


# --- Every frame, against ffmpeg's own decode ---------------------------------------------------------


@pytest.mark.parametrize("name", DECODABLE)
def test_every_frame_equals_ffmpeg(corpus, name):
    clip = corpus[name]
    info = video.probe(clip.path)
    frames = video.decode_frames(clip.path, np.arange(info.frames), info=info)
    assert frames.shape == (info.frames, info.height, info.width, 3) and frames.dtype == np.uint8
    turns = info.rotation // 90
    w, h = (info.height, info.width) if turns % 2 else (info.width, info.height)
    reference = ffmpeg_frames(clip.path, w, h)
    if turns:  # ffmpeg decodes unrotated (-noautorotate); torchcodec turns the RGB frame counter-clockwise
        reference = np.rot90(reference, turns, axes=(1, 2))
    assert reference.shape == frames.shape
    assert np.array_equal(frames, reference), f"{int((frames != reference).any(axis=(1, 2, 3)).sum())} frames differ"


@pytest.mark.parametrize("name", videos.names("rotation"))
def test_rotation_turns_as_ffmpeg_displays(corpus, name):
    # ffmpeg's own autorotation shows which way the display matrix turns the picture.
    clip = corpus[name]
    info = video.probe(clip.path)
    frames = video.decode_frames(clip.path, np.arange(info.frames), info=info)
    assert np.array_equal(frames, ffmpeg_frames(clip.path, info.width, info.height, autorotate=True))


def test_conversion_follows_the_tags(corpus):
    # PyAV's plain conversion (BT.601, limited range, bilinear) is what the tags correct: the reference
    # above would catch a decoder that ignored them.
    path = corpus["hevc_420_10bit_bt709_full"].path
    ours = video.decode_frames(path, [0])[0]
    with av.open(str(path)) as container:
        naive = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert np.abs(ours.astype(int) - naive).max() > 20


def test_sampled_frames_are_those_of_a_full_decode(corpus):
    clip = corpus["h264_1000_frames"]
    info = video.probe(clip.path)
    everything = video.decode_frames(clip.path, np.arange(info.frames), info=info)
    indices = sglang_indices(info.frames, info.fps)
    assert len(indices) == 20  # 10 s at 2 fps
    assert np.array_equal(video.decode_frames(clip.path, indices, info=info), everything[indices])
    rng = np.random.default_rng(7)
    for _ in range(5):
        sparse = np.unique(rng.integers(0, info.frames, int(rng.integers(1, 50))))
        assert np.array_equal(video.decode_frames(clip.path, sparse), everything[sparse])
    assert np.array_equal(video.decode_frames(clip.path, [999]), everything[999:])
    many = np.unique(np.linspace(0, info.frames - 1, 768, dtype=np.int64))  # SGLang's cap
    assert np.array_equal(video.decode_frames(clip.path, many, info=info), everything[many])


def test_sources_and_outputs(corpus):
    path = corpus["h264_420_bt709_bframes"].path
    data = path.read_bytes()
    expected = video.decode_frames(path, [0, 45, 89])
    for source in (data, bytearray(data), memoryview(data), str(path)):
        assert video.probe(source) == video.probe(path)
        assert np.array_equal(video.decode_frames(source, [0, 45, 89]), expected)
    # Straight into a caller's strided array, e.g. every other row of a bigger buffer.
    big = np.zeros((6, 108, 192, 3), np.uint8)
    out = big[::2]
    assert video.decode_frames(data, [0, 45, 89], out=out) is out
    assert np.array_equal(big[::2], expected) and not big[1::2].any()
    assert video.decode_frames(data, []).shape == (0, 108, 192, 3)


def test_misuse_is_a_usage_error(corpus):
    data = corpus["h264_420_untagged"].data()
    with pytest.raises(UsageError, match="strictly increasing"):
        video.decode_frames(data, [3, 3])
    with pytest.raises(UsageError, match=r"in \[0, 50\)"):
        video.decode_frames(data, [0, 50])
    with pytest.raises(UsageError, match="integers"):
        video.decode_frames(data, [0.5])
    with pytest.raises(UsageError, match="shape"):
        video.decode_frames(data, [0, 1], out=np.empty((2, 96, 160, 4), np.uint8))
    with pytest.raises(UsageError, match="not probe"):
        video.decode_frames(data, [0], info=video.probe(corpus["h264_bframes_ts"].path))
    with pytest.raises(UsageError, match="expected bytes"):
        video.probe(12345)


def test_single_threaded_and_same_bytes_as_threaded(corpus, monkeypatch):
    threads_seen = []  # the process's threads (their ids) at each converted frame
    to_rgb = video._to_rgb

    def counting(reformatter, frame):
        threads_seen.append(tasks())
        return to_rgb(reformatter, frame)

    monkeypatch.setattr(video, "_to_rgb", counting)
    baseline = tasks()
    for name in ("h264_420_bt709_bframes", "hevc_444_bframes", "vp9_420_10bit", "av1_420", "h264_360p_300_frames"):
        path = corpus[name].path
        threads_seen.clear()
        single = video.decode_frames(path, np.arange(video.probe(path).frames))
        started = set().union(*threads_seen) - baseline
        assert not started, f"{name}: FFmpeg started threads {started}"
        monkeypatch.setattr(video, "_FFMPEG_THREADS", 0)  # FFmpeg's choice: frame threads on every core
        threads_seen.clear()
        threaded = video.decode_frames(path, np.arange(single.shape[0]))
        monkeypatch.setattr(video, "_FFMPEG_THREADS", 1)
        if (os.cpu_count() or 1) > 1:
            assert set().union(*threads_seen) - baseline, (
                "the threaded decode started no thread: this test shows nothing"
            )
        assert np.array_equal(single, threaded), name


# --- Refusals -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        ("truncated_moov_lost", Outcome.BAD_INPUT, "cannot read the container"),
        ("truncated_faststart", Outcome.BAD_INPUT, "does not decode"),
        ("truncated_webm", Outcome.BAD_INPUT, "no frames"),
        ("audio_only", Outcome.BAD_INPUT, "no video stream"),
        ("unknown_codec", Outcome.UNSUPPORTED, "no decoder"),
    ],
)
def test_broken_inputs_are_refused(corpus, name, kind, message):
    # As SGLang would use it: probe, then the sampled frames (which always include the last one).
    data = corpus[name].data()
    with pytest.raises(MmError, match=message) as caught:
        info = video.probe(data)
        video.decode_frames(data, sglang_indices(info.frames, info.fps), info=info)
    assert caught.value.kind is kind and str(caught.value).startswith("video decode: ")


def test_truncated_file_decodes_up_to_the_cut(corpus):
    # Its index promises 50 frames, the demuxer stops after 28 packets, the last of them cut short: the 27
    # whole ones decode (as torchcodec's do), the cut one is refused (as torchcodec refuses it).
    data = corpus["truncated_faststart"].data()
    info = video.probe(data)
    assert info.frames == 28
    whole = video.decode_frames(corpus["h264_faststart"].path, [0, 10, 26])
    assert np.array_equal(video.decode_frames(data, [0, 10, 26], info=info), whole)
    with pytest.raises(MmError, match="does not decode"):
        video.decode_frames(data, [0, 27], info=info)


def test_size_change_is_refused_only_where_sampled(corpus):
    path = corpus["h264_size_change"].path
    info = video.probe(path)
    assert (info.frames, info.width, info.height) == (20, 96, 64)
    assert video.decode_frames(path, [0, 9], info=info).shape == (2, 64, 96, 3)
    with pytest.raises(MmError, match="frame 12 is 128x96 in a stream of 96x64") as caught:
        video.decode_frames(path, [0, 12], info=info)
    assert caught.value.kind is Outcome.UNSUPPORTED


def test_non_videos_are_refused(tmp_path):
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the decoder\n")
    cases = {
        "an image": (png.getvalue(), Outcome.UNSUPPORTED, "not a container mmworker accepts"),
        # Playlists name other files: their demuxers are never run, and FFmpeg may open nothing but the input.
        "an HLS playlist": (
            f"#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nfile://{secret}\n#EXT-X-ENDLIST\n".encode(),
            None,
            "video decode: ",
        ),
        "a concat list": (f"ffconcat version 1.0\nfile {secret}\n".encode(), Outcome.UNSUPPORTED, "not a container"),
        "zeros": (bytes(4096), Outcome.BAD_INPUT, "cannot read the container"),
        "text": (b"hello world\n" * 100, Outcome.BAD_INPUT, "cannot read the container"),
        "nothing": (b"", Outcome.BAD_INPUT, "empty input"),
    }
    for what, (data, kind, message) in cases.items():
        with pytest.raises(MmError, match=message) as caught:
            video.probe(data)
        assert kind is None or caught.value.kind is kind, what
    with pytest.raises(MmError, match="cannot open"):
        video.probe(str(tmp_path / "missing.mp4"))


def test_random_corruption_is_refused_or_decoded(corpus):
    # Damaged packets: a decoder either conceals the damage (as torchcodec's does, the same way) or the
    # file is refused with an MmError; never another exception, never a crash.
    data = corpus["h264_420_bt709_bframes"].data()
    rng = np.random.default_rng(3)
    outcomes = set()
    for _ in range(30):
        damaged = bytearray(data)
        for at in rng.integers(64, len(data), int(rng.integers(1, 40))):
            damaged[at] = int(rng.integers(0, 256))
        try:
            info = video.probe(bytes(damaged))
            frames = video.decode_frames(bytes(damaged), sglang_indices(info.frames, info.fps), info=info)
            assert frames.shape[1:] == (info.height, info.width, 3)
            outcomes.add("decoded")
        except MmError as exc:
            assert str(exc).startswith("video decode: ")
            outcomes.add(exc.kind)
    assert outcomes  # and nothing else escaped


# --- Budgets: checked on the container's claims before decoding, then while demuxing and decoding -------


def never(*args, **kwargs):
    raise AssertionError("read packets although the header's claims are over budget")


@pytest.mark.parametrize(
    ("budget", "value", "name", "message", "kind"),
    [
        (
            "MAX_FRAME_PIXELS",
            192 * 108 - 1,
            "h264_420_bt709_bframes",
            "frames of 192x108 are over",
            Outcome.UNSUPPORTED,
        ),
        ("MAX_VIDEO_FRAMES", 89, "h264_420_bt709_bframes", "the header claims 90 frames", Outcome.BAD_INPUT),
        ("MAX_VIDEO_SECONDS", 2.9, "h264_420_bt709_bframes", r"the header claims 3\.0 s", Outcome.BAD_INPUT),
        ("MAX_VIDEO_SECONDS", 0.9, "vp9_420_odd", r"the header claims 1\.0 s", Outcome.BAD_INPUT),
    ],
)
def test_header_claims_are_checked_before_any_packet(corpus, monkeypatch, budget, value, name, message, kind):
    monkeypatch.setattr(video, budget, value)
    monkeypatch.setattr(video._Input, "_packets", never)
    with pytest.raises(MmError, match=message) as caught:
        video.probe(corpus[name].path)
    assert caught.value.kind is kind and budget in str(caught.value)


def test_budgets_while_demuxing_and_decoding(corpus, monkeypatch):
    # Matroska has no frame count in its header: the count is checked as packets arrive.
    monkeypatch.setattr(video, "MAX_VIDEO_FRAMES", 10)
    with pytest.raises(MmError, match="more than 10 frames"):
        video.probe(corpus["vp9_420_odd"].path)
    monkeypatch.undo()
    # Timestamps spanning more than the header said (its claims passed): the span is checked after the scan.
    monkeypatch.setattr(video, "MAX_VIDEO_SECONDS", 2.5)
    monkeypatch.setattr(video._Input, "_check_claims", lambda self: None)
    with pytest.raises(MmError, match=r"the timestamps span 3\.0 s"):
        video.probe(corpus["h264_bframes_ts"].path)
    monkeypatch.undo()
    # A frame over the pixel budget met while decoding (the header having said less).
    info = video.probe(corpus["h264_420_bt709_bframes"].path)
    monkeypatch.setattr(video, "MAX_FRAME_PIXELS", 192 * 108 - 1)
    monkeypatch.setattr(video._Input, "_check_claims", lambda self: None)
    with pytest.raises(MmError, match="a frame of 192x108 is over"):
        video.decode_frames(corpus["h264_420_bt709_bframes"].path, [5], info=info)
    monkeypatch.undo()
    monkeypatch.setattr(video, "MAX_VIDEO_BYTES", 1000)
    with pytest.raises(MmError, match="over the 1000-byte budget") as caught:
        video.probe(corpus["h264_2_frames"].path)
    assert caught.value.kind is Outcome.BAD_INPUT
    monkeypatch.undo()
    monkeypatch.setattr(video, "MAX_OUTPUT_BYTES", 2 * 96 * 160 * 3 - 1)
    with pytest.raises(MmError, match="MAX_OUTPUT_BYTES"):
        video.decode_frames(corpus["h264_420_untagged"].path, [0, 1])
    out = np.empty((2, 96, 160, 3), np.uint8)  # the caller's own buffer is not this budget's business
    video.decode_frames(corpus["h264_420_untagged"].path, [0, 1], out=out)


# --- Resources ----------------------------------------------------------------------------------------------


def test_nothing_leaks(corpus):
    from processes import open_fds

    paths = [corpus[n].path for n in ("h264_420_bt709_bframes", "truncated_faststart", "truncated_moov_lost",
                                      "audio_only", "unknown_codec", "h264_size_change")]  # fmt: skip
    video.probe(paths[0])  # imports and first-use allocations before the baseline
    fds, threads = open_fds(), tasks()
    # A file left to the garbage collector is closed by it all the same, with a ResourceWarning: recorded
    # here, so that only files closed by the decoder itself pass.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(3):
            for path in paths:
                for source in (path, path.read_bytes()):
                    with contextlib.suppress(MmError):  # most of them are refused: that is the point
                        video.decode_frames(source, [0, 15])
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], "a file was left to the GC"
    assert open_fds().items() <= fds.items(), "a file descriptor was left open"
    assert tasks() <= threads, "a thread was left running"


def test_cpu_budget_stops_a_decode_and_leaks_nothing(corpus):
    from processes import open_fds

    from mmworker.pool.cpu_budget import CpuBudget

    path = corpus["h264_360p_300_frames"].path
    info = video.probe(path)
    fds = open_fds()
    budget = CpuBudget()
    try:
        for source in (path, path.read_bytes()):
            with pytest.raises(BudgetExceeded):
                budget.run(0.02, lambda source=source: video.decode_frames(source, [0, info.frames - 1], info=info))
    finally:
        budget.close()
    assert open_fds().items() <= fds.items(), "a file descriptor was left open"


PEAK_SCRIPT = """
import sys
import numpy as np
import mmworker.common.video as video

path = sys.argv[1]
info = video.probe(path)
video.decode_frames(path, [0, 1], info=info)  # warm: codecs, swscale, numpy

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

indices = np.unique(np.linspace(0, info.frames - 1, 10, dtype=np.int64))
out = np.zeros((len(indices), info.height, info.width, 3), np.uint8)  # touched: counted before the decode
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from the current RSS
before = status("VmRSS:")
video.decode_frames(path, indices, out=out, info=info)
print(status("VmHWM:") - before)
"""


def test_peak_memory_is_the_output_and_a_few_frames(corpus):
    # 300 frames of 640x360 are 207 MB of RGB (and 104 MB of YUV); decoding every one of them to keep 10
    # must cost the memory of a few (the decoder's pictures, FFmpeg's buffer pools, one RGB frame: about a
    # dozen RGB frames' worth), not of all. Measured in a fresh process, where the peak means this.
    clip = corpus["h264_360p_300_frames"]
    proc = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(clip.path)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    growth = int(proc.stdout.split()[-1])
    frame = 640 * 360 * 3
    assert growth < 40 * frame, f"peak grew by {growth} bytes: {growth / frame:.1f} RGB frames"
