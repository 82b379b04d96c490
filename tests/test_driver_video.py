"""The driver with videos: a request's videos go through the family's video path and the prompt's layout.

What each brick computes is tested against SGLang and transformers elsewhere (tests/test_qwen_video.py,
tests/test_qwen_video_layout.py and their sglang_env parity suites); here the driver must put them
together exactly: `process(family, MmInput(ids, images, videos))` equals `preprocess_video` plus
`video_prompt` on the same inputs (features, grids, ids, runs, offsets, positions), items come
images first, errors name "video k", sources are resolved as images are (paths, data: URLs), and a
spec that cannot serve videos says why before anything is fetched.
"""

import base64
import io

import numpy as np
import pytest
from PIL import Image
from videos import corpus, require_ffmpeg

from mmworker import MmError
from mmworker.common.hashing import content_hash
from mmworker.driver import MmInput, process
from mmworker.pipeline import IMAGE, VIDEO, MRope, VideoGrid
from mmworker.qwen_vl import NAMED_SPECS, QwenVL
from mmworker.qwen_vl.spec import QwenSpec
from mmworker.qwen_vl.video import preprocess_video
from mmworker.qwen_vl.video_layout import TIMESTAMP_PIECES, VideoItem, VideoPromptRules, video_prompt

pytest.importorskip("av", reason="the `video` extra (PyAV) is not installed: pip install -e '.[video]'")

S, P, E, V = 151652, 151655, 151653, 151656  # vision start, image pad, vision end, video pad
# A self-consistent timestamp table (ids no real tokenizer has: the driver only composes them).
TABLE = {piece: [1000 + k] if len(piece) == 1 else [2000, 2001] for k, piece in enumerate(TIMESTAMP_PIECES)}
MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def _family(model_type: str) -> QwenVL:
    spec = dict(NAMED_SPECS[model_type])
    if model_type == "qwen3_vl":
        spec["timestamp_table"] = TABLE
    return QwenVL.from_spec(spec)


def _jpeg(width: int, height: int) -> bytes:
    rng = np.random.default_rng(width * height)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def clips():
    require_ffmpeg()
    return corpus()


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_mixed_request_equals_the_bricks(clips, model_type):
    """An image, two videos and text between: every output equals the bricks' on the same inputs."""
    family = _family(model_type)
    spec = family.spec
    image = _jpeg(200, 120)
    first = clips["h264_420_bt709_bframes"].path.read_bytes()
    second = clips["vp9_420_odd"].path
    ids = [7, S, V, E, 8, S, P, E, 9, S, V, E, 10]
    out = process(family, MmInput(ids, [image], [first, str(second)]))

    videos = [preprocess_video(first, spec, model_type), preprocess_video(second.read_bytes(), spec, model_type)]
    image_item = out.items[0]
    grids = [(image_item.geometry.t, image_item.geometry.h, image_item.geometry.w)]
    items = [VideoItem(tuple(int(v) for v in f.video_grid_thw), f.second_per_grid_ts, f.timestamps) for f in videos]
    expected = video_prompt(ids, grids, items, VideoPromptRules.from_spec(spec))

    assert [item.modality for item in out.items] == [IMAGE, VIDEO, VIDEO]
    np.testing.assert_array_equal(out.input_ids, expected.input_ids)
    assert out.runs == ((expected.image_offsets[0],), *expected.video_offsets)
    assert out.offsets == tuple((runs[0][0], runs[-1][1]) for runs in out.runs)
    assert isinstance(out.positions, MRope)
    np.testing.assert_array_equal(out.positions.positions, expected.positions)
    assert out.positions.delta == expected.delta
    for item, features, data in zip(out.items[1:], videos, [first, second.read_bytes()], strict=True):
        assert item.feature.tobytes() == features.pixel_values_videos.tobytes()
        np.testing.assert_array_equal(item.aux["video_grid_thw"], features.video_grid_thw)
        assert isinstance(item.geometry, VideoGrid)
        assert (item.geometry.t, item.geometry.h, item.geometry.w) == tuple(features.video_grid_thw)
        assert item.geometry.timestamps == features.timestamps
        assert item.hash == content_hash(data)
        data_for_sglang = family.model_data(item.aux)
        assert data_for_sglang["video_grid_thw"].shape == (1, 3)
        if model_type == "qwen2_5_vl":
            assert data_for_sglang["second_per_grid_ts"].tolist() == [np.float32(2 / 24)]
        else:
            assert "second_per_grid_ts" not in data_for_sglang
    if model_type == "qwen3_vl":  # one run per temporal patch, the timestamp text between them
        assert len(out.runs[1]) == int(videos[0].video_grid_thw[0]) > 1


def test_video_only_from_a_data_url(clips):
    data = clips["h264_2_frames"].path.read_bytes()
    url = "data:video/mp4;base64," + base64.b64encode(data).decode()
    family = _family("qwen2_vl")
    out = process(family, MmInput([S, V, E], [], [url]))
    direct = process(family, MmInput([S, V, E], [], [data]))
    assert out.items[0].feature.tobytes() == direct.items[0].feature.tobytes()
    assert out.items[0].hash == content_hash(data)
    assert out.runs == direct.runs and len(out.runs) == 1


def test_errors_name_the_video(clips):
    family = _family("qwen2_vl")
    image = _jpeg(64, 64)
    truncated = clips["truncated_moov_lost"].path.read_bytes()
    with pytest.raises(MmError, match=r"^video 0: "):
        process(family, MmInput([S, P, E, S, V, E], [image], [truncated]))
    with pytest.raises(MmError, match=r"^video 1: "):
        good = clips["h264_2_frames"].path.read_bytes()
        process(family, MmInput([S, V, E, S, V, E], [], [good, b"not a video at all"]))
    with pytest.raises(MmError, match=r"^video 0: media fetch: /nonexistent/clip.mp4: No such file"):
        process(family, MmInput([S, V, E], [], ["/nonexistent/clip.mp4"]))
    # The prompt must hold one video placeholder per video.
    with pytest.raises(MmError, match=r"prompt has 0 video placeholder\(s\) but 1 video\(s\)"):
        process(family, MmInput([S, P, E], [image], [clips["h264_2_frames"].path.read_bytes()]))


def test_a_spec_without_video_support_says_why_before_fetching():
    family = QwenVL.from_spec(NAMED_SPECS["qwen3_vl"])  # no timestamp table bundled
    assert not family.capabilities().video
    with pytest.raises(
        MmError, match=r"^video 0: qwen_vl: .*serves no videos \(qwen3_vl needs the spec's `timestamp_table`"
    ):
        # the source is never read: a path that does not exist gives the capability's message, not a fetch error
        process(family, MmInput([S, V, E], [], ["/nonexistent/clip.mp4"]))
    no_model = {k: v for k, v in NAMED_SPECS["qwen2_vl"].items() if k != "model_type"}
    with pytest.raises(MmError, match=r"names no `model_type`"):
        process(QwenVL.from_spec(no_model), MmInput([S, V, E], [], [b"x"]))


def test_video_spec_keys_are_checked_when_the_spec_is_read():
    with pytest.raises(MmError, match=r"unknown model type 'qwen9_vl'"):
        QwenVL.from_spec({**NAMED_SPECS["qwen2_vl"], "model_type": "qwen9_vl"})
    with pytest.raises(MmError, match=r"timestamp token table: missing"):
        QwenVL.from_spec({**NAMED_SPECS["qwen3_vl"], "timestamp_table": {"<": [1]}})
    with pytest.raises(MmError, match=r"needs a positive `tokens_per_second`"):
        QwenVL.from_spec({**NAMED_SPECS["qwen2_5_vl"], "tokens_per_second": -1})
    spec = QwenSpec.from_mapping({**NAMED_SPECS["qwen3_vl"], "timestamp_table": TABLE})
    # to_mapping round-trips the video keys (a pool hands workers the mapping)
    assert QwenSpec.from_mapping(spec.to_mapping()).to_mapping() == spec.to_mapping()
    assert spec.to_mapping()["timestamp_table"] == TABLE
