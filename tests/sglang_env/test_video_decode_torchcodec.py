"""mmworker.common.video against torchcodec 0.17, the decoder SGLang uses: counts, rates, sizes, every byte of the frames.

On every clip of the corpus (tests/videos.py): torchcodec's `VideoDecoder(source, dimension_order="NHWC")`
metadata (num_frames, average_fps, width, height, rotation, colour tags) against `probe`, and its
`get_frames_at(indices)` against `decode_frames` for all the frames, for SGLang's own sampling (its
VideoDecoderWrapper and smart_nframes, with its parallel decoders) and for random sparse indices, which
make torchcodec seek; a clip one of them refuses, the other must refuse too. The documented exceptions
(docs/behaviour.md §13.6) are asserted as such, so that a change in either shows.

    bash scripts/setup_sglang.sh && bash scripts/setup_video_ref.sh
    .venv-sglang/bin/pytest tests/sglang_env/test_video_decode_torchcodec.py

Skipped where torchcodec or PyAV is not installed in SGLang's environment (scripts/setup_video_ref.sh
installs both) or where the ffmpeg command line that makes the corpus is missing.
"""

import numpy as np
import pytest
import videos

SETUP = "bash scripts/setup_video_ref.sh installs it into .venv-sglang"
torchcodec_decoders = pytest.importorskip("torchcodec.decoders", reason=f"torchcodec is not installed ({SETUP})")
pytest.importorskip("av", reason=f"PyAV is not installed ({SETUP})")

import torchcodec  # noqa: E402
from sglang.srt.multimodal.processors.qwen_vl import smart_nframes  # noqa: E402
from sglang.srt.utils import video_decoder  # noqa: E402
from sglang.srt.utils.video_decoder import VideoDecoderWrapper  # noqa: E402

import mmworker.common.video as video  # noqa: E402
from mmworker.errors import MmError  # noqa: E402

VideoDecoder = torchcodec_decoders.VideoDecoder
TORCHCODEC_FFMPEG = int(torchcodec._core.get_ffmpeg_library_versions()["ffmpeg_version"].split(".")[0])
PYAV_FFMPEG = int(__import__("av").ffmpeg_version_info.split(".")[0])

# docs/behaviour.md §13.6: the average rate of a variable-rate MP4 with B-frames depends on the FFmpeg
# that demuxes it (5.1's mov demuxer gives those packets no duration, 8.0's does).
RATE_DEPENDS_ON_FFMPEG = {"h264_vfr_bframes"}
# torchcodec 0.17 returns no frame of an MPEG-TS clip whose timestamps start after 0 (its rewind after the
# scan seeks to timestamp 0, before the first packet); mmworker decodes it.
TORCHCODEC_FAILS = {"h264_bframes_ts"}


@pytest.fixture(scope="module")
def corpus() -> dict[str, videos.Clip]:
    videos.require_ffmpeg()
    return videos.corpus()


def torchcodec_frames(data: bytes, indices) -> np.ndarray:
    return VideoDecoder(data, dimension_order="NHWC").get_frames_at([int(i) for i in indices]).data.numpy()


def quarter_turns(degrees: float | None) -> int:
    return 0 if degrees is None else round(degrees / 90) % 4


@pytest.mark.parametrize("name", [n for n in videos.names() if n not in TORCHCODEC_FAILS])
def test_metadata_and_every_frame_equal_torchcodecs(corpus, name):
    data = corpus[name].data()
    reference = VideoDecoder(data, dimension_order="NHWC")
    meta = reference.metadata
    info = video.probe(data)
    assert info.frames == meta.num_frames
    if name in RATE_DEPENDS_ON_FFMPEG and TORCHCODEC_FFMPEG != PYAV_FFMPEG:
        assert info.fps != meta.average_fps  # still the documented difference
    else:
        assert info.fps == meta.average_fps  # exactly: the same float arithmetic
    assert (info.width, info.height) == (meta.width, meta.height)
    assert info.rotation // 90 == quarter_turns(meta.rotation)
    assert (info.codec, info.pixel_format) == (meta.codec, meta.pixel_format)
    assert (info.color_space, info.color_primaries, info.color_transfer) == (
        meta.color_space, meta.color_primaries, meta.color_transfer_characteristic)  # fmt: skip
    everything = np.arange(info.frames)
    expected = reference.get_frames_at(everything.tolist()).data.numpy()
    ours = video.decode_frames(data, everything, info=info)
    differ = int((ours != expected).any(axis=(1, 2, 3)).sum())
    assert differ == 0, f"{differ} of {info.frames} frames differ, by up to {np.abs(ours - expected.astype(int)).max()}"


@pytest.mark.parametrize("name", [n for n in videos.names() if n not in TORCHCODEC_FAILS])
def test_sglangs_sampling_and_sparse_indices(corpus, name, monkeypatch):
    # SGLang's own path: its wrapper (torchcodec, up to 16 decoders in threads), its frame count and rate,
    # its smart_nframes and linspace; then random sparse sets, where torchcodec seeks between frames. As on a
    # CPU engine, the frames are not pinned (pinning needs a CUDA driver).
    monkeypatch.setattr(video_decoder, "_is_cpu_engine", lambda: True)
    clip = corpus[name]
    data = clip.data()
    wrapper = VideoDecoderWrapper(data)
    total, fps = len(wrapper), wrapper.avg_fps
    info = video.probe(data)
    assert total == info.frames
    if name not in RATE_DEPENDS_ON_FFMPEG:
        assert fps == info.fps
    indices = np.unique(
        np.linspace(0, total - 1, num=smart_nframes({}, total_frames=total, video_fps=fps), dtype=np.int64)
    )
    sglang = wrapper.get_frames_as_tensor(indices.tolist()).numpy()
    assert np.array_equal(video.decode_frames(data, indices, info=info), sglang)
    rng = np.random.default_rng(len(name))
    for _ in range(3):
        sparse = np.unique(rng.integers(0, total, int(rng.integers(1, min(total, 12) + 1))))
        assert np.array_equal(video.decode_frames(data, sparse, info=info), torchcodec_frames(data, sparse)), sparse


@pytest.mark.parametrize("name", videos.names(decodable=False))
def test_refused_alike(corpus, name):
    data = corpus[name].data()
    try:
        reference = VideoDecoder(data, dimension_order="NHWC")
        total = reference.metadata.num_frames
    except Exception:  # torchcodec raises RuntimeError or ValueError, as its C++ checks map
        with pytest.raises(MmError):
            video.probe(data)
        return
    # torchcodec opens it: the same count, and the same frames up to where both refuse.
    info = video.probe(data)
    assert info.frames == total
    last = [0, total - 1]
    with pytest.raises((RuntimeError, IndexError)):
        reference.get_frames_at(last)
    with pytest.raises(MmError):
        video.decode_frames(data, last, info=info)
    good = [i for i in range(total - 1) if _decodes(data, [0, i])]
    assert good, "torchcodec decodes none of it: nothing to compare"
    assert np.array_equal(video.decode_frames(data, good[-1:], info=info), torchcodec_frames(data, good[-1:]))


def _decodes(data: bytes, indices: list[int]) -> bool:
    try:
        torchcodec_frames(data, indices)
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(TORCHCODEC_FAILS))
def test_torchcodec_fails_where_documented(corpus, name):
    data = corpus[name].data()
    with pytest.raises(RuntimeError, match="no more frames"):
        torchcodec_frames(data, [0])
    info = video.probe(data)
    assert video.decode_frames(data, [0, info.frames - 1], info=info).shape[0] == 2
