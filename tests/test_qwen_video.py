"""mmworker.qwen_vl.video: SGLang's sampling and first resize, the HF video processor's sizes, and the pipeline.

Sampling and sizing are checked against values worked out by hand from SGLang's and transformers'
formulas (docs/behaviour.md §14); the pipeline on clips of the generated corpus (tests/videos.py;
skipped without the ffmpeg command line) for shapes, grids, determinism and every byte against a
plain numpy transcription of HF's normalise-and-patchify applied to mmworker's decoded and resized
frames; the generalised patchify kernel against the image path's. Byte parity with SGLang and
transformers themselves is tests/sglang_env/test_qwen_video_parity.py's.
"""

import subprocess
import tracemalloc

import numpy as np
import pytest
import videos

pytest.importorskip("av", reason="PyAV is not installed (pip install 'mmworker[video]'; scripts/setup.sh does)")

import mmworker.common.video as decoding
from mmworker.common.float_bilinear import resize_frames
from mmworker.common.resize import resize_rgb, vertical_coefficients
from mmworker.errors import MmError
from mmworker.qwen_vl import as_spec
from mmworker.qwen_vl import video as qv
from mmworker.qwen_vl.patchify import normalisation, patchify_frames_into, patchify_into

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")


@pytest.fixture(scope="module")
def corpus() -> dict[str, videos.Clip]:
    videos.require_ffmpeg()
    return videos.corpus()


# --- Sampling (SGLang's smart_nframes + linspace) -----------------------------------------------


def test_constants_are_sglangs():
    assert (qv.SGLANG_FACTOR, qv.FRAME_FACTOR, qv.FPS, qv.FPS_MIN_FRAMES, qv.FPS_MAX_FRAMES) == (28, 2, 2.0, 4, 768)
    assert (qv.VIDEO_MIN_PIXELS, qv.VIDEO_MAX_PIXELS) == (100352, 602112)
    assert qv.VIDEO_TOTAL_PIXELS == 90316800  # int(128000 * 28 * 28 * 0.9), VIDEO_MAX_PIXELS unset


def test_total_pixels_from_the_environment(monkeypatch):
    # SGLang reads VIDEO_MAX_PIXELS at import as int(float(value)); so does the module constant.
    monkeypatch.setenv("VIDEO_MAX_PIXELS", "2.5e6")
    assert qv._total_pixels_from_env() == 2500000
    monkeypatch.setenv("VIDEO_MAX_PIXELS", "lots")
    with pytest.raises(MmError, match="VIDEO_MAX_PIXELS must be a number, got 'lots'"):
        qv._total_pixels_from_env()
    # The budget it sets: 40 frames sharing 2,500,000 pixels may have 125,000 each (2 frames' worth of the
    # share), beta = sqrt(2073600 / 125000) = 4.07: 265.2 -> 252, 471.4 -> 448.
    assert qv.first_resize_target(1080, 1920, 40, total_pixels=2500000) == (252, 448)


def test_sampling_two_frames_a_second():
    # 50 frames at 25 fps: 2 s -> 4 frames, spread from the first to the last (linspace, truncated).
    assert qv.sample_indices(50, 25.0).tolist() == [0, 16, 32, 49]
    # 90 frames at 29.97 fps: 6.006 -> 6.
    assert qv.sample_indices(90, 30000 / 1001).tolist() == [0, 17, 35, 53, 71, 89]
    # 1000 frames at 100 fps: 10 s -> 20.
    indices = qv.sample_indices(1000, 100.0)
    assert len(indices) == 20 and indices[0] == 0 and indices[-1] == 999 and indices.dtype == np.int64
    assert np.all(np.diff(indices) > 0)


def test_sampling_short_clips():
    # At least 4 frames, but never more than the clip's frames floored to even: 2 -> 2, 3 -> 2.
    assert qv.sample_indices(2, 25.0).tolist() == [0, 1]
    assert qv.sample_indices(3, 25.0).tolist() == [0, 2]
    assert qv.sample_indices(5, 25.0).tolist() == [0, 1, 2, 4]
    with pytest.raises(MmError, match=r"1 frame\(s\) at 25 fps sample to 0: nframes should be in \[2, 1\]"):
        qv.sample_indices(1, 25.0)


def test_sampling_caps_at_768():
    # 10000 frames at 10 fps would be 2000; 2001 frames at 1 fps, 4002: both 768.
    for total, fps in ((10000, 10.0), (2001, 1.0)):
        indices = qv.sample_indices(total, fps)
        assert len(indices) == 768 and indices[-1] == total - 1
    assert qv.sample_nframes(800, 1.0) == 768
    assert qv.sample_nframes(767, 1.0) == 766  # min(768, 767) floored to even


def test_sampling_settings():
    # nframes rounds to even with Python's round (ties to even): 7 -> 8, 5 -> 4.
    assert qv.sample_nframes(50, 25.0, nframes=7) == 8
    assert qv.sample_nframes(50, 25.0, nframes=5) == 4
    assert qv.sample_nframes(100, 25.0, fps=4.0) == 16
    assert qv.sample_nframes(100, 25.0, min_frames=9) == 10  # ceil to even
    assert qv.sample_nframes(1000, 25.0, max_frames=11) == 10  # floor to even
    with pytest.raises(MmError, match="either fps or nframes"):
        qv.sample_nframes(50, 25.0, fps=2.0, nframes=4)
    with pytest.raises(MmError, match=r"should be in \[2, 50\]"):
        qv.sample_nframes(50, 25.0, nframes=60)
    with pytest.raises(MmError, match="frame rate must be positive"):
        qv.sample_nframes(50, 0.0)


# --- Sizes --------------------------------------------------------------------------------------


def test_first_resize_target():
    # 1080p, 60 frames: the cap is VIDEO_MAX_PIXELS (the 60 frames' share is 3,010,560); 1092x1932 is over
    # it, beta = sqrt(2073600 / 602112): 581.97 -> 560, 1034.6 -> 1008 (factor 28, floored).
    assert qv.first_resize_target(1080, 1920, 60) == (560, 1008)
    # 768 frames: the share, 90316800 / 768 * 2 = 235200, is the cap: 363.7 -> 336, 646.6 -> 644.
    assert qv.first_resize_target(1080, 1920, 768) == (336, 644)
    # 360p is rounded (364x644 fits the budget); a tiny clip is lifted to at least 100352 pixels.
    assert qv.first_resize_target(360, 640, 20) == (364, 644)
    assert qv.first_resize_target(32, 48, 20) == (280, 392)
    # SGLang's factor is 28 whatever the model.
    assert all(v % 28 == 0 for v in qv.first_resize_target(720, 1280, 4))
    # Per-video settings, as SGLang reads them: max_pixels lowers the cap, never raises it past the share.
    assert qv.first_resize_target(1080, 1920, 60, max_pixels=200704) == (336, 588)
    assert qv.first_resize_target(1080, 1920, 60, total_pixels=30 * 200704) == (336, 588)
    with pytest.raises(MmError, match="aspect ratio must be smaller than 200"):
        qv.first_resize_target(10, 2500, 4)


def test_second_resize_target():
    qwen2, qwen3 = as_spec("qwen2_vl"), as_spec("qwen3_vl")
    # Qwen2 and 2.5: transformers' 2-D smart_resize with factor 28 and the checkpoint's budget leaves
    # SGLang's frames as they are.
    for size in ((364, 644), (560, 1008), (336, 644), (280, 392)):
        assert qv.second_resize_target(20, *size, qwen2, "qwen2_vl") == size
        assert qv.second_resize_target(20, *size, as_spec("qwen2_5_vl"), "qwen2_5_vl") == size
    # Qwen3 and 3.5: multiples of 32, rounded (364 / 32 = 11.375 -> 352, 644 / 32 = 20.125 -> 640) ...
    assert qv.second_resize_target(20, 364, 644, qwen3, "qwen3_vl") == (352, 640)
    assert qv.second_resize_target(4, 560, 1008, as_spec("qwen3_5"), "qwen3_5") == (576, 1024)
    # ... unless frames x height x width is over 25165824: 768 x 320 x 640 is, beta = sqrt(768 x 336 x 644 /
    # 25165824) = 2.57: 130.7 -> 128, 250.6 -> 224.
    assert qv.second_resize_target(768, 336, 644, qwen3, "qwen3_vl_moe") == (128, 224)
    with pytest.raises(MmError, match="unknown model type 'llava'"):
        qv.second_resize_target(4, 280, 392, qwen2, "llava")
    with pytest.raises(MmError, match="fewer than the temporal patch size"):
        qv.second_resize_target(1, 280, 392, qwen3, "qwen3_vl")


def test_timestamps():
    fps = 30000 / 1001
    stamps = qv.timestamps([0, 17, 35, 53, 71, 89], fps)
    assert stamps == [(0 / fps + 17 / fps) / 2, (35 / fps + 53 / fps) / 2, (71 / fps + 89 / fps) / 2]
    assert [qv.timestamp_text(t) for t in stamps] == ["<0.3 seconds>", "<1.5 seconds>", "<2.7 seconds>"]
    assert qv.timestamps([0, 10, 20], 10.0) == [0.5, 2.0]  # padded with the last index
    assert qv.timestamps([], 10.0) == []


# --- The generalised patchify kernel ------------------------------------------------------------


def hf_patchify(frames: np.ndarray, mean, std, patch: int, merge: int, temporal: int) -> np.ndarray:
    """HF's video patchify in numpy: frames uint8 [n, h, w, 3] -> float32 [gt * gh * gw, 3 * temporal * patch^2],
    with the fused normalisation (v - 255 mean) / (255 std) in float32 and the last frame repeated to pad."""
    m = np.asarray(mean, np.float32) * np.float32(255)
    s = np.asarray(std, np.float32) * np.float32(255)
    x = (frames.transpose(0, 3, 1, 2).astype(np.float32) - m[:, None, None]) / s[:, None, None]
    pad = -len(x) % temporal
    if pad:
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
    gt, h, w = len(x) // temporal, x.shape[2], x.shape[3]
    gh, gw = h // patch, w // patch
    x = x.reshape(gt, temporal, 3, gh // merge, merge, patch, gw // merge, merge, patch)
    return x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(gt * gh * gw, 3 * temporal * patch * patch)


def rgbx(frames: np.ndarray) -> np.ndarray:
    out = np.zeros((*frames.shape[:-1], 4), np.uint8)
    out[..., :3] = frames
    return out


@pytest.mark.parametrize("patch", [14, 16, 3])
def test_two_distinct_frames_per_temporal_patch(patch):
    rng = np.random.default_rng(patch)
    h, w = patch * 2 * 3, patch * 2 * 5
    frames = rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8)
    spec = as_spec("qwen2_vl")
    norm = normalisation(spec.image_mean, spec.image_std, "aten_u8")
    out = np.empty(((h // patch) * (w // patch), 3 * 2 * patch * patch), np.float32)
    patchify_frames_into(rgbx(frames), vertical_coefficients(h, h, "aten_u8"), norm, patch, 2, out)
    expected = hf_patchify(frames, spec.image_mean, spec.image_std, patch, 2, 2)
    assert out.tobytes() == expected.tobytes()


def test_a_still_image_is_two_equal_frames():
    # The image path (one frame repeated over the temporal axis) and the video path given the frame twice
    # write the same bytes, with a vertical resize in the kernel too.
    rng = np.random.default_rng(7)
    pixels = rgbx(rng.integers(0, 256, (100, 56, 3), dtype=np.uint8))
    spec = as_spec("qwen3_vl")
    norm = normalisation(spec.image_mean, spec.image_std, "aten_u8")
    vertical = vertical_coefficients(100, 84, "aten_u8")
    shape = ((84 // 14) * (56 // 14), 3 * 2 * 14 * 14)
    image, video = np.empty(shape, np.float32), np.empty(shape, np.float32)
    patchify_into(pixels, vertical, norm, 14, 2, 2, image)
    patchify_frames_into(np.stack([pixels, pixels]), vertical, norm, 14, 2, video)
    assert image.tobytes() == video.tobytes()


def test_patchify_frames_refuses_bad_input():
    spec = as_spec("qwen2_vl")
    norm = normalisation(spec.image_mean, spec.image_std, "aten_u8")
    out = np.empty((4, 1176), np.float32)
    with pytest.raises(MmError, match=r"\(t, h, w, 4\) uint8 frames"):
        patchify_frames_into(np.zeros((2, 28, 28, 3), np.uint8), vertical_coefficients(28, 28, "aten_u8"), norm,
                             14, 2, out)  # fmt: skip
    with pytest.raises(MmError, match="out must be"):
        patchify_frames_into(np.zeros((2, 28, 28, 4), np.uint8), vertical_coefficients(28, 28, "aten_u8"), norm,
                             14, 2, np.empty((4, 100), np.float32))  # fmt: skip


# --- The pipeline on the corpus -----------------------------------------------------------------


def reference(data: bytes, model_type: str, spec=None) -> tuple[np.ndarray, tuple[int, int, int]]:
    """The pipeline from mmworker's parts, whole and plain: every sampled frame decoded at once, resized by
    resize_frames (then aten_u8 where HF resizes again), then hf_patchify."""
    spec = spec or as_spec(model_type)
    info = decoding.probe(data)
    indices = qv.sample_indices(info.frames, info.fps)
    h1, w1 = qv.first_resize_target(info.height, info.width, len(indices))
    frames = resize_frames(decoding.decode_frames(data, indices, info=info), h1, w1)
    h2, w2 = qv.second_resize_target(len(indices), h1, w1, spec, model_type)
    if (h2, w2) != (h1, w1):
        frames = np.stack([resize_rgb(f, w2, h2, "aten_u8") for f in frames])
    tps, p = spec.temporal_patch_size, spec.patch_size
    values = hf_patchify(frames, spec.image_mean, spec.image_std, p, spec.merge_size, tps)
    return values, (-(-len(indices) // tps), h2 // p, w2 // p)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("name", ["h264_420_bt709_bframes", "h264_2_frames", "vp9_3_frames", "h264_444_rot90",
                                  "vp9_420_odd", "h264_1000_frames"])  # fmt: skip
def test_pipeline_equals_its_parts(corpus, name, model_type):
    data = corpus[name].data()
    features = qv.preprocess_video(data, model_type, model_type)
    expected, grid = reference(data, model_type)
    assert features.video_grid_thw.tolist() == list(grid) and features.video_grid_thw.dtype == np.int64
    assert features.pixel_values_videos.shape == expected.shape and features.pixel_values_videos.dtype == np.float32
    assert features.pixel_values_videos.tobytes() == expected.tobytes()
    info = decoding.probe(data)
    assert (features.total_frames, features.fps) == (info.frames, info.fps)
    assert features.source_size == (info.height, info.width)
    assert features.indices.tolist() == qv.sample_indices(info.frames, info.fps).tolist()
    kind = qv.model_kind(model_type)
    assert (features.second_per_grid_ts is not None) == (kind == "qwen2_5")
    assert (features.timestamps is not None) == (features.timestamp_texts is not None) == (kind == "qwen3")
    if kind == "qwen3":
        assert len(features.timestamps) == grid[0]
        assert list(features.timestamps) == qv.timestamps(features.indices, info.fps)
    else:
        assert features.size == features.first_size


def test_second_per_grid_ts_is_2_over_24(corpus):
    # Whatever the clip's rate: SGLang gives the HF processor no metadata, and HF assumes 24 fps.
    for name in ("h264_420_untagged", "h264_1000_frames"):
        features = qv.preprocess_video(corpus[name].data(), "qwen2_5_vl", "qwen2_5_vl")
        assert features.second_per_grid_ts == np.float32(2 / 24)


def test_deterministic_and_into_the_allocator(corpus):
    data = corpus["h264_420_bt709_bframes"].data()
    calls = []

    def alloc(shape, dtype):
        calls.append((shape, np.dtype(dtype)))
        return np.full(shape, np.nan, dtype)

    first = qv.preprocess_video(data, "qwen3_vl", "qwen3_vl", alloc)
    assert calls == [(first.pixel_values_videos.shape, np.dtype(np.float32))]
    assert not np.isnan(first.pixel_values_videos).any()  # every value written
    again = qv.preprocess_video(data, "qwen3_vl", "qwen3_vl", info=decoding.probe(data))
    assert again.pixel_values_videos.tobytes() == first.pixel_values_videos.tobytes()


def test_odd_frame_counts_repeat_the_last_frame(corpus):
    # SGLang's counts are even; a spec with a temporal patch of 4 takes 6 sampled frames as 2 patches, the
    # second padded with 2 copies of the last frame, as HF pads.
    spec = as_spec({**qv.NAMED_SPECS["qwen2_vl"], "temporal_patch_size": 4})
    data = corpus["h264_420_bt709_bframes"].data()
    features = qv.preprocess_video(data, spec, "qwen2_vl")
    expected, grid = reference(data, "qwen2_vl", spec)
    assert len(features.indices) == 6 and grid[0] == 2
    assert features.pixel_values_videos.tobytes() == expected.tobytes()


def test_bfloat16_is_float32_narrowed(corpus):
    data = corpus["vp9_420_odd"].data()
    f32 = qv.preprocess_video(data, "qwen2_vl", "qwen2_vl").pixel_values_videos
    spec = as_spec({**qv.NAMED_SPECS["qwen2_vl"], "feature_dtype": "bfloat16"})
    bf16 = qv.preprocess_video(data, spec, "qwen2_vl").pixel_values_videos
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # nearest even
    assert bf16.dtype == np.uint16 and np.array_equal(bf16, rounded)


def test_refusals(corpus, tmp_path):
    data = corpus["h264_2_frames"].data()
    with pytest.raises(MmError, match="unknown model type"):
        qv.preprocess_video(data, "qwen2_vl", "qwen2_vl_typo")
    with pytest.raises(MmError):
        qv.preprocess_video(corpus["truncated_moov_lost"].data(), "qwen2_vl", "qwen2_vl")
    # A one-frame video: SGLang samples no frame pair from it.
    path = tmp_path / "one.mp4"
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i", "testsrc2=size=64x48:rate=25",
                    "-frames:v", "1", "-c:v", "libx264", "-pix_fmt", "yuv420p", str(path)], check=True, timeout=60)  # fmt: skip
    assert decoding.probe(path).frames == 1
    with pytest.raises(MmError, match=r"1 frame\(s\) at 25 fps sample to 0: .* a video needs at least 2 frames"):
        qv.preprocess_video(path, "qwen3_vl", "qwen3_vl")


def test_decode_each_streams_what_decode_frames_returns(corpus):
    for name in ("h264_444_rot90", "vp9_420_odd", "h264_420_bt709_bframes"):
        data = corpus[name].data()
        info = decoding.probe(data)
        indices = qv.sample_indices(info.frames, info.fps)
        seen = []
        decoding.decode_each(data, indices, lambda position, rgb, seen=seen: seen.append((position, rgb.copy())), info)
        assert [p for p, _ in seen] == list(range(len(indices)))
        assert np.array_equal(np.stack([f for _, f in seen]), decoding.decode_frames(data, indices, info=info))


def test_no_whole_clip_at_source_size(corpus):
    # 20 of 300 frames of 640x360 are sampled (13.8 MB of RGB at the source size); what the pipeline holds
    # besides its feature stays a few frames' worth (numpy's allocations, traced).
    data = corpus["h264_360p_300_frames"].data()
    info = decoding.probe(data)
    qv.preprocess_video(data, "qwen3_vl", "qwen3_vl", info=info)  # compiled and warm
    kept = []
    tracemalloc.start()
    try:
        features = qv.preprocess_video(data, "qwen3_vl", "qwen3_vl", lambda s, d: kept.append(np.empty(s, d)) or kept[-1],
                                       info=info)  # fmt: skip
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    frame = info.height * info.width * 3
    assert len(features.indices) == 20
    assert peak - features.pixel_values_videos.nbytes < 5 * frame, (peak, features.pixel_values_videos.nbytes, frame)
