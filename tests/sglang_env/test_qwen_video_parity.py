"""mmworker.qwen_vl.video against SGLang 0.5.23's own Qwen video path and transformers 5.19: every byte equal.

For each clip of the corpus (tests/videos.py: sizes from 48x32 to 640x360, 24 to 100 fps, 2 and 3
frames, 1000 frames, rotation, odd sizes, 10-bit, ...) and a generated 1280x720 clip (the first
resize then shrinks, as it does for real videos): SGLang's `preprocess_video` on its
`VideoDecoderWrapper` (torchcodec 0.17 on the CPU, its parallel decoders), then the HF processor
SGLang holds for each model type, called as SGLang's `process_mm_data` calls it (Qwen3 and 3.5 with
SGLang's video metadata and do_sample_frames=False), against `preprocess_video(data, spec, model_type)`:
the sampled indices and rate, the first resize's size, pixel_values_videos byte for byte,
video_grid_thw, Qwen2.5's second_per_grid_ts, and the expanded prompt ids (Qwen3's timestamp text
included) rebuilt from mmworker's grid and timestamps.

The HF processors are built as the released checkpoints configure them (mmworker.qwen_vl.video's
constants): Qwen2-VL and 2.5-VL's video processor from the image processor's config (3136..12845056
pixels, CLIP mean/std), Qwen3-VL and 3.5's from their video_preprocessor_config.json (4096..25165824
pixels over all frames, mean = std = 0.5).

    bash scripts/setup_sglang.sh && bash scripts/setup_video_ref.sh
    .venv-sglang/bin/pytest tests/sglang_env/test_qwen_video_parity.py

Skipped where torchcodec or PyAV is not installed in SGLang's environment (scripts/setup_video_ref.sh
installs both) or where the ffmpeg command line that makes the corpus is missing.
"""

import asyncio
import functools
import subprocess

import numpy as np
import pytest
import videos

SETUP = "bash scripts/setup_video_ref.sh installs it into .venv-sglang"
pytest.importorskip("torchcodec.decoders", reason=f"torchcodec is not installed ({SETUP})")
pytest.importorskip("av", reason=f"PyAV is not installed ({SETUP})")

import torch  # noqa: E402
from plugin_env import CLIP_MEAN, CLIP_STD, TOKENIZER  # noqa: E402
from sglang.srt.multimodal.processors import qwen_vl as sglang_qwen_vl  # noqa: E402
from sglang.srt.utils import video_decoder  # noqa: E402
from sglang.srt.utils.video_decoder import VideoDecoderWrapper  # noqa: E402
from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor  # noqa: E402
from transformers.models.qwen2_vl import Qwen2VLImageProcessor  # noqa: E402
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor  # noqa: E402
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor  # noqa: E402

from mmworker.common.video import probe  # noqa: E402
from mmworker.qwen_vl import video as qwen_video  # noqa: E402
from mmworker.qwen_vl.spec import NAMED_SPECS  # noqa: E402

# docs/behaviour.md §13.6, where the decoders legitimately differ: the average rate of a variable-rate
# MP4 with B-frames depends on the FFmpeg that demuxes it (so the sampling does); torchcodec 0.17 returns
# no frame of an MPEG-TS clip whose timestamps start after 0 (SGLang fails on it, mmworker decodes it).
EXCLUDED = {
    "h264_vfr_bframes": "its average rate depends on the FFmpeg behind the decoder (§13.6)",
    "h264_bframes_ts": "torchcodec 0.17 decodes no frame of it (§13.6)",
}
CLIPS = [name for name in videos.names() if name not in EXCLUDED]
GENERATED = "generated_720p"
MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")
PROMPT = "hello <|vision_start|><|video_pad|><|vision_end|> describe this"
VIDEO_BLOCK = "<|vision_start|><|video_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def corpus() -> dict[str, videos.Clip]:
    videos.require_ffmpeg()
    return videos.corpus()


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> bytes:
    """2 s of 1280x720 at 30 fps, BT.709 H.264 with B-frames: 4 frames sampled, shrunk to 560x1008."""
    videos.require_ffmpeg()
    path = tmp_path_factory.mktemp("video") / "720p.mp4"
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i", "testsrc2=size=1280x720:rate=30:duration=2",
                    "-c:v", "libx264", "-preset", "veryfast", "-threads", "1", "-bf", "3", "-pix_fmt", "yuv420p",
                    "-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709", "-an", str(path)],
                   check=True, timeout=120)  # fmt: skip
    return path.read_bytes()


@pytest.fixture(scope="module")
def sampled_768(tmp_path_factory) -> bytes:
    """800 frames of 48x32 at 1 fps: 768 frames sampled (SGLang's cap), so many that Qwen3's 3-D budget binds."""
    videos.require_ffmpeg()
    path = tmp_path_factory.mktemp("video") / "768.mp4"
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i", "testsrc2=size=48x32:rate=1:duration=800",
                    "-c:v", "libx264", "-preset", "veryfast", "-threads", "1", "-pix_fmt", "yuv420p", "-an", str(path)],
                   check=True, timeout=120)  # fmt: skip
    return path.read_bytes()


def hf_processor(model_type: str):
    """The processor SGLang holds for this model type, configured as the released checkpoint."""
    spec = NAMED_SPECS[model_type]
    patch = spec["patch_size"]
    image = Qwen2VLImageProcessor(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                  size={"shortest_edge": spec["min_pixels"], "longest_edge": spec["max_pixels"]},
                                  image_mean=spec["image_mean"], image_std=spec["image_std"])  # fmt: skip
    if qwen_video.model_kind(model_type) == "qwen3":
        video = Qwen3VLVideoProcessor(
            patch_size=patch, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
            size={"shortest_edge": qwen_video.QWEN3_VIDEO_MIN_PIXELS, "longest_edge": qwen_video.QWEN3_VIDEO_MAX_PIXELS},
        )  # fmt: skip
        return Qwen3VLProcessor(image_processor=image, tokenizer=TOKENIZER, video_processor=video)
    video = Qwen2VLVideoProcessor(patch_size=patch, merge_size=2, temporal_patch_size=2, min_pixels=spec["min_pixels"],
                                  max_pixels=spec["max_pixels"], image_mean=CLIP_MEAN, image_std=CLIP_STD)  # fmt: skip
    cls = Qwen2_5_VLProcessor if model_type == "qwen2_5_vl" else Qwen2VLProcessor
    return cls(image_processor=image, tokenizer=TOKENIZER, video_processor=video)


@functools.cache
def sglang_frames(name: str, data: bytes) -> tuple[torch.Tensor, dict]:
    """SGLang's preprocess_video on its decoder wrapper, as on a CPU host (no pinned memory). The same for
    every model type: its first resize has factor 28 for all of them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(video_decoder, "_is_cpu_engine", lambda: True)
        patch.setattr(sglang_qwen_vl, "is_cpu", lambda: True)
        return asyncio.run(sglang_qwen_vl.preprocess_video(VideoDecoderWrapper(data), video_config={}))


def hf_output(model_type: str, frames: torch.Tensor, metadata: dict):
    # base_processor.process_mm_data: videos=[...], text=[prompt], padding, return_tensors="pt"; no
    # videos_kwargs (SGLang's video config is empty); Qwen3 and 3.5 also get the metadata and
    # do_sample_frames=False (qwen_vl.py _process_mm_data_uncached).
    kwargs = {}
    if qwen_video.model_kind(model_type) == "qwen3":
        kwargs = {"video_metadata": [metadata], "do_sample_frames": False}
    return hf_processor(model_type)(text=[PROMPT], videos=[frames], padding=True, return_tensors="pt", **kwargs)


def expected_prompt(model_type: str, ours: qwen_video.VideoFeatures) -> list[int]:
    """The prompt ids HF should give, rebuilt from mmworker's grid and timestamps."""
    gt, gh, gw = ours.video_grid_thw.tolist()
    per_frame = gh * gw // 4
    if ours.timestamp_texts is None:
        text = PROMPT.replace("<|video_pad|>", "<|video_pad|>" * (gt * per_frame))
    else:
        assert len(ours.timestamp_texts) == gt
        blocks = "".join(f"{stamp}<|vision_start|>{'<|video_pad|>' * per_frame}<|vision_end|>"
                         for stamp in ours.timestamp_texts)  # fmt: skip
        text = PROMPT.replace("<|video_pad|>", blocks)  # nested in the prompt's own vision block, as HF does
    return TOKENIZER(text)["input_ids"]


def check(name: str, data: bytes, model_type: str) -> None:
    frames, metadata = sglang_frames(name, data)
    reference = hf_output(model_type, frames, metadata)
    ours = qwen_video.preprocess_video(data, model_type, model_type)
    assert np.array_equal(ours.indices, metadata["frames_indices"])
    assert ours.fps == metadata["fps"] and ours.total_frames == metadata["total_num_frames"]
    assert ours.first_size == tuple(frames.shape[2:])
    expected = reference["pixel_values_videos"].numpy()
    assert ours.pixel_values_videos.dtype == np.float32 and ours.pixel_values_videos.shape == expected.shape
    differ = ours.pixel_values_videos.view(np.uint32) != expected.view(np.uint32)
    assert not differ.any(), f"{int(differ.sum())} of {differ.size} values differ"
    assert reference["video_grid_thw"].tolist() == [ours.video_grid_thw.tolist()]
    if model_type == "qwen2_5_vl":
        # A float32 tensor in SGLang's hands (BatchFeature's return_tensors="pt"): 2/24 rounded.
        second = reference["second_per_grid_ts"]
        assert second.dtype == torch.float32 and second.numpy().tolist() == [ours.second_per_grid_ts]
        assert ours.second_per_grid_ts == np.float32(2 / 24)
    else:
        assert "second_per_grid_ts" not in reference and ours.second_per_grid_ts is None
    assert reference["input_ids"][0].tolist() == expected_prompt(model_type, ours)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("name", CLIPS)
def test_equal_to_sglang_and_hf(corpus, name, model_type):
    check(name, corpus[name].data(), model_type)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_equal_on_a_720p_clip(generated, model_type):
    frames, _ = sglang_frames(GENERATED, generated)
    assert tuple(frames.shape) == (4, 3, 560, 1008)  # the first resize shrinks it
    check(GENERATED, generated, model_type)


def test_equal_with_768_frames_and_qwen3s_budget_binding(sampled_768):
    # Qwen3 only: the 768 frames' features for Qwen2 (1 GB of float32) would add nothing the other clips
    # do not check, and the 3-D budget is Qwen3's.
    frames, _ = sglang_frames("generated_768", sampled_768)
    assert tuple(frames.shape) == (768, 3, 280, 392)
    check("generated_768", sampled_768, "qwen3_vl")
    assert qwen_video.preprocess_video(sampled_768, "qwen3_vl", "qwen3_vl").size == (128, 192)


def test_exclusions_are_real(corpus):
    """The excluded clips still differ as documented (else they belong in the comparison)."""
    import torchcodec

    tc_ffmpeg = int(torchcodec._core.get_ffmpeg_library_versions()["ffmpeg_version"].split(".")[0])
    av_ffmpeg = int(__import__("av").ffmpeg_version_info.split(".")[0])
    data = corpus["h264_vfr_bframes"].data()
    if tc_ffmpeg != av_ffmpeg:
        assert VideoDecoderWrapper(data).avg_fps != probe(data).fps
    with pytest.raises(RuntimeError):
        sglang_frames("h264_bframes_ts", corpus["h264_bframes_ts"].data())
