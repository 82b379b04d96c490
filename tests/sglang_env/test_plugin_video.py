"""The plug-in serves Qwen-VL video requests itself, byte for byte what SGLang's own processor gives.

For qwen2_vl, qwen2_5_vl, qwen3_vl and qwen3_5, SGLang's built-in `QwenVLImageProcessor` (its video
path as on a CPU host: torchcodec 0.17 decoding, its sampling and first resize, then the HF processor
AutoProcessor would build for the checkpoint) and the class SGLang picks after importing
mmworker.sglang process the same video and mixed image + video requests: every feature byte-equal,
ids, items and their offsets (SGLang's grouping: one item per video, or one for several Qwen2/2.5
videos), grids, Qwen2.5's second_per_grid_ts, M-RoPE positions and delta equal, and the plug-in's
counters prove it served each request itself. Then the plan's and the router's refusals, each with
its reason, and the requests they hand to SGLang coming back as SGLang's own.

    bash scripts/setup_sglang.sh && bash scripts/setup_video_ref.sh
    .venv-sglang/bin/pytest tests/sglang_env/test_plugin_video.py

Skipped where torchcodec or PyAV is not installed in SGLang's environment (scripts/setup_video_ref.sh
installs both) or where the ffmpeg command line that makes the corpus is missing.
"""

import base64
import dataclasses
import json
import os
import subprocess
import sys
import urllib.parse

import numpy as np
import pytest
import videos

SETUP = "bash scripts/setup_video_ref.sh installs it into .venv-sglang"
pytest.importorskip("torchcodec.decoders", reason=f"torchcodec is not installed ({SETUP})")
pytest.importorskip("av", reason=f"PyAV is not installed ({SETUP})")

import torch  # noqa: E402
from httpserver import MediaServer  # noqa: E402
from plugin_env import (  # noqa: E402
    TOKENIZER,
    Request,
    builtin_class,
    encoded,
    hf_config,
    plugin_class,
    run,
    server_args,
    video_hf_processor,
)
from sglang.srt.managers.schedule_batch import Modality  # noqa: E402
from sglang.srt.multimodal.processors import qwen_vl as sglang_qwen_vl  # noqa: E402
from sglang.srt.utils import VideoData, video_decoder  # noqa: E402
from tokenizers import ByteLevelBPETokenizer  # noqa: E402

from mmworker.errors import MmError  # noqa: E402
from mmworker.sglang import plan as planning  # noqa: E402
from mmworker.sglang.qwen_vl import UNREPRODUCED, ImageRejected, MediaRejected, MmworkerQwenVLProcessor  # noqa: E402
from mmworker.sglang.requests import Delegated, Served, route  # noqa: E402

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")
V = "<|vision_start|><|video_pad|><|vision_end|>"
I = "<|vision_start|><|image_pad|><|vision_end|>"  # noqa: E741
CLIPS = ("h264_420_bt709_bframes", "h264_420_untagged", "h264_2_frames", "vp9_3_frames", "hevc_444_bframes",
         "h264_444_rot90", "av1_420_10bit", "truncated_faststart", "unknown_codec")  # fmt: skip
IMAGES = {"png": encoded(64, 48, "PNG", 1), "jpeg": encoded(300, 200, "JPEG", 2, quality=90)}
# The clips that sample 2 frames (one temporal patch); the others sample 4 or more.
ONE_PATCH = {"h264_2_frames", "vp9_3_frames"}
# (prompt with {V} and {I} blocks, images, videos).
REQUESTS = {
    "one-video": ("hello {V} describe this", [], ["h264_420_bt709_bframes"]),
    "image-and-two-videos": ("{I} compare {V} and {V} world", ["png"], ["h264_420_untagged", "hevc_444_bframes"]),
    "two-one-patch-videos": ("one {V} two {V}", [], ["h264_2_frames", "vp9_3_frames"]),
    "video-before-images": ("{V} then {I} and {I}", ["jpeg", "png"], ["av1_420_10bit"]),
    "rotated-and-one-patch": ("{V}{V} this", [], ["h264_444_rot90", "vp9_3_frames"]),
}


@pytest.fixture(scope="module")
def clips() -> dict[str, bytes]:
    videos.require_ffmpeg()
    corpus = videos.corpus()
    return {name: corpus[name].data() for name in CLIPS}


@pytest.fixture(scope="module", autouse=True)
def sglang_on_the_cpu():
    """SGLang's video path as on a CPU host: its decoder and preprocess_video pin no memory (this torch
    has no device to pin for). Its load_video still asks torchcodec for CUDA first and falls back."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(video_decoder, "_is_cpu_engine", lambda: True)
        patch.setattr(sglang_qwen_vl, "is_cpu", lambda: True)
        yield


@pytest.fixture(scope="module", params=MODEL_TYPES)
def pair(request):
    """(SGLang's own processor, the plug-in) for one model type; the plug-in's pool is closed afterwards."""
    model_type = request.param
    args = server_args()
    config = hf_config(model_type)
    builtin = builtin_class(model_type)(config, args, video_hf_processor(model_type), "default")
    cls = plugin_class(model_type)
    assert cls is MmworkerQwenVLProcessor, f"SGLang picked {cls} for {model_type}"
    plugin = cls(config, args, video_hf_processor(model_type), "default")
    assert plugin.plan.spec is not None, plugin.plan.declined
    assert plugin.plan.videos, plugin.plan.videos_declined
    yield builtin, plugin
    plugin.shutdown()
    builtin.shutdown()


def text_of(template: str) -> str:
    return template.format(V=V, I=I)


def assert_same(ours, theirs, *, served: bool = True) -> None:
    """Equal outputs, item by item (modality, offsets, every model-specific tensor, feature bits);
    `served`: ours came from mmworker, so its items carry mmworker's hash."""
    assert ours.input_ids == list(theirs.input_ids), "expanded input ids differ"
    for name in ("im_token_id", "im_start_id", "im_end_id", "video_token_id", "audio_token_id"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert [a.modality for a in ours.mm_items] == [b.modality for b in theirs.mm_items], "items differ"
    for k, (a, b) in enumerate(zip(ours.mm_items, theirs.mm_items, strict=True)):
        assert a.offsets == b.offsets, f"item {k}: offsets {a.offsets} vs {b.offsets}"
        assert a.model_specific_data.keys() == b.model_specific_data.keys(), k
        for key, mine in a.model_specific_data.items():
            other = b.model_specific_data[key]
            assert mine.dtype == other.dtype and mine.shape == other.shape, f"item {k}: {key} {mine} vs {other}"
            assert torch.equal(mine, other), f"item {k}: {key} {mine} vs {other}"
        assert a.feature.dtype == b.feature.dtype == torch.float32 and a.feature.shape == b.feature.shape, k
        differ = a.feature.view(torch.int32) != b.feature.view(torch.int32)
        assert not differ.any(), f"item {k}: features differ in {int(differ.sum())} of {differ.numel()} values"
        if served:
            assert a.hash is not None and a.pad_values is not None, "the plug-in hands over its hash"
    assert ours.mrope_positions.dtype == theirs.mrope_positions.dtype
    assert torch.equal(ours.mrope_positions, theirs.mrope_positions), "M-RoPE positions differ"
    assert ours.mrope_position_delta.dtype == theirs.mrope_position_delta.dtype
    assert torch.equal(ours.mrope_position_delta, theirs.mrope_position_delta), "M-RoPE delta differs"


def same_and_served(builtin, plugin, images: list, text, video_data: list):
    """The request through both: equal outputs, and the plug-in's counters say it served it itself."""
    theirs = run(builtin, images, list(text) if isinstance(text, list) else text, video_data=list(video_data))
    before = plugin.stats()
    ours = run(plugin, images, list(text) if isinstance(text, list) else text, video_data=list(video_data))
    after = plugin.stats()
    assert after["served"] == before["served"] + 1, f"the plug-in did not serve the request itself: {after}"
    assert_same(ours, theirs)
    return ours


@pytest.mark.parametrize("name", REQUESTS)
def test_bytes(pair, clips, name):
    template, images, video_names = REQUESTS[name]
    ours = same_and_served(*pair, [IMAGES[n] for n in images], text_of(template), [clips[n] for n in video_names])
    video_items = [item for item in ours.mm_items if item.modality == Modality.VIDEO]
    qwen2 = pair[1].model_type in ("qwen2_vl", "qwen2_5_vl")
    if qwen2 and len(video_names) > 1 and not ONE_PATCH.issuperset(video_names):
        # SGLang keeps these in one item: several Qwen2/2.5 videos, not all of one temporal patch.
        assert len(video_items) == 1 and len(video_items[0].offsets) == len(video_names)
        assert video_items[0].model_specific_data["video_grid_thw"].shape == (len(video_names), 3)
    else:
        assert len(video_items) == len(video_names)


def test_pre_tokenised_prompt_is_tokenised_again(pair, clips):
    """A list of ids with a video is decoded and tokenised again, as SGLang does whenever a video comes
    (its avoid-retokenize step is image-only): "hello" split unusually comes back as one token."""
    builtin, plugin = pair
    text = text_of("hello {V} and {I} world")
    ids = TOKENIZER.encode(text)
    hello = TOKENIZER.encode("hello")
    assert len(hello) == 1
    split = [*TOKENIZER.encode("hel"), *TOKENIZER.encode("lo")]
    odd = [*split, *ids[len(hello) :]] if ids[: len(hello)] == hello else None
    assert odd is not None and TOKENIZER.decode(odd) == text
    ours = same_and_served(builtin, plugin, [IMAGES["png"]], odd, [clips["h264_2_frames"]])
    assert ours.input_ids[: len(hello)] == hello


def test_every_source_form(pair, clips, tmp_path):
    """bytes, path, file:// URL (quoted), VideoData, data: URL, bare base64 and http URL."""
    builtin, plugin = pair
    data = clips["h264_2_frames"]
    odd_dir = tmp_path / "a dir with spaces"
    odd_dir.mkdir()
    (odd_dir / "v.mp4").write_bytes(data)
    (tmp_path / "v.mp4").write_bytes(data)
    server = MediaServer()
    try:
        url = server.put("v.mp4", data)
        forms = [
            [data, str(tmp_path / "v.mp4"), "file://" + urllib.parse.quote(str(odd_dir / "v.mp4"))],
            [VideoData(url=str(tmp_path / "v.mp4")), f"data:video/mp4;base64,{base64.b64encode(data).decode()}"],
            [base64.b64encode(data).decode(), url],
        ]
        for sources in forms:
            same_and_served(builtin, plugin, [], " and ".join([V] * len(sources)), sources)
    finally:
        server.stop()


def test_bad_videos_are_named_and_the_pool_keeps_serving(pair, clips):
    _, plugin = pair
    for sources, named in (([clips["h264_2_frames"], clips["truncated_faststart"]], "video 1"),
                           ([b"not a video at all"], "video 0")):  # fmt: skip
        with pytest.raises(MediaRejected) as err:
            run(plugin, [IMAGES["png"]], text_of("{I}" + " {V}" * len(sources)), video_data=sources)
        assert isinstance(err.value, ImageRejected) and isinstance(err.value, ValueError)  # 400 in SGLang
        assert named in str(err.value), str(err.value)
    out = run(plugin, [], V, video_data=[clips["h264_2_frames"]])
    assert out.mm_items[0].feature.shape[0] > 0


def test_videos_mmworker_does_not_decode_go_to_sglang(pair, clips):
    """A stream without a decoder: the workers say UNSUPPORTED, SGLang's own path answers (it fails too)."""
    builtin, plugin = pair
    with pytest.raises(Exception) as theirs:
        run(builtin, [], V, video_data=[clips["unknown_codec"]])
    before = plugin.stats()
    with pytest.raises(type(theirs.value)):
        run(plugin, [], V, video_data=[clips["unknown_codec"]])
    after = plugin.stats()
    assert after["served"] == before["served"]
    assert after["delegated_by_reason"].get(UNREPRODUCED, 0) == before["delegated_by_reason"].get(UNREPRODUCED, 0) + 1


def test_video_data_with_options_goes_to_sglang_unchanged(pair, clips):
    builtin, plugin = pair
    video = VideoData(url="data:video/mp4;base64," + base64.b64encode(clips["h264_2_frames"]).decode(),
                      preprocess_kwargs={"fps": 1.0})  # fmt: skip
    theirs = run(builtin, [], V, video_data=[video])
    before = plugin.stats()
    ours = run(plugin, [], V, video_data=[video])
    after = plugin.stats()
    assert after["served"] == before["served"] and after["delegated"] == before["delegated"] + 1, after
    assert after["delegated_by_reason"]["VideoData with preprocessing options"] >= 1
    assert_same(ours, theirs, served=False)


def test_route_reasons(pair, tmp_path, monkeypatch):
    """The router's decisions for videos, one per rule (nothing runs)."""
    _, plugin = pair
    p = plugin._prompting
    one = text_of("hi {V} there")

    def decide(sources, text=one, images=(), urls=True, videos=True, **request):
        req = Request(video_data=sources, **request)
        return route(list(images), text, req, p, urls=urls, avoid_retokenize=True, videos=videos,
                     video_data_type=VideoData)  # fmt: skip

    served = decide([b"\x00\x00\x00\x18ftypmp42"])
    assert isinstance(served, Served) and served.sources == [] and served.videos == [b"\x00\x00\x00\x18ftypmp42"]
    assert served.prompt == TOKENIZER.encode(one)
    mixed = decide(["/v.mp4"], text=text_of("{I} {V}"), images=[IMAGES["png"]])
    assert isinstance(mixed, Served) and mixed.sources == [IMAGES["png"]] and mixed.videos == ["/v.mp4"]
    assert decide([VideoData(url="/v.mp4")]).videos == ["/v.mp4"]
    assert decide(["file:///a%20b/v.mp4"]).videos == ["/a b/v.mp4"]
    assert decide(["http://127.0.0.1/v.mp4"]).videos == ["http://127.0.0.1/v.mp4"]
    assert decide(["AAAAGGZ0eXBtcDQy"]).videos == ["AAAAGGZ0eXBtcDQy"]  # bare base64
    assert decide(["missing.mp4"]).videos == ["missing.mp4"]  # no such file: SGLang decodes it as base64 too
    (tmp_path / "here.mp4").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    refused = {
        "audio": decide(["/v.mp4"], audio_data=["/a.wav"]),
        "video (not served for this model)": decide(["/v.mp4"], videos=False),
        "video_data that is not a list": decide("/v.mp4"),
        "Tensor video": decide([torch.zeros(2, 8, 8, 3, dtype=torch.uint8)]),
        "ndarray video": decide([np.zeros((2, 8, 8, 3), np.uint8)]),
        "list video": decide([[np.zeros((8, 8, 3), np.uint8)] * 2]),
        "preprocessed input": decide([{"format": "processor_output"}]),
        "VideoData with preprocessing options": decide([VideoData(url="/v.mp4", preprocess_kwargs={"fps": 1})]),
        "bytearray video": decide([bytearray(b"abc")]),
        "http(s) URL": decide(["https://127.0.0.1/v.mp4"], urls=False),
        "a video path that SGLang's URL parsing changes": decide(["/a%20b.mp4"]),
        "relative video path": decide(["here.mp4"]),
        "base64 with surrounding whitespace": decide(["data:video/mp4;base64, AAAA"]),
        "file:// URL without an absolute path": decide(["file://here.mp4"]),
    }
    for reason, decision in refused.items():
        assert decision == Delegated(reason), (reason, decision)
    placeholders = "video placeholders other than one <|vision_start|><|video_pad|><|vision_end|> per video"
    for text in (text_of("{V} {V}"), "hi <|video_pad|> there", "<|vision_start|><|video_pad|><|video_pad|><|vision_end|>",
                 "hi there"):  # fmt: skip
        assert decide(["/v.mp4"], text=text) == Delegated(placeholders), text
    assert decide([], text=text_of("{I}")).__class__ is Delegated  # no images, no videos


def test_the_plan_says_why_it_declines_videos(pair):
    """Each setting of SGLang's video path that mmworker does not reproduce declines videos, with its
    reason in the plan, and leaves images served."""
    _, plugin = pair
    model_type = plugin.model_type
    image_processor = plugin._processor.image_processor
    facts = plugin._facts()
    base = plugin._video_facts()
    assert planning.resolve(image_processor, facts, {}, video=base).videos

    def processor(**video):
        return dataclasses.replace(base, video_processor=video_hf_processor(model_type, **video).video_processor)

    total = dict(base.sglang_constants, VIDEO_TOTAL_PIXELS=base.sglang_constants["VIDEO_TOTAL_PIXELS"] // 2)
    cases = {
        "decord": dataclasses.replace(base, decoder="decord"),
        "video keys ['fps']": dataclasses.replace(base, overrides={"fps": 1.0}),
        "VIDEO_TOTAL_PIXELS": dataclasses.replace(base, sglang_constants=total),
        "SGLang holds Qwen2VLProcessorX": dataclasses.replace(base, processor_class="Qwen2VLProcessorX"),
        "cap_pixels_per_frame": processor(cap_pixels_per_frame=True),
        "pixel budget": processor(size={"shortest_edge": 1024, "longest_edge": 4096 * 1024}),
        "image_mean": processor(image_mean=[0.25, 0.5, 0.75]),
        "temporal_patch_size": processor(temporal_patch_size=4),
    }
    if model_type == "qwen2_5_vl":
        cases["tokens_per_second is None"] = dataclasses.replace(base, tokens_per_second=None)
    if model_type.startswith("qwen3"):
        cases["does not compose '<10.0 seconds>'"] = dataclasses.replace(base, tokenize=_digit_merging_tokenize())
    else:
        cases["do_sample_frames"] = processor(do_sample_frames=True)
    for reason, video in cases.items():
        plan = planning.resolve(image_processor, facts, {}, video=video)
        assert plan.spec is not None and not plan.videos, reason
        assert reason in plan.videos_declined, (reason, plan.videos_declined)
        assert f"video ({plan.videos_declined})" in plan.describe()


def test_on_a_gpu_host_videos_are_served_as_sglangs_cpu_path_unless_the_operator_delegates_them(pair, tmp_path):
    """Where SGLang would decode with NVDEC (no CPU decoder gives those frames), the plug-in serves the
    CPU path's bytes by default, says so in its log line, and an operator can hand videos to SGLang."""
    _, plugin = pair
    image_processor, facts = plugin._processor.image_processor, plugin._facts()
    on_gpu = dataclasses.replace(plugin._video_facts(), accelerator="CUDA")
    plan = planning.resolve(image_processor, facts, {}, video=on_gpu)
    assert plan.videos and plan.video_accelerator == "CUDA"
    assert "videos decoded on the CPU as SGLang's CPU path decodes them; SGLang would use CUDA" in plan.describe()
    config = tmp_path / "pool.toml"
    config.write_text('videos_on_accelerator = "delegate"\n')
    plan = planning.resolve(image_processor, facts, {planning.CONFIG_ENV: str(config)}, video=on_gpu)
    assert plan.spec is not None and not plan.videos and "videos_on_accelerator" in plan.videos_declined
    assert "video_accelerator" not in plan.pool_config and "videos_on_accelerator" not in plan.pool_config
    # On the CPU the key changes nothing.
    cpu = planning.resolve(image_processor, facts, {planning.CONFIG_ENV: str(config)}, video=plugin._video_facts())
    assert cpu.videos and cpu.video_accelerator is None
    config.write_text('videos_on_accelerator = "sometimes"\n')
    with pytest.raises(MmError, match=r"`videos_on_accelerator` must be one of 'serve', 'delegate', got 'sometimes'"):
        planning.resolve(image_processor, facts, {planning.CONFIG_ENV: str(config)}, video=on_gpu)


def _digit_merging_tokenize():
    """A GPT-2-style byte-level BPE that learned digit merges: "10" is one token, so timestamp ids are
    not the ids of their characters, which Qwen's tokenizers guarantee (docs/behaviour.md §15.5)."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([f"<{x / 10:.1f} seconds>" for x in range(0, 4000, 7)] * 3, vocab_size=400,
                            min_frequency=1, show_progress=False)  # fmt: skip
    return lambda text: bpe.encode(text).ids


def test_video_settings_sglang_reads_delegate_the_request():
    """--mm-process-config {"video": {"fps": 1.0}} (SGLang samples 1 frame a second): videos go to
    SGLang's own path, which gives its own bytes; images are still served."""
    model_type = "qwen2_5_vl"
    args = server_args(mm_process_config={"video": {"fps": 1.0}})
    config = hf_config(model_type)
    builtin = builtin_class(model_type)(config, args, video_hf_processor(model_type), "default")
    plugin = plugin_class(model_type)(config, args, video_hf_processor(model_type), "default")
    try:
        assert not plugin.plan.videos and "video keys ['fps']" in plugin.plan.videos_declined
        data = videos.corpus()["h264_420_untagged"].data()
        theirs = run(builtin, [], V, video_data=[data])
        ours = run(plugin, [], V, video_data=[data])
        assert_same(ours, theirs, served=False)
        stats = plugin.stats()
        assert stats["served"] == 0 and stats["delegated_by_reason"] == {"video (not served for this model)": 1}
        image = run(plugin, [IMAGES["png"]], I)
        assert plugin.stats()["served"] == 1 and image.mm_items[0].modality == Modality.IMAGE
    finally:
        plugin.shutdown()
        builtin.shutdown()
        server_args()  # SGLang's default arguments published again for the tests after this one


def test_bf16_features_for_videos_when_the_operator_opts_in(clips, monkeypatch, tmp_path):
    """`feature_dtype = "bfloat16"`: each video's features, a Qwen2.5 bundle's included, are SGLang's
    float32 values rounded as torch rounds them, handed on as bfloat16; everything else is SGLang's."""
    model_type = "qwen2_5_vl"
    config_file = tmp_path / "pool.toml"
    config_file.write_text('feature_dtype = "bfloat16"\n')
    monkeypatch.setenv("MMWORKER_SGLANG_CONFIG", str(config_file))
    args = server_args()
    config = hf_config(model_type)
    builtin = builtin_class(model_type)(config, args, video_hf_processor(model_type), "default")
    plugin = plugin_class(model_type)(config, args, video_hf_processor(model_type), "default")
    try:
        assert plugin.plan.videos and plugin.plan.spec["feature_dtype"] == "bfloat16"
        template, images, names = REQUESTS["image-and-two-videos"]
        sources = [clips[n] for n in names]
        theirs = run(builtin, [IMAGES[n] for n in images], text_of(template), video_data=list(sources))
        ours = run(plugin, [IMAGES[n] for n in images], text_of(template), video_data=list(sources))
        assert plugin.stats()["served"] == 1 and [len(item.offsets) for item in ours.mm_items] == [1, 2]
        for a, b in zip(ours.mm_items, theirs.mm_items, strict=True):
            assert a.feature.dtype == torch.bfloat16 and a.feature.shape == b.feature.shape
            assert torch.equal(a.feature.view(torch.int16), b.feature.to(torch.bfloat16).view(torch.int16))
            a.feature = b.feature  # everything but the feature's dtype is SGLang's own output
        assert_same(ours, theirs)
    finally:
        plugin.shutdown()
        builtin.shutdown()


_CONSTANTS = """
import json
import plugin_env  # stubs sgl_kernel before SGLang is imported
from sglang.srt.multimodal.processors import qwen_vl
from mmworker.sglang import plan
print(json.dumps([{name: getattr(qwen_vl, name) for name in plan.SGLANG_VIDEO_CONSTANTS}, plan.SGLANG_VIDEO_CONSTANTS]))
"""


def test_the_environments_video_budget_is_read_as_sglang_reads_it():
    """VIDEO_MAX_PIXELS (the pixels of all of a video's frames): SGLang's module and mmworker's read it
    alike (int of a float; unset, 90% of 128000 tokens of 28 x 28), so the plan serves videos under it:
    here, and in a process that sets it."""
    here = {name: getattr(sglang_qwen_vl, name) for name in planning.SGLANG_VIDEO_CONSTANTS}
    assert here == planning.SGLANG_VIDEO_CONSTANTS
    if "VIDEO_MAX_PIXELS" not in os.environ:
        assert here["VIDEO_TOTAL_PIXELS"] == int(128000 * 28 * 28 * 0.9)
    env = dict(os.environ, VIDEO_MAX_PIXELS="1234567.9")
    proc = subprocess.run([sys.executable, "-c", _CONSTANTS], capture_output=True, text=True, timeout=300, env=env,
                          cwd=os.path.dirname(__file__))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs, ours = json.loads(proc.stdout.strip().splitlines()[-1])
    assert theirs == ours and ours["VIDEO_TOTAL_PIXELS"] == 1234567
