"""The video test corpus: small clips made with the ffmpeg command line, cached per corpus version.

Each clip is tiny (192x108 at most, 1-10 s; one 640x360 clip for the memory test) so that the whole
corpus is made in a few seconds and a test can decode every frame of a clip. Together they cover what a
video decoder has to get right: the codecs (H.264, HEVC, VP9, MJPEG, AV1), 8 and 10 bits, 4:2:0 / 4:2:2
/ 4:4:4 / grey / planar RGB, untagged / BT.709 / BT.2020 / full range (by pixel format and by tag), sizes
that are odd or not multiples of 32 (torchcodec converts those through a filter graph instead of
swscale), B-frames, variable frame rates, timestamps that do not start at 0 (MPEG-TS), an edit list,
rotation metadata (display matrices), 2 and 3 frames, more frames than SGLang ever samples (768), an
audio track beside the video; and the inputs a decoder must refuse: truncated files, a frame size change
mid-stream, a file with no video stream, a video stream of an unknown codec.

    from videos import corpus, require_ffmpeg
    clips = corpus()              # {name: Clip}; made on first use into ~/.cache/mmworker/videos-v<N>
    data = clips["h264_420_bt709_bframes"].path.read_bytes()

The clips are made by ffmpeg (Debian's `apt-get install ffmpeg`: 5.1 on Debian 12) and cached under
$XDG_CACHE_HOME/mmworker (else ~/.cache/mmworker) in a directory named by CORPUS_VERSION: bump it when a
clip's recipe changes and every machine regenerates. A test that needs the corpus calls
`require_ffmpeg()`, which skips with the command that installs ffmpeg where it is missing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

CORPUS_VERSION = 1
INSTALL_FFMPEG = "apt-get install ffmpeg (scripts/setup.sh installs it)"
_COMPLETE = ".complete"


@dataclass(frozen=True)
class Clip:
    """One corpus file and what is known of it by construction (None: not a property of the recipe)."""

    name: str
    path: Path
    codec: str | None = None
    pixel_format: str | None = None
    width: int | None = None  # as displayed, after rotation
    height: int | None = None
    frames: int | None = None
    fps: float | None = None  # the constant rate it was encoded at (None: variable or not meaningful)
    rotation: int = 0
    decodable: bool = True  # False: a file the decoder must refuse
    tags: tuple[str, ...] = field(default=())  # what it exercises: "bframes", "vfr", "odd", "rotation", ...

    def data(self) -> bytes:
        return self.path.read_bytes()


def _testsrc(w: int, h: int, rate: str, seconds: float | None = None, frames: int | None = None) -> list[str]:
    # testsrc2: colour bars, gradients, a moving square and a frame counter, so that neighbouring frames
    # differ and a wrong frame index shows.
    # testsrc2 draws even sizes only: an odd one is drawn a pixel larger and scaled to size.
    length = f":duration={seconds}" if seconds is not None else ""
    limit = ["-frames:v", str(frames)] if frames is not None else []
    odd = f",scale={w}:{h}" if w % 2 or h % 2 else ""
    return ["-f", "lavfi", "-i", f"testsrc2=size={w + w % 2}x{h + h % 2}:rate={rate}{length}{odd}", *limit]


_X264 = ["-c:v", "libx264", "-preset", "veryfast", "-threads", "1"]
_X265 = ["-c:v", "libx265", "-preset", "ultrafast", "-x265-params", "log-level=error:pools=1:frame-threads=1"]
_VP9 = ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-threads", "1", "-b:v", "0", "-crf", "40"]
_AV1 = ["-c:v", "libaom-av1", "-usage", "realtime", "-cpu-used", "8", "-threads", "1", "-row-mt", "0"]
_BT709 = ["-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709"]
_NO_AUDIO = ["-an"]
_VFR = "settb=1/1000,setpts=(140*floor(N/3)+20*gt(mod(N\\,3)\\,0)+40*gt(mod(N\\,3)\\,1))/1000/TB"

# name -> (file extension, ffmpeg arguments between the global options and the output, known properties).
# Sizes: multiples of 32 wide take torchcodec's swscale path, the others its filter-graph path.
_ENCODED: dict[str, tuple[str, list[str], dict]] = {
    "h264_420_untagged": (
        "mp4",
        [*_testsrc(160, 96, "25", 2), *_X264, "-bf", "0", "-pix_fmt", "yuv420p"],
        dict(codec="h264", pixel_format="yuv420p", width=160, height=96, frames=50, fps=25.0),
    ),
    "h264_420_bt709_bframes": (
        "mp4",
        [*_testsrc(192, 108, "30000/1001", 3), *_X264, "-bf", "3", "-pix_fmt", "yuv420p", *_BT709],
        dict(
            codec="h264",
            pixel_format="yuv420p",
            width=192,
            height=108,
            frames=90,
            fps=30000 / 1001,
            tags=("bframes", "bt709"),
        ),
    ),
    "h264_yuvj420p": (
        "mp4",
        [*_testsrc(128, 72, "24", 1), *_X264, "-pix_fmt", "yuvj420p"],
        dict(codec="h264", pixel_format="yuvj420p", width=128, height=72, frames=24, fps=24.0, tags=("full_range",)),
    ),
    "h264_420_fullrange_tag": (
        "mkv",
        [*_testsrc(150, 86, "25", 1), *_X264, "-pix_fmt", "yuv420p", *_BT709, "-color_range", "pc"],
        # FFmpeg's H.264 decoder reports full-range 8-bit 4:2:0 as yuvj420p.
        dict(
            codec="h264",
            pixel_format="yuvj420p",
            width=150,
            height=86,
            frames=25,
            fps=25.0,
            tags=("full_range", "bt709", "filtergraph"),
        ),
    ),
    "h264_444_odd": (
        "mp4",
        [*_testsrc(97, 61, "25", 1), *_X264, "-pix_fmt", "yuv444p"],
        dict(
            codec="h264",
            pixel_format="yuv444p",
            width=97,
            height=61,
            frames=25,
            fps=25.0,
            tags=("odd", "444", "filtergraph"),
        ),
    ),
    "h264_422_10bit": (
        "mkv",
        [*_testsrc(128, 64, "25", 1), *_X264, "-pix_fmt", "yuv422p10le"],
        dict(
            codec="h264", pixel_format="yuv422p10le", width=128, height=64, frames=25, fps=25.0, tags=("10bit", "422")
        ),
    ),
    "hevc_420_10bit_bt709_full": (
        "mp4",
        [
            *_testsrc(160, 90, "25", 1),
            *_X265,
            "-pix_fmt",
            "yuv420p10le",
            "-tag:v",
            "hvc1",
            *_BT709,
            "-color_range",
            "pc",
        ],
        dict(
            codec="hevc",
            pixel_format="yuv420p10le",
            width=160,
            height=90,
            frames=25,
            fps=25.0,
            tags=("10bit", "bt709", "full_range", "filtergraph"),
        ),
    ),
    "hevc_444_bframes": (
        "mkv",
        [*_testsrc(96, 64, "30", 1), *_X265, "-pix_fmt", "yuv444p", "-bf", "4"],
        dict(codec="hevc", pixel_format="yuv444p", width=96, height=64, frames=30, fps=30.0, tags=("444", "bframes")),
    ),
    "vp9_420_odd": (
        "webm",
        [*_testsrc(75, 49, "25", 1), *_VP9, "-pix_fmt", "yuv420p"],
        dict(
            codec="vp9", pixel_format="yuv420p", width=75, height=49, frames=25, fps=25.0, tags=("odd", "filtergraph")
        ),
    ),
    "vp9_444_full": (
        "webm",
        [*_testsrc(64, 64, "25", 1), *_VP9, "-pix_fmt", "yuv444p", "-color_range", "pc"],
        dict(codec="vp9", pixel_format="yuv444p", width=64, height=64, frames=25, fps=25.0, tags=("444", "full_range")),
    ),
    "vp9_420_10bit": (
        "webm",
        [*_testsrc(96, 64, "25", 1), *_VP9, "-pix_fmt", "yuv420p10le"],
        dict(
            codec="vp9",
            pixel_format="yuv420p10le",
            width=96,
            height=64,
            frames=25,
            fps=25.0,
            tags=("10bit", "filtergraph"),
        ),
    ),
    "mjpeg_422": (
        "avi",
        [*_testsrc(120, 80, "25", 1), "-c:v", "mjpeg", "-pix_fmt", "yuvj422p", "-q:v", "3"],
        dict(
            codec="mjpeg",
            pixel_format="yuvj422p",
            width=120,
            height=80,
            frames=25,
            fps=25.0,
            tags=("422", "full_range", "filtergraph"),
        ),
    ),
    # Matroska keeps milliseconds: 24 frames at 24 fps span 0.999 s (pts 0, 42, 83, ... 958, duration 41).
    "av1_420": (
        "mkv",
        [*_testsrc(96, 64, "24", 1), *_AV1, "-pix_fmt", "yuv420p"],
        dict(
            codec="av1", pixel_format="yuv420p", width=96, height=64, frames=24, fps=24 / 0.999, tags=("filtergraph",)
        ),
    ),
    "av1_420_10bit": (
        "mp4",
        [*_testsrc(128, 64, "24", 1), *_AV1, "-pix_fmt", "yuv420p10le"],
        dict(codec="av1", pixel_format="yuv420p10le", width=128, height=64, frames=24, fps=24.0, tags=("10bit",)),
    ),
    # Frame durations of 20, 40 and 80 ms in turn (pts 0, 20, 60, 140, 160, ...): a variable rate.
    "h264_vfr": (
        "mp4",
        [
            *_testsrc(128, 72, "25", frames=30),
            *_X264,
            "-bf",
            "0",
            "-pix_fmt",
            "yuv420p",
            "-vf",
            _VFR,
            "-fps_mode",
            "passthrough",
            "-enc_time_base",
            "1/1000",
            "-video_track_timescale",
            "1000",
        ],
        dict(codec="h264", pixel_format="yuv420p", width=128, height=72, frames=30, tags=("vfr",)),
    ),
    # The same with B-frames: FFmpeg 5.1's mov demuxer then gives its packets no duration (8.0 does), so the
    # average rate depends on the FFmpeg that demuxes it (docs/behaviour.md §13.6).
    "h264_vfr_bframes": (
        "mp4",
        [
            *_testsrc(128, 72, "25", frames=30),
            *_X264,
            "-bf",
            "2",
            "-pix_fmt",
            "yuv420p",
            "-vf",
            _VFR,
            "-fps_mode",
            "passthrough",
            "-enc_time_base",
            "1/1000",
            "-video_track_timescale",
            "1000",
        ],
        dict(codec="h264", pixel_format="yuv420p", width=128, height=72, frames=30, tags=("vfr", "bframes")),
    ),
    # Monochrome: FFmpeg's H.264 decoder gives it as 4:2:0 with flat chroma, full range (yuvj420p).
    "h264_gray": (
        "mp4",
        [*_testsrc(96, 64, "25", 1), *_X264, "-pix_fmt", "gray"],
        dict(
            codec="h264", pixel_format="yuvj420p", width=96, height=64, frames=25, fps=25.0, tags=("gray", "full_range")
        ),
    ),
    # Monochrome AV1 decodes to grey (gray, gray10le): swscale's range for untagged grey is full.
    "av1_gray": (
        "mkv",
        [*_testsrc(64, 64, "25", 1), *_AV1, "-pix_fmt", "gray"],
        dict(codec="av1", pixel_format="gray", width=64, height=64, frames=25, fps=25.0, tags=("gray",)),
    ),
    "av1_gray10": (
        "mp4",
        [*_testsrc(64, 64, "25", 1), *_AV1, "-pix_fmt", "gray10le"],
        dict(codec="av1", pixel_format="gray10le", width=64, height=64, frames=25, fps=25.0, tags=("gray", "10bit")),
    ),
    # Planar RGB (VP9 profile 1, the GBR matrix): no YUV conversion at all.
    "vp9_gbrp": (
        "webm",
        [*_testsrc(64, 48, "25", 1), *_VP9, "-pix_fmt", "gbrp"],
        dict(codec="vp9", pixel_format="gbrp", width=64, height=48, frames=25, fps=25.0, tags=("rgb",)),
    ),
    # The BT.2020 matrix (HDR10's tags), 10 bits.
    "hevc_bt2020_10bit": (
        "mkv",
        [
            *_testsrc(128, 72, "25", 1),
            *_X265,
            "-pix_fmt",
            "yuv420p10le",
            "-colorspace",
            "bt2020nc",
            "-color_primaries",
            "bt2020",
            "-color_trc",
            "smpte2084",
        ],
        dict(
            codec="hevc",
            pixel_format="yuv420p10le",
            width=128,
            height=72,
            frames=25,
            fps=25.0,
            tags=("10bit", "bt2020", "filtergraph"),
        ),
    ),
    "h264_2_frames": (
        "mp4",
        [*_testsrc(64, 48, "25", frames=2), *_X264, "-pix_fmt", "yuv420p"],
        dict(codec="h264", pixel_format="yuv420p", width=64, height=48, frames=2, fps=25.0),
    ),
    "vp9_3_frames": (
        "webm",
        [*_testsrc(64, 48, "25", frames=3), *_VP9, "-pix_fmt", "yuv420p"],
        dict(codec="vp9", pixel_format="yuv420p", width=64, height=48, frames=3, fps=25.0),
    ),
    # More frames than SGLang's FPS_MAX_FRAMES (768), at a size that keeps it small.
    "h264_1000_frames": (
        "mp4",
        [*_testsrc(48, 32, "100", frames=1000), *_X264, "-g", "250", "-pix_fmt", "yuv420p"],
        dict(codec="h264", pixel_format="yuv420p", width=48, height=32, frames=1000, fps=100.0, tags=("long",)),
    ),
    # Large enough that holding every frame (300 x 691,200 bytes of RGB) would show in the peak memory.
    "h264_360p_300_frames": (
        "mp4",
        [*_testsrc(640, 360, "30", frames=300), *_X264, "-preset", "ultrafast", "-pix_fmt", "yuv420p"],
        dict(codec="h264", pixel_format="yuv420p", width=640, height=360, frames=300, fps=30.0, tags=("memory",)),
    ),
    "h264_with_audio": (
        "mp4",
        [
            *_testsrc(128, 72, "25", 2),
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:duration=2",
            *_X264,
            "-pix_fmt",
            "yuv420p",
            "-c:a",
            "aac",
            "-b:a",
            "32k",
        ],
        dict(codec="h264", pixel_format="yuv420p", width=128, height=72, frames=50, fps=25.0, tags=("audio",)),
    ),
}

# name -> (source clip, ffmpeg arguments applied to a copy of its streams, extension, properties).
_REMUXED: dict[str, tuple[str, list[str], str, dict]] = {
    # Display matrices: 4:4:4 for the 90-degree ones (no chroma subsampling, so converting before or after
    # the rotation gives the same pixels and ffmpeg's own autorotation is an exact reference), 4:2:0 for 180.
    "h264_444_rot90": (
        "h264_444_odd",
        ["-metadata:s:v:0", "rotate=90"],
        "mp4",
        dict(
            rotation=90,
            codec="h264",
            pixel_format="yuv444p",
            width=61,
            height=97,
            frames=25,
            fps=25.0,
            tags=("rotation", "odd", "444", "filtergraph"),
        ),
    ),
    "h264_444_rot270": (
        "h264_444_odd",
        ["-metadata:s:v:0", "rotate=270"],
        "mp4",
        dict(
            rotation=270,
            codec="h264",
            pixel_format="yuv444p",
            width=61,
            height=97,
            frames=25,
            fps=25.0,
            tags=("rotation", "odd", "444", "filtergraph"),
        ),
    ),
    "h264_420_rot180": (
        "h264_420_bt709_bframes",
        ["-metadata:s:v:0", "rotate=180"],
        "mp4",
        dict(
            rotation=180,
            codec="h264",
            pixel_format="yuv420p",
            width=192,
            height=108,
            frames=90,
            fps=30000 / 1001,
            tags=("rotation", "bframes", "bt709", "filtergraph"),
        ),
    ),
    "h264_420_rot90_bframes": (
        "h264_420_bt709_bframes",
        ["-metadata:s:v:0", "rotate=90"],
        "mp4",
        dict(
            rotation=90,
            codec="h264",
            pixel_format="yuv420p",
            width=108,
            height=192,
            frames=90,
            fps=30000 / 1001,
            tags=("rotation", "bframes", "bt709", "filtergraph"),
        ),
    ),
    # MPEG-TS: timestamps start at 1.4 s (the muxer's offset), not 0.
    "h264_bframes_ts": (
        "h264_420_bt709_bframes",
        [],
        "ts",
        dict(
            codec="h264",
            pixel_format="yuv420p",
            width=192,
            height=108,
            frames=90,
            fps=30000 / 1001,
            tags=("bframes", "offset"),
        ),
    ),
    # A cut by stream copy: the frames before the cut stay in the file, behind an edit list that marks
    # them discarded (AV_PKT_FLAG_DISCARD), which torchcodec does not count.
    "h264_edit_list": (
        "h264_420_bt709_bframes",
        ["-ss", "1.1"],
        "mp4",
        dict(codec="h264", pixel_format="yuv420p", width=192, height=108, tags=("edit_list", "bframes")),
    ),
    # moov written first, so a cut file still has the index of every frame (the data of some is gone).
    "h264_faststart": (
        "h264_420_untagged",
        ["-movflags", "+faststart"],
        "mp4",
        dict(codec="h264", pixel_format="yuv420p", width=160, height=96, frames=50, fps=25.0),
    ),
}

# name -> (source clip, fraction of its bytes kept, extension): files cut short.
_TRUNCATED = {
    "truncated_moov_lost": ("h264_420_bt709_bframes", 0.6, "mp4"),  # moov is at the end: nothing to demux
    "truncated_faststart": ("h264_faststart", 0.6, "mp4"),  # the index promises 50 frames, the data ends early
    "truncated_webm": ("vp9_420_odd", 0.6, "webm"),  # no index needed: the clusters before the cut demux
}


def ffmpeg_missing() -> str | None:
    """Why the corpus cannot be made here (no ffmpeg on PATH), or None."""
    return None if shutil.which("ffmpeg") else f"the ffmpeg command line is not installed ({INSTALL_FFMPEG})"


def require_ffmpeg() -> None:
    """Skip the calling test where the corpus cannot be made."""
    import pytest

    reason = ffmpeg_missing()
    if reason:
        pytest.skip(reason)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mmworker" / f"videos-v{CORPUS_VERSION}"


def _run(args: list[str]) -> None:
    proc = subprocess.run(["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"ffmpeg {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")


def _make(directory: Path) -> None:
    def out(name: str, ext: str) -> Path:
        return directory / f"{name}.{ext}"

    for name, (ext, args, _) in _ENCODED.items():
        final = out(name, ext)
        if not final.exists():
            tmp = directory / f".{name}.part.{ext}"
            audio = "audio" in _ENCODED[name][2].get("tags", ())
            _run([*args, *([] if audio else _NO_AUDIO), "-map_metadata", "-1", str(tmp)])
            tmp.rename(final)
    for name, (source, args, ext, _) in _REMUXED.items():
        final = out(name, ext)
        if not final.exists():
            src_ext = _ENCODED[source][0] if source in _ENCODED else _REMUXED[source][2]
            tmp = directory / f".{name}.part.{ext}"
            seek, rest = (args[:2], args[2:]) if args[:1] == ["-ss"] else ([], args)
            _run([*seek, "-i", str(out(source, src_ext)), "-c", "copy", *rest, str(tmp)])
            tmp.rename(final)
    for name, (source, fraction, ext) in _TRUNCATED.items():
        final = out(name, ext)
        if not final.exists():
            src = next(directory.glob(f"{source}.*")).read_bytes()
            tmp = directory / f".{name}.part.{ext}"
            tmp.write_bytes(src[: int(len(src) * fraction)])
            tmp.rename(final)
    final = out("h264_size_change", "mkv")
    if not final.exists():
        # Two streams of different sizes joined by stream copy: the header says 96x64, frames 10-19 are 128x96.
        parts = []
        for k, size in enumerate(("96x64", "128x96")):
            part = directory / f".size_change_{k}.ts"
            _run(["-f", "lavfi", "-i", f"testsrc2=size={size}:rate=25", "-frames:v", "10", *_X264, "-pix_fmt", "yuv420p",
                  *_NO_AUDIO, str(part)])  # fmt: skip
            parts.append(part)
        listing = directory / ".size_change.txt"
        listing.write_text("".join(f"file '{p.name}'\n" for p in parts))
        tmp = directory / ".h264_size_change.part.mkv"
        _run(["-f", "concat", "-safe", "0", "-i", str(listing), "-c", "copy", str(tmp)])
        tmp.rename(final)
        for path in (*parts, listing):
            path.unlink()
    final = out("audio_only", "m4a")
    if not final.exists():
        tmp = directory / ".audio_only.part.m4a"
        _run(["-f", "lavfi", "-i", "sine=frequency=440:duration=1", "-c:a", "aac", "-b:a", "32k", str(tmp)])
        tmp.rename(final)
    final = out("unknown_codec", "mp4")
    if not final.exists():
        # The sample entry's fourcc renamed: the demuxer still reads the stream, no decoder knows it.
        data = bytearray(out("h264_420_untagged", "mp4").read_bytes())
        entry = data.index(b"stsd") + 16  # after version/flags, entry count and the entry's size
        assert data[entry : entry + 4] == b"avc1", "expected the avc1 sample entry after stsd"
        data[entry : entry + 4] = b"zzz9"
        tmp = directory / ".unknown_codec.part.mp4"
        tmp.write_bytes(bytes(data))
        tmp.rename(final)


def corpus() -> dict[str, Clip]:
    """Every clip by name, made first if this corpus version is not in the cache yet.

    Safe to call from concurrent processes: the first takes a lock and makes the clips, the others wait
    for it. Raises RuntimeError when ffmpeg is missing or fails (tests call `require_ffmpeg()` first).
    """
    directory = cache_dir()
    if not (directory / _COMPLETE).exists():
        reason = ffmpeg_missing()
        if reason:
            raise RuntimeError(reason)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (directory / _COMPLETE).exists():
                _make(directory)
                (directory / _COMPLETE).write_text("ok\n")
    return catalogue()


def catalogue() -> dict[str, Clip]:
    """Every clip by name, whether made yet or not (for test parametrisation, which must not need ffmpeg)."""
    directory = cache_dir()
    clips: dict[str, Clip] = {}
    for name, (ext, _, props) in _ENCODED.items():
        clips[name] = Clip(name, directory / f"{name}.{ext}", **props)
    for name, (_, _, ext, props) in _REMUXED.items():
        clips[name] = Clip(name, directory / f"{name}.{ext}", **props)
    for name, (_, _, ext) in _TRUNCATED.items():
        clips[name] = Clip(name, directory / f"{name}.{ext}", decodable=False, tags=("truncated",))
    # Frames 0-9 decode (at the header's size), any of 10-19 is refused, by torchcodec as by mmworker.
    clips["h264_size_change"] = Clip("h264_size_change", directory / "h264_size_change.mkv", codec="h264",
                                     pixel_format="yuv420p", width=96, height=64, frames=20, fps=25.0, decodable=False,
                                     tags=("size_change",))  # fmt: skip
    clips["audio_only"] = Clip("audio_only", directory / "audio_only.m4a", decodable=False, tags=("no_video",))
    clips["unknown_codec"] = Clip("unknown_codec", directory / "unknown_codec.mp4", decodable=False,
                                  tags=("unknown_codec",))  # fmt: skip
    return clips


def names(tag: str | None = None, decodable: bool | None = True) -> list[str]:
    """Clip names in corpus order: those a decoder must decode (decodable=True), must refuse (False) or all
    (None), and with `tag` among their tags if given. Needs no ffmpeg."""
    return [name for name, clip in catalogue().items()
            if (decodable is None or clip.decodable == decodable) and (tag is None or tag in clip.tags)]  # fmt: skip
