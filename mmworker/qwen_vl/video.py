"""Qwen-VL video preprocessing: SGLang 0.5.23's sampling and resize, then transformers 5.19's video processor.

What SGLang's Qwen path computes for one video on the CPU (docs/behaviour.md §14), in one pass:

1. **Sampling** (`sample_indices`): SGLang's `smart_nframes` (2 frames per second of the decoder's
   average rate, at least 4, at most 768 and at most the clip's frames, floored to an even count),
   then `np.unique(np.linspace(0, total - 1, n, dtype=int64))`. transformers' own sampling is not
   used: SGLang hands it the sampled frames.
2. **First resize** (`first_resize_target`): SGLang's `preprocess_video` sizes every frame with its
   `smart_resize`, factor 28 for every model (Qwen3 and 3.5 too, whose patches make a factor of 32),
   the pixel budget shared out over the frames; torchvision's v1 float32 antialiased BILINEAR resize
   (mmworker.common.float_bilinear).
3. **The HF video processor** (`second_resize_target`) sizes the frames again: Qwen2-VL and 2.5-VL
   with the 2-D smart_resize of `Qwen2VLVideoProcessor` (factor 28, the checkpoint's image budget:
   the identity on SGLang's frames); Qwen3-VL and 3.5 with the 3-D smart_resize of
   `Qwen3VLVideoProcessor` over frames x height x width, factor 32, which resizes SGLang's
   multiples of 28 to multiples of 32 with torchvision's uint8 BICUBIC (aten_u8). Then the fused
   float32 normalisation (v - 255 mean) / (255 std) and the patch order of pixel_values, two frames
   per temporal patch (an odd count repeats the last frame, as HF pads).
4. **What the processor adds**: Qwen2.5-VL's `second_per_grid_ts`, temporal_patch_size / 24 for
   every video (SGLang passes no metadata, so HF's `sampled_fps` falls back to 24 fps); Qwen3's
   timestamps, one per temporal patch, the mean of its two frames' `index / fps` (the decoder's
   average rate), shown as `<{t:.1f} seconds>` before each frame pair's vision block.

Streaming (`preprocess_video`): frames are decoded one at a time in index order
(mmworker.common.video.decode_each) and each is resized as it comes; only the current temporal
patch's frames wait, at the final size, for the patchify, which writes that patch's rows of the
feature in place. Besides the feature (`alloc`) and the decoder's own frames (its reference frames
and the one being converted, at the source size), a video holds these frame-sized buffers whatever
its length: at the source size, one contiguous copy of the decoded frame, made only when the
decoder's rows are padded or the frame is rotated; at the first resize's size, one frame (3 bytes a
pixel); at the final size, temporal_patch_size frames of 4 bytes a pixel; for Qwen3 and 3.5, the
second resize's working frames, made per frame (its pass between the axes and its output, and under
pillow-simd Pillow's copy of its input), none larger than the first or final size. No decoded frame at
the source size outlives its own resize, and nothing grows with the number of frames but the feature.
"""

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmworker.common.float_bilinear import resize_frames
from mmworker.common.pixels import RgbImage, unpack_rgb
from mmworker.common.resize import resize_image, vertical_coefficients
from mmworker.common.video import Source, VideoInfo, decode_each, probe
from mmworker.errors import MmError
from mmworker.pipeline import Allocator, numpy_allocator, spec_mapping
from mmworker.qwen_vl.mrope import ROPE_MODEL_TYPES, SPLIT_VIDEO_MODEL_TYPES, TIMED_MODEL_TYPES
from mmworker.qwen_vl.patchify import normalisation, patchify_frames_into
from mmworker.qwen_vl.sizing import smart_resize
from mmworker.qwen_vl.spec import NAMED_SPECS, QwenSpec
from mmworker.qwen_vl.video_layout import timestamp_text

# --- SGLang 0.5.23, sglang/srt/multimodal/processors/qwen_vl.py (module constants there) ----------
# The factor of SGLang's first resize (its IMAGE_FACTOR), for every Qwen model.
SGLANG_FACTOR = 28
VIDEO_MIN_PIXELS = 128 * 28 * 28  # a frame's pixels, at least
VIDEO_MAX_PIXELS = 768 * 28 * 28  # a frame's pixels, at most
FRAME_FACTOR = 2  # sampled frame counts are multiples of this
FPS = 2.0  # frames sampled per second of video
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768


def _total_pixels_from_env() -> int:
    # SGLang reads the environment variable VIDEO_MAX_PIXELS once, at import, as the pixels of all
    # of a video's frames together (its VIDEO_TOTAL_PIXELS); unset, 90% of 128000 tokens of 28 x 28.
    # A value that is not a number fails this module's import, as it fails SGLang's.
    text = os.environ.get("VIDEO_MAX_PIXELS")
    if text is None:
        return int(128000 * 28 * 28 * 0.9)
    try:
        return int(float(text))
    except (ValueError, OverflowError):
        raise MmError(f"environment variable VIDEO_MAX_PIXELS must be a number, got {text!r}") from None


VIDEO_TOTAL_PIXELS = _total_pixels_from_env()

# --- transformers 5.19's video processors as the released checkpoints configure them -------------
# Qwen3-VL and Qwen3.5 ship a video_preprocessor_config.json: size {"shortest_edge": 4096,
# "longest_edge": 25165824} (pixels of frames x height x width together), patch 16, mean = std = 0.5.
QWEN3_VIDEO_MIN_PIXELS = 4096
QWEN3_VIDEO_MAX_PIXELS = 25165824
# Qwen2-VL and Qwen2.5-VL ship none: AutoVideoProcessor builds Qwen2VLVideoProcessor from the image
# processor's preprocessor_config.json, so its budget is the spec's min_pixels / max_pixels (3136 and
# 12845056 in the checkpoints) and its mean / std the spec's.
# The rate HF assumes for a video that comes without metadata (VideoMetadata.sampled_fps), which is
# what SGLang hands Qwen2.5-VL's processor: second_per_grid_ts = temporal_patch_size / 24.
HF_DEFAULT_FPS = 24

# SGLang's hf_config.model_type -> which processors it runs (the model types mrope groups them into).
MODEL_TYPES = {
    model_type: "qwen3" if model_type in SPLIT_VIDEO_MODEL_TYPES else "qwen2_5" if model_type in TIMED_MODEL_TYPES
    else "qwen2"
    for model_type in ROPE_MODEL_TYPES
}  # fmt: skip


@dataclass(frozen=True)
class VideoFeatures:
    """One video as SGLang's processor output carries it, and how it was sampled and sized.

    `pixel_values_videos` is [gt * gh * gw, 3 * temporal_patch_size * patch^2] in the spec's
    feature_dtype (float32: HF's bytes; bfloat16: those values rounded, as bits in uint16);
    `video_grid_thw` int64 [gt, gh, gw]. `second_per_grid_ts` is Qwen2.5-VL's (None for the others), the
    float32 value SGLang holds (HF's temporal_patch_size / 24 in a float32 tensor: 0.083333336);
    `timestamps` and `timestamp_texts` Qwen3's, one per temporal patch (None for Qwen2 and 2.5).
    `indices` are the sampled frame indices (int64), `fps` and `total_frames` the decoder's average
    rate and frame count (torchcodec's), `source_size`, `first_size` and `size` (height, width) of
    the decoded, first-resized and final frames.
    """

    pixel_values_videos: np.ndarray
    video_grid_thw: np.ndarray
    second_per_grid_ts: np.float32 | None
    timestamps: tuple[float, ...] | None
    timestamp_texts: tuple[str, ...] | None
    indices: np.ndarray
    fps: float
    total_frames: int
    source_size: tuple[int, int]
    first_size: tuple[int, int]
    size: tuple[int, int]


def model_kind(model_type: str) -> str:
    """Which processors SGLang runs for its model type (hf_config.model_type): "qwen2", "qwen2_5" or "qwen3"."""
    kind = MODEL_TYPES.get(model_type)
    if kind is None:
        raise MmError(f"qwen_vl video: unknown model type {model_type!r}; known: {', '.join(MODEL_TYPES)}")
    return kind


def _round_by(number: float, factor: int) -> int:
    return round(number / factor) * factor


def _ceil_by(number: float, factor: int) -> int:
    return math.ceil(number / factor) * factor


def _floor_by(number: float, factor: int) -> int:
    return math.floor(number / factor) * factor


def sample_nframes(
    total_frames: int,
    video_fps: float,
    *,
    fps: float | None = None,
    nframes: int | None = None,
    min_frames: int | None = None,
    max_frames: int | None = None,
) -> int:
    """SGLang's `smart_nframes`: how many frames to sample. The keyword arguments are its per-video
    settings (`--mm-process-config`'s video keys), None meaning unset; MmError where SGLang raises."""
    if nframes is not None and fps is not None:
        raise MmError("qwen_vl video: give either fps or nframes, not both (SGLang's smart_nframes)")
    if nframes is not None:
        n = _round_by(nframes, FRAME_FACTOR)
    else:
        if not video_fps > 0:
            raise MmError(f"qwen_vl video: the video's frame rate must be positive, got {video_fps}")
        rate = FPS if fps is None else fps
        low = _ceil_by(FPS_MIN_FRAMES if min_frames is None else min_frames, FRAME_FACTOR)
        high = _floor_by(min(FPS_MAX_FRAMES, total_frames) if max_frames is None else max_frames, FRAME_FACTOR)
        n = total_frames / video_fps * rate
        n = min(min(max(n, low), high), total_frames)
        n = _floor_by(n, FRAME_FACTOR)
    if not FRAME_FACTOR <= n <= total_frames:
        raise MmError(
            f"qwen_vl video: {total_frames} frame(s) at {video_fps:g} fps sample to {n}: nframes should be in "
            f"[{FRAME_FACTOR}, {total_frames}] (SGLang's smart_nframes; a video needs at least 2 frames)"
        )
    return n


def sample_indices(total_frames: int, video_fps: float, **settings: Any) -> np.ndarray:
    """The frame indices SGLang samples (int64, strictly increasing): `sample_nframes` of them, spread
    evenly from the first frame to the last (`np.unique(np.linspace(...))`). `settings` as `sample_nframes`."""
    n = sample_nframes(total_frames, video_fps, **settings)
    return np.unique(np.linspace(0, total_frames - 1, num=n, dtype=np.int64))


def first_resize_target(
    height: int,
    width: int,
    nframes: int,
    *,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    total_pixels: int | None = None,
) -> tuple[int, int]:
    """(height, width) of SGLang's resize of `nframes` frames of height x width: smart_resize with factor 28
    for every model, at least VIDEO_MIN_PIXELS a frame, at most VIDEO_MAX_PIXELS and at most the frames'
    share of VIDEO_TOTAL_PIXELS (2 frames' worth each: total / nframes * 2), never below 1.05 x the
    minimum. The keyword arguments are SGLang's per-video settings, None meaning unset."""
    if nframes < 1:
        raise MmError(f"qwen_vl video: no frames to size ({nframes})")
    low = VIDEO_MIN_PIXELS if min_pixels is None else min_pixels
    total = VIDEO_TOTAL_PIXELS if total_pixels is None else total_pixels
    # preprocess_video's arithmetic, floats included: a share of the total is a float.
    cap = max(min(VIDEO_MAX_PIXELS if max_pixels is None else max_pixels, total / nframes * FRAME_FACTOR),
              int(low * 1.05))  # fmt: skip
    if max_pixels is not None:
        cap = min(max_pixels, cap)
    return smart_resize(height, width, SGLANG_FACTOR, low, cap)


def _hf_qwen2_smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' qwen2_vl video smart_resize (video_processing_qwen2_vl.py): unlike SGLang's, the
    rounded sides are not clamped to the factor, the floored ones are."""
    if max(height, width) / min(height, width) > 200:
        raise MmError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar, w_bar = _round_by(height, factor), _round_by(width, factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, _floor_by(height / beta, factor))
        w_bar = max(factor, _floor_by(width / beta, factor))
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = _ceil_by(height * beta, factor), _ceil_by(width * beta, factor)
    return h_bar, w_bar


def _hf_qwen3_smart_resize(
    num_frames: int, height: int, width: int, temporal: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """transformers' qwen3_vl video smart_resize (video_processing_qwen3_vl.py): the budget is over
    frames x height x width, and sides below the factor are scaled up first."""
    if num_frames < temporal:
        raise MmError(f"qwen_vl video: {num_frames} frame(s), fewer than the temporal patch size {temporal}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise MmError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar, w_bar = _round_by(height, factor), _round_by(width, factor)
    t_bar = _round_by(num_frames, temporal)
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h_bar = max(factor, _floor_by(height / beta, factor))
        w_bar = max(factor, _floor_by(width / beta, factor))
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar, w_bar = _ceil_by(height * beta, factor), _ceil_by(width * beta, factor)
    return h_bar, w_bar


def second_resize_target(nframes: int, height: int, width: int, spec: QwenSpec, model_type: str) -> tuple[int, int]:
    """(height, width) the HF video processor resizes SGLang's `nframes` frames of height x width to (equal to
    them when it does not resize): module docstring, step 3."""
    factor = spec.factor
    if model_kind(model_type) == "qwen3":
        h, w = _hf_qwen3_smart_resize(nframes, height, width, spec.temporal_patch_size, factor,
                                      QWEN3_VIDEO_MIN_PIXELS, QWEN3_VIDEO_MAX_PIXELS)  # fmt: skip
    else:
        h, w = _hf_qwen2_smart_resize(height, width, factor, spec.min_pixels, spec.max_pixels)
    if h <= 0 or w <= 0:
        raise MmError(f"qwen_vl video: frames of {width}x{height} resize to {w}x{h}")
    return h, w


def timestamps(indices: Sequence[int] | np.ndarray, fps: float, temporal_patch_size: int = 2) -> list[float]:
    """Qwen3's timestamp of each temporal patch, as transformers' Qwen3VLProcessor computes it: the
    indices padded with the last to a multiple of temporal_patch_size, each index / fps, then the mean
    of each patch's first and last, (a / fps + b / fps) / 2 in float64."""
    seconds = [int(i) / fps for i in indices]
    if not seconds:
        return []
    seconds += [seconds[-1]] * (-len(seconds) % temporal_patch_size)
    last = temporal_patch_size - 1
    return [(seconds[i] + seconds[i + last]) / 2 for i in range(0, len(seconds), temporal_patch_size)]


def _as_spec(spec: QwenSpec | Mapping[str, Any] | str) -> QwenSpec:
    if isinstance(spec, QwenSpec):
        return spec
    return QwenSpec.from_mapping(spec_mapping(spec, NAMED_SPECS))


def preprocess_video(
    data: Source,
    spec: QwenSpec | Mapping[str, Any] | str,
    model_type: str,
    alloc: Allocator = numpy_allocator,
    *,
    info: VideoInfo | None = None,
) -> VideoFeatures:
    """Probe -> sample -> decode and resize frame by frame -> patchify: SGLang's `preprocess_video` and the HF
    processor's video output for one encoded video (bytes, a memoryview or a path) and SGLang's model type.

    `spec` is a QwenSpec, a bundled name or a mapping (its patch, merge, temporal patch size, mean, std
    and, for Qwen2 and 2.5, pixel budget); the image `resample` mode does not apply (HF's video
    processors are torchvision's only). The feature is allocated with `alloc(shape, dtype)` and
    written in place. `info` is `probe(data)`, if the caller has it. MmError for a video that SGLang
    refuses (fewer than 2 frames, an aspect ratio over 200) or that mmworker.common.video refuses.
    """
    spec = _as_spec(spec)
    kind = model_kind(model_type)
    if info is None:
        info = probe(data)
    indices = sample_indices(info.frames, info.fps)
    n = len(indices)
    h1, w1 = first_resize_target(info.height, info.width, n)
    h2, w2 = second_resize_target(n, h1, w1, spec, model_type)
    patch, merge, tps = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    if h2 % spec.factor or w2 % spec.factor:  # HF's view() would fail; only a spec whose factor is not HF's
        raise MmError(f"qwen_vl video: frames of {w2}x{h2} are not whole merge blocks of {spec.factor}")
    gt, gh, gw = -(-n // tps), h2 // patch, w2 // patch
    per_patch = gh * gw
    feature = alloc((gt * per_patch, spec.feature_dim), spec.feature_storage)
    norm = normalisation(spec.image_mean, spec.image_std, "aten_u8")
    identity = vertical_coefficients(h2, h2, "aten_u8")
    first = np.empty((h1, w1, 3), np.uint8)  # the first resize's output, one frame
    pending = np.empty((tps, h2, w2, 4), np.uint8)  # the current temporal patch's frames, final size
    second = (h2, w2) != (h1, w1)

    def take(position: int, rgb: np.ndarray) -> None:
        frame = rgb if rgb.flags.c_contiguous else np.ascontiguousarray(rgb)
        resize_frames(frame[None], h1, w1, out=first[None])
        del frame
        slot = pending[position % tps]
        if second:
            resized = resize_image(RgbImage(pixels=first), w2, h2, "aten_u8").pixels
            if resized.shape[2] == 4:
                np.copyto(slot, resized)
            else:
                unpack_rgb(np.ascontiguousarray(resized).reshape(-1), slot.reshape(-1))
        else:
            unpack_rgb(first.reshape(-1), slot.reshape(-1))
        if position % tps == tps - 1:
            k = position // tps
            patchify_frames_into(pending, identity, norm, patch, merge, feature[k * per_patch : (k + 1) * per_patch])

    decode_each(data, indices, take, info)
    if n % tps:  # HF pads the last temporal patch with copies of the last frame
        last = (n - 1) % tps
        pending[last + 1 :] = pending[last]
        patchify_frames_into(pending, identity, norm, patch, merge, feature[(gt - 1) * per_patch :])
    stamps = texts = seconds = None
    if kind == "qwen3":
        stamps = tuple(timestamps(indices, info.fps, tps))
        texts = tuple(timestamp_text(t) for t in stamps)
    elif kind == "qwen2_5":
        seconds = np.float32(tps / HF_DEFAULT_FPS)
    return VideoFeatures(
        pixel_values_videos=feature,
        video_grid_thw=np.array([gt, gh, gw], np.int64),
        second_per_grid_ts=seconds,
        timestamps=stamps,
        timestamp_texts=texts,
        indices=indices,
        fps=info.fps,
        total_frames=info.frames,
        source_size=(info.height, info.width),
        first_size=(h1, w1),
        size=(h2, w2),
    )
