"""Video decoding: frame count and rate as torchcodec's exact mode finds them, frames in RGB as it converts them.

SGLang 0.5.23 decodes video with torchcodec 0.17 (`VideoDecoder(source, dimension_order="NHWC")`,
`metadata.num_frames`, `metadata.average_fps`, `get_frames_at(indices)`), on the CPU through the
host's FFmpeg libraries. mmworker decodes with PyAV, whose wheels bundle FFmpeg (nothing to install
on a serving host), and reproduces what torchcodec computes (docs/behaviour.md §13):

- **Count and rate** (`probe`): one demux pass, nothing decoded but the first frame. Every packet of
  the video stream not flagged discarded (AV_PKT_FLAG_DISCARD: cut away by an edit list) is a frame;
  frames are indexed in pts order (a packet's pts, its dts where it has none). The average rate is
  count / (max(pts + duration) - min(pts)) in seconds (each end converted as pts * num / den, as
  torchcodec does), or the header's r_frame_rate when that span is zero.
- **Which frame an index is** (`decode_frames`): torchcodec looks up the index's pts, seeks, and
  returns the first frame the decoder outputs whose pts (else dts) is at least that pts; an index
  that follows the one just returned takes the next frame out of the decoder. Here the same rule is
  applied to ONE sequential decode of the stream, which is what torchcodec's seeks amount to on a
  conforming stream (a seek lands on a keyframe at or before the target; decoding on from there or
  from the start outputs the same frames).
- **Only the frames needed** (H.264): a frame no other frame references (nal_ref_idc 0) and that is
  not sampled is not decoded at all (FFmpeg's skip_frame NONREF, switched per packet: FFmpeg reads it
  per slice); reference frames and sampled ones are. Every sampled frame is still output, in the
  same order, so the rule above finds the same frames; this holds when each sampled index's pts is
  exactly its seek target (checked first) and each frame handed out is checked to carry its index's
  pts; if one does not, the decode starts over with every frame decoded and resumes where it was. Not
  for HEVC, whose "non-reference" pictures may still be referenced by higher temporal sub-layers.
- **Conversion to RGB**: swscale, from the frame's own colour matrix and range (the range tag when
  the frame has one, else the pixel format's: full for yuvj* and grey, limited otherwise), with
  swscale's default bicubic scaler (used for chroma upsampling), to full-range rgb24: what
  torchcodec's swscale and filter-graph paths both do. PyAV's default `to_ndarray()` would ignore the
  tags (BT.601, limited range) and use bilinear.
- **Rotation**: torchcodec applies the display matrix after conversion (its filter graph runs
  `format=rgb24,transpose=...`): the RGB frame is turned by the matrix's angle rounded to a multiple
  of 90 degrees, counter-clockwise, and width and height swap for 90 and 270. The angle is read from
  the first decoded frame, to which FFmpeg copies the container's matrix.

Only the frames asked for are converted, each straight into its row of the output; the decoder
holds its reference frames and one RGB frame is in flight, so peak memory is the output plus a few
frames, whatever the clip's length. FFmpeg runs single-threaded (thread_count 1, as torchcodec's
default `num_ffmpeg_threads=1`): a worker is one process on one core, and the bytes do not depend
on it.

Hostile input: the budgets below are checked against what the container claims before anything is
decoded (byte size, the stream's dimensions, frame count and duration from the header), then again
while demuxing (packets counted, timestamp span) and decoding (every frame's dimensions; a frame
larger than the header said is refused, as torchcodec refuses it). Only the containers in
ACCEPTED_CONTAINERS are opened, and FFmpeg may open nothing but the input itself (no nested
protocols: a playlist cannot make it read a file or a URL). Corrupt, truncated and unsupported
inputs raise MmError naming the cause (Outcome.BAD_INPUT, or UNSUPPORTED for valid input refused on
purpose); every container is closed on every path. A BudgetExceeded from the pool's CPU budget
passes through untouched (nothing here catches BaseException), and the Python file objects FFmpeg
reads from are C-implemented (io.BytesIO, io.BufferedReader), so that signal never lands inside
PyAV's I/O callbacks, which would swallow it.

PyAV is the optional `video` extra (pyproject.toml): without it, every function here raises
UnsupportedInput saying how to install it.
"""

from __future__ import annotations

import io
import itertools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from mmworker.common.budget import MAX_VIDEO_FETCH_BYTES
from mmworker.errors import MmError, UnsupportedInput, UsageError

try:
    import av
    import av.error
    from av.video.reformatter import VideoReformatter
except ImportError:  # the `video` extra is not installed
    av = None

# --- Budgets: what one video may cost before anything of it is decoded. -------------------------------
# Bytes of one encoded video. Below the request's own budget (1.25 GiB, mmworker.common.budget) so that a
# video and a few images still fit in one request; 30 minutes of 1080p at 4.5 Mbit/s is ~1 GB. The same
# constant caps a video's fetched stream (mmworker.common.budget, where it lives so fetching needs no PyAV).
MAX_VIDEO_BYTES = MAX_VIDEO_FETCH_BYTES
# Seconds of video. Decoding is sequential, so its cost grows with the video's length, not with the
# number of frames sampled: an hour of 1080p H.264 is ~4 minutes of one core here (the pool's per-job CPU
# budget stops it sooner). SGLang's sampling never takes more than 768 frames whatever the length.
MAX_VIDEO_SECONDS = 3600.0
# Frames of video: an hour at 60 fps. Bounds the demux pass's index and the decode for streams whose
# timestamps claim a short duration.
MAX_VIDEO_FRAMES = 216_000
# Pixels of one frame: 4096 x 4096 takes every 4K format in either orientation; 8K (33 MP, 100 MB per RGB
# frame) is refused. Qwen-VL resizes every frame to at most 602,112 pixels anyway.
MAX_FRAME_PIXELS = 4096 * 4096
# Bytes of RGB output decode_frames allocates (768 sampled 1080p frames, SGLang's sampling cap at the
# commonest large size, are 4.45 GiB; 768 frames of 4K, 17.8 GiB, are refused: such a clip needs its
# frames resized as they come, not all held at source size).
MAX_OUTPUT_BYTES = 5 << 30

# Demuxers FFmpeg may use (its short names): the containers real videos come in. The rest (playlists such
# as HLS and concat, image sequences, raw elementary streams, devices, the tty text fallback) are never
# opened, whatever the input's bytes look like.
ACCEPTED_CONTAINERS = ("mov", "mp4", "matroska", "webm", "avi", "mpegts", "mpeg", "flv", "ogg", "ivf")
_CONTAINER_NAMES = "MP4/MOV, Matroska/WebM, AVI, MPEG-TS, MPEG-PS, FLV, Ogg, IVF"

# Decoder threads: 1, so that a worker (one process pinned to one core) stays one thread. The tests set 0
# (FFmpeg's choice: frame threads on every core) to show that the bytes do not depend on it.
_FFMPEG_THREADS = 1
_NOPTS = -(1 << 63)  # AV_NOPTS_VALUE: no timestamp
_SWS_CS_DEFAULT, _SWS_CS_ITU709, _SWS_CS_SMPTE170M = 5, 1, 6  # swscale's colour-matrix numbers
_RANGE_MPEG, _RANGE_JPEG = 1, 2  # AVColorRange: limited, full
# Pixel formats swscale takes as full range when the frame has no range tag (its handle_jpeg()).
_FULL_RANGE_FORMATS = ("yuvj420p", "yuvj422p", "yuvj444p", "yuvj440p", "yuvj411p", "ya8", "ya16le", "ya16be")

# FFmpeg's names for the colour tags (av_color_*_name), unspecified as None.
_SPACES = {0: "gbr", 1: "bt709", 4: "fcc", 5: "bt470bg", 6: "smpte170m", 7: "smpte240m", 8: "ycgco",
           9: "bt2020nc", 10: "bt2020c", 11: "smpte2085", 12: "chroma-derived-nc", 13: "chroma-derived-c",
           14: "ictcp", 15: "ipt-c2", 16: "ycgco-re", 17: "ycgco-ro"}  # fmt: skip
_RANGES = {1: "tv", 2: "pc"}
_PRIMARIES = {1: "bt709", 4: "bt470m", 5: "bt470bg", 6: "smpte170m", 7: "smpte240m", 8: "film", 9: "bt2020",
              10: "smpte428", 11: "smpte431", 12: "smpte432", 22: "ebu3213"}  # fmt: skip
_TRANSFERS = {1: "bt709", 4: "gamma22", 5: "gamma28", 6: "smpte170m", 7: "smpte240m", 8: "linear", 9: "log100",
              10: "log316", 11: "iec61966-2-4", 12: "bt1361e", 13: "iec61966-2-1", 14: "bt2020-10",
              15: "bt2020-12", 16: "smpte2084", 17: "smpte428", 18: "arib-std-b67"}  # fmt: skip

Source = bytes | bytearray | memoryview | str | os.PathLike


@dataclass(frozen=True)
class VideoInfo:
    """What `probe` found: the video stream as torchcodec's exact mode describes it.

    `frames` and `fps` are torchcodec's `num_frames` and `average_fps`, `width` and `height` the frames'
    size as decoded and rotated (torchcodec's `width`/`height`), `rotation` the angle they are turned by,
    counter-clockwise (0, 90, 180 or 270), `duration` the timestamp span the rate was computed over (0 when
    the rate is the header's). The colour tags and pixel format are the stream header's, by FFmpeg's
    names (None: unspecified). `frame_pts` holds each frame's pts in index order (time base `time_base`):
    what `decode_frames` needs to find an index, so that passing this object to it saves a second scan.
    """

    frames: int
    fps: float
    width: int
    height: int
    rotation: int
    duration: float
    codec: str
    pixel_format: str | None
    color_space: str | None
    color_range: str | None
    color_primaries: str | None
    color_transfer: str | None
    container: str
    time_base: Fraction = field(repr=False)
    frame_pts: tuple[int, ...] = field(repr=False)


def video_decoding_available() -> bool:
    """Whether PyAV (the `video` extra) is installed, without which no video is decoded."""
    return av is not None


def probe(data: Source) -> VideoInfo:
    """The video's frame count, average rate, size after rotation and tags; MmError if it is not one we decode.

    `data` is the encoded file (bytes or a memoryview of them) or a path to it. Demuxes the whole stream
    and decodes its first frame only (to read the rotation the frames carry).
    """
    with _Input(data) as video:
        return video.probe()


def decode_frames(data: Source, indices: Sequence[int] | np.ndarray, out: np.ndarray | None = None,
                  info: VideoInfo | None = None) -> np.ndarray:  # fmt: skip
    """The frames at `indices` as uint8 RGB [len(indices), height, width, 3], equal to torchcodec's
    `get_frames_at(indices)` with dimension_order="NHWC".

    `indices` are frame indices in [0, frames), strictly increasing (SGLang's sampling gives them so:
    `np.unique(np.linspace(...))`). `out`, when given, receives the frames (any writeable uint8 array of
    that shape, strided or not) and is returned; otherwise one is allocated (within MAX_OUTPUT_BYTES).
    `info` is `probe(data)` of the same data, if the caller has it (else it is computed here).
    """
    if info is None:
        info = probe(data)
    wanted = _check_indices(indices, info.frames)
    shape = (len(wanted), info.height, info.width, 3)
    if out is None:
        nbytes = math.prod(shape)
        if nbytes > MAX_OUTPUT_BYTES:
            raise MmError(
                f"video decode: {len(wanted)} frames of {info.width}x{info.height} are {nbytes} bytes of RGB, "
                f"over the {MAX_OUTPUT_BYTES}-byte budget (MAX_OUTPUT_BYTES)"
            )
        out = np.empty(shape, np.uint8)
    elif not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != np.uint8 or not out.flags.writeable:
        raise UsageError(f"decode_frames: out must be a writeable uint8 array of shape {shape}, got "
                         f"{getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}")  # fmt: skip
    if len(wanted):

        def keep(position: int, rgb: np.ndarray) -> None:
            out[position] = rgb

        decode_each(data, wanted, keep, info)
    return out


def decode_each(data: Source, indices: Sequence[int] | np.ndarray, keep: Callable[[int, np.ndarray], None],
                info: VideoInfo | None = None) -> None:  # fmt: skip
    """`decode_frames` as a stream: keep(position, rgb) for each of `indices` in turn, nothing held.

    `rgb` is the frame `decode_frames` would store at `position`, uint8 [height, width, 3] (rotated), as a
    view of the decoder's buffer that is valid only during the call (rows may be strided, and a rotated
    frame is a strided view): a consumer that resizes each frame as it comes holds no decoded frame
    beyond the one in flight. Same rules for `indices` and `info` as `decode_frames`.
    """
    if info is None:
        info = probe(data)
    wanted = _check_indices(indices, info.frames)
    if not wanted:
        return
    turns = info.rotation // 90

    def turned(position: int, rgb: np.ndarray) -> None:
        keep(position, np.rot90(rgb, turns) if turns else rgb)

    with _Input(data) as video:
        done = video.decode(info, wanted, turned, skip=True)
    if done < len(wanted):  # a frame broke the skipping's assumption (module docstring): decode every frame
        with _Input(data) as video:
            video.decode(info, wanted, turned, skip=False, start=done)


def _check_indices(indices: Sequence[int] | np.ndarray, count: int) -> list[int]:
    array = np.asarray(indices)
    if array.size and array.dtype.kind not in "iu":
        raise UsageError(f"decode_frames: indices must be integers, got {array.dtype}")
    wanted = array.astype(np.int64).reshape(-1).tolist()
    for a, b in itertools.pairwise(wanted):
        if b <= a:
            raise UsageError(f"decode_frames: indices must be strictly increasing, got {a} then {b}")
    if wanted and (wanted[0] < 0 or wanted[-1] >= count):
        raise UsageError(f"decode_frames: indices must lie in [0, {count}), got {wanted[0]}..{wanted[-1]}")
    return wanted


def _seconds(pts: int, time_base: Fraction) -> float:
    # torchcodec's pts_to_seconds: double(pts) * num / den, multiplication first (not av_q2d).
    return float(pts) * time_base.numerator / time_base.denominator


def _closest_pts(seconds: float, time_base: Fraction) -> int:
    # torchcodec's seconds_to_closest_pts: round(seconds * den / num), half away from zero.
    x = seconds * time_base.denominator / time_base.numerator
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def _failure(what: str, exc: Exception) -> MmError:
    """The MmError for an exception PyAV raised while doing `what` on the input.

    FFmpeg's errors give their text (without the file name PyAV appends); anything else PyAV lets out on
    a hostile input (a ValueError, an OverflowError from a field out of range) gives its type and text:
    the input's content caused it, so it is the input's rejection, not mmworker's failure.
    """
    ffmpeg = isinstance(exc, av.error.FFmpegError)
    text = (exc.strerror or str(exc)) if ffmpeg else f"{type(exc).__name__}: {exc}"
    return MmError(f"video decode: {what}: {text}")


class _Input:
    """One opened container and its video stream; a context manager that always closes what it opened."""

    def __init__(self, data: Source) -> None:
        if av is None:
            raise UnsupportedInput("video decode: PyAV is not installed (pip install 'mmworker[video]')")
        self._file: io.IOBase | None = None
        self._container = None
        if isinstance(data, (bytes, bytearray, memoryview)):
            size = memoryview(data).nbytes
            self._check_bytes(size)
            # io.BytesIO: C-implemented reads (see the module docstring); it shares a bytes object's
            # buffer and copies any other.
            self._file = io.BytesIO(data)
        elif isinstance(data, (str, os.PathLike)):
            try:
                self._file = open(data, "rb")  # noqa: SIM115  (closed by close())
            except OSError as exc:
                raise MmError(f"video decode: cannot open {os.fspath(data)!r}: {exc.strerror}") from None
            try:
                self._check_bytes(os.fstat(self._file.fileno()).st_size)
            except BaseException:
                self._file.close()
                raise
        else:
            raise UsageError(f"video decode: expected bytes, a memoryview or a path, got {type(data).__name__}")

    @staticmethod
    def _check_bytes(size: int) -> None:
        if size > MAX_VIDEO_BYTES:
            raise MmError(f"video decode: {size} bytes, over the {MAX_VIDEO_BYTES}-byte budget (MAX_VIDEO_BYTES)")
        if size == 0:
            raise MmError("video decode: empty input")

    def __enter__(self) -> _Input:
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        container, self._container = self._container, None
        if container is not None:
            container.close()
        file, self._file = self._file, None
        if file is not None:
            file.close()

    def _open(self) -> None:
        options = {
            # No nested protocols: a playlist or reference inside the input cannot open a file or URL.
            "protocol_whitelist": "",
            "format_whitelist": ",".join(ACCEPTED_CONTAINERS),
            # Also given to the decoders avformat_find_stream_info opens: a header claiming a huge frame
            # fails there before a buffer is made for it (twice the budget: FFmpeg counts padded widths).
            "max_pixels": str(2 * MAX_FRAME_PIXELS),
        }
        try:
            # Tags are text of the file's choosing: undecodable bytes in them are replaced, not fatal.
            self._container = av.open(self._file, mode="r", options=options, metadata_errors="replace")
        except Exception as exc:  # PyAV's, on this input: see _failure
            if isinstance(exc, av.error.FFmpegError) and exc.errno == 22:  # EINVAL: a format not on the whitelist
                raise UnsupportedInput(f"video decode: not a container mmworker accepts ({_CONTAINER_NAMES})") from None
            raise _failure("cannot read the container", exc) from None
        container = self._container
        try:
            stream = container.streams.best("video")
        except av.error.FFmpegError:
            stream = None
        if stream is None:
            raise MmError(f"video decode: no video stream in the {container.format.name} container")
        self._stream = stream
        context = stream.codec_context
        if context is None:
            raise UnsupportedInput("video decode: the video stream's codec has no decoder (unknown codec)")
        # One thread, like torchcodec's default (num_ffmpeg_threads=1); set before the codec opens.
        context.thread_count = _FFMPEG_THREADS
        if _FFMPEG_THREADS == 1:
            context.thread_type = 0  # neither frame nor slice threads
        context.options = {"max_pixels": str(2 * MAX_FRAME_PIXELS)}
        self._context = context

    def _check_claims(self) -> None:
        """The header's claims against the budgets, before any packet is read."""
        stream, context = self._stream, self._context
        w, h = context.width, context.height
        if w <= 0 or h <= 0:
            raise MmError(f"video decode: the video stream has no frame size ({w}x{h})")
        if w * h > MAX_FRAME_PIXELS:
            raise UnsupportedInput(
                f"video decode: frames of {w}x{h} are over {MAX_FRAME_PIXELS} pixels (MAX_FRAME_PIXELS)"
            )
        if stream.frames and stream.frames > MAX_VIDEO_FRAMES:
            raise MmError(
                f"video decode: the header claims {stream.frames} frames, over {MAX_VIDEO_FRAMES} (MAX_VIDEO_FRAMES)"
            )
        claims = []
        if stream.duration and stream.time_base:
            claims.append(float(stream.duration * stream.time_base))
        if self._container.duration:
            claims.append(self._container.duration / 1_000_000)
        if claims and max(claims) > MAX_VIDEO_SECONDS:
            raise MmError(f"video decode: the header claims {max(claims):.1f} s, over {MAX_VIDEO_SECONDS:.0f} s "
                          "(MAX_VIDEO_SECONDS)")  # fmt: skip

    def _packets(self):
        """The video stream's packets as the container yields them, then PyAV's empty flush packet."""
        try:
            yield from self._container.demux(self._stream)
        except Exception as exc:  # PyAV's, on this input: see _failure
            raise _failure("cannot read the container", exc) from None

    def _frames(self, packet):
        try:
            return self._context.decode(packet)
        except Exception as exc:  # PyAV's, on this input: see _failure
            raise _failure("the video stream does not decode", exc) from None

    def probe(self) -> VideoInfo:
        self._check_claims()
        stream, context = self._stream, self._context
        time_base = stream.time_base
        if not time_base:
            raise MmError("video decode: the video stream has no time base")
        all_pts: list[int] = []
        begin, end = None, None
        first = None
        pending = None  # a packet is known to be real once another follows it (PyAV's flush packet is last)
        for packet in self._packets():
            if pending is not None:
                if first is None:
                    for frame in self._frames(pending):
                        first = frame
                        break
                if not pending.is_discard:
                    pts = pending.pts if pending.pts is not None else pending.dts
                    pts = _NOPTS if pts is None else pts
                    duration = pending.duration or 0
                    begin = pts if begin is None else min(begin, pts)
                    end = pts + duration if end is None else max(end, pts + duration)
                    all_pts.append(pts)
                    if len(all_pts) > MAX_VIDEO_FRAMES:
                        raise MmError(f"video decode: more than {MAX_VIDEO_FRAMES} frames (MAX_VIDEO_FRAMES)")
            pending = packet
        if first is None and pending is not None:  # frames held back by the decoder until the end
            for frame in self._frames(pending):
                first = frame
                break
        count = len(all_pts)
        if count == 0:
            raise MmError("video decode: the video stream has no frames")
        if first is None:
            raise MmError("video decode: no frame of the video stream decodes")
        span = _seconds(end, time_base) - _seconds(begin, time_base)
        if span > MAX_VIDEO_SECONDS:
            raise MmError(f"video decode: the timestamps span {span:.1f} s, over {MAX_VIDEO_SECONDS:.0f} s "
                          "(MAX_VIDEO_SECONDS)")  # fmt: skip
        if span != 0.0:
            fps = count / span
        elif stream.base_rate:
            fps = stream.base_rate.numerator / stream.base_rate.denominator
        else:
            fps = 0.0
        if not 0.0 < fps < math.inf:  # torchcodec would report it; no sampling can use it
            raise MmError(f"video decode: no usable frame rate ({count} frames over {span} s, header rate "
                          f"{stream.base_rate})")  # fmt: skip
        self._check_pixels(first)
        self._check_frame_size(first, 0, context.width, context.height)
        rotation = _quarter_turns(first.rotation) * 90
        w, h = (context.height, context.width) if rotation in (90, 270) else (context.width, context.height)
        return VideoInfo(
            frames=count, fps=fps, width=w, height=h, rotation=rotation, duration=span,
            codec=context.codec.canonical_name, pixel_format=context.pix_fmt,
            color_space=_SPACES.get(context.colorspace), color_range=_RANGES.get(context.color_range),
            color_primaries=_PRIMARIES.get(context.color_primaries), color_transfer=_TRANSFERS.get(context.color_trc),
            container=self._container.format.name, time_base=time_base, frame_pts=tuple(sorted(all_pts)),
        )  # fmt: skip

    @staticmethod
    def _check_pixels(frame) -> None:
        if frame.width * frame.height > MAX_FRAME_PIXELS:
            raise UnsupportedInput(f"video decode: a frame of {frame.width}x{frame.height} is over {MAX_FRAME_PIXELS} "
                                   "pixels (MAX_FRAME_PIXELS)")  # fmt: skip

    @staticmethod
    def _check_frame_size(frame, index: int, width: int, height: int) -> None:
        # torchcodec sizes its output from the stream header and refuses a frame of another size (a
        # resolution change mid-stream), but only among the frames it returns: so does this.
        if (frame.width, frame.height) != (width, height):
            raise UnsupportedInput(f"video decode: frame {index} is {frame.width}x{frame.height} in a stream of "
                                   f"{width}x{height} (a frame size change mid-stream)")  # fmt: skip

    def decode(self, info: VideoInfo, wanted: list[int], keep: Callable[[int, np.ndarray], None], *, skip: bool,
               start: int = 0) -> int:  # fmt: skip
        """Decode the stream once, from the start, handing keep(position, rgb) the frame for each wanted index
        from position `start` on; with `skip`, H.264 non-reference frames not wanted are not decoded. Returns
        len(wanted), or with `skip` the position whose frame did not carry its index's pts (nothing handed
        out for it: the caller decodes again without skipping)."""
        self._check_claims()
        context, time_base = self._context, info.time_base
        if self._stream.time_base != time_base or len(info.frame_pts) != info.frames:
            raise UsageError("decode_frames: info is not probe() of this data")
        needed = None  # the pts of the frames that must be decoded, when others may be skipped
        if skip and context.codec.name == "h264":
            targets = [info.frame_pts[i] for i in wanted]
            if all(_closest_pts(_seconds(p, time_base), time_base) == p for p in targets):
                needed = set(targets)
        reformatter = VideoReformatter()
        width, height = context.width, context.height
        position = 0  # into wanted
        cursor = _NOPTS  # torchcodec's: frames before it are skipped
        previous = None  # the index last returned
        seek = True  # whether the current target moved the cursor (it does unless it follows `previous`)
        decoded = 0
        for packet in self._packets():
            if needed is not None:  # PyAV's flush packet (no pts) decodes whatever is left
                context.skip_frame = "DEFAULT" if packet.pts is None or packet.pts in needed else "NONREF"
            for frame in self._frames(packet):
                decoded += 1
                if decoded > MAX_VIDEO_FRAMES:
                    raise MmError(f"video decode: more than {MAX_VIDEO_FRAMES} frames decoded (MAX_VIDEO_FRAMES)")
                self._check_pixels(frame)
                index = wanted[position]
                if seek:
                    cursor = _closest_pts(_seconds(info.frame_pts[index], time_base), time_base)
                    seek = False
                pts = frame.pts if frame.pts is not None else frame.dts
                if (_NOPTS if pts is None else pts) < cursor:
                    continue
                if needed is not None and pts != info.frame_pts[index]:
                    return position
                self._check_frame_size(frame, index, width, height)
                if position >= start:
                    keep(position, _to_rgb(reformatter, frame))
                previous, position = index, position + 1
                if position == len(wanted):
                    return position
                seek = wanted[position] != previous + 1
        if needed is not None:  # a wanted frame may have been skipped: the caller decodes again, every frame
            return position
        raise MmError(f"video decode: frame {wanted[position]} of {info.frames} never decoded (the stream ends "
                      "early: truncated or corrupt)")  # fmt: skip


def _quarter_turns(degrees: float) -> int:
    """torchcodec's rotation_from_degrees: the nearest multiple of 90 (std::round, halves away from zero), as
    counter-clockwise quarter turns in [0, 4)."""
    x = degrees / 90.0
    return int(math.copysign(math.floor(abs(x) + 0.5), x)) % 4


def _to_rgb(reformatter, frame) -> np.ndarray:
    """The frame as full-range rgb24, converted as torchcodec converts it; a view of PyAV's buffer."""
    space = frame.colorspace
    # PyAV sets swscale's matrix only when source and destination differ, and leaves a cached context's
    # matrix as it was for SWS_CS_DEFAULT: BT.601 is passed as SMPTE 170M (the same coefficients in
    # swscale's table) and the destination (unused for RGB output) is set to something else.
    source = _SWS_CS_SMPTE170M if space == _SWS_CS_DEFAULT else space
    target = _SWS_CS_SMPTE170M if source == _SWS_CS_ITU709 else _SWS_CS_ITU709
    name = frame.format.name
    untagged_full = name in _FULL_RANGE_FORMATS or name.startswith("gray")
    full = frame.color_range == _RANGE_JPEG or (frame.color_range != _RANGE_MPEG and untagged_full)
    rgb = reformatter.reformat(frame, format="rgb24", src_colorspace=source, dst_colorspace=target,
                               interpolation="BICUBIC", src_color_range=_RANGE_JPEG if full else _RANGE_MPEG,
                               dst_color_range=_RANGE_JPEG)  # fmt: skip
    plane = rgb.planes[0]
    rows = np.frombuffer(plane, np.uint8).reshape(rgb.height, plane.line_size)
    return rows[:, : rgb.width * 3].reshape(rgb.height, rgb.width, 3)
