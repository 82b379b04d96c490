"""The plug-in produces exactly what SGLang's own Qwen-VL processor produces, in SGLang's environment.

For each case (model type, HF backend, pixel limits from the HF processor or from
`--mm-process-config`), SGLang's built-in `QwenVLImageProcessor` and the class SGLang picks after
importing mmworker.sglang process the same requests: every feature byte-equal, ids, offsets, grids,
M-RoPE positions and delta equal, and the plug-in's counters prove it served each request itself
(a delegated request would match trivially).
"""

import base64
import urllib.parse

import pytest
import torch
from httpserver import MediaServer
from plugin_env import (
    builtin_class,
    encoded,
    hf_config,
    hf_processor,
    plugin_class,
    prompt,
    run,
    server_args,
)
from sglang.srt.managers.schedule_batch import Modality
from sglang.srt.utils import ImageData

from mmworker.sglang.qwen_vl import MmworkerQwenVLProcessor

# (model type, backend, HF processor pixel limits, --mm-process-config image overrides)
CASES = [
    ("qwen2_vl", "torchvision", {}, {}),
    ("qwen2_5_vl", "pil", {}, {}),
    ("qwen2_5_vl", "torchvision", {"min_pixels": 3136, "max_pixels": 200704}, {}),
    ("qwen3_vl", "torchvision", {}, {}),
    ("qwen3_vl_moe", "pil", {}, {}),
    ("qwen3_5", "torchvision", {}, {"max_pixels": 262144}),
    ("qwen3_5_moe", "pil", {"max_pixels": 401408}, {"min_pixels": 131072}),
]

# name -> encoded image; sizes chosen for: odd sizes, widths that grow while heights shrink (Pillow
# 13's vertical-first order), tiny images lifted by min_pixels, a JPEG large enough to be streamed.
IMAGES = {
    "jpeg_640x480": encoded(640, 480, "JPEG", 1, quality=90),
    "jpeg_1024x768": encoded(1024, 768, "JPEG", 2, quality=85),
    "jpeg_333x517_444": encoded(333, 517, "JPEG", 3, quality=95, subsampling=0),
    "jpeg_2400x1800": encoded(2400, 1800, "JPEG", 4, quality=90),
    "png_300x301": encoded(300, 301, "PNG", 5),
    "png_512x512": encoded(512, 512, "PNG", 6),
    "png_rgba_97x211": encoded(97, 211, "RGBA-PNG", 7),
    "gif_120x90": encoded(120, 90, "GIF", 8),
    "webp_500x375": encoded(500, 375, "WEBP", 9, quality=80),
    "webp_lossless_64x48": encoded(64, 48, "WEBP", 10, lossless=True),
    "bmp_213x160": encoded(213, 160, "BMP", 11),
    "jpeg_grey_200x150": encoded(200, 150, "GREY-JPEG", 12, quality=90),
}
# Requests: lists of image names (1-3 images).
REQUESTS = [
    ["jpeg_640x480"],
    ["jpeg_1024x768"],
    ["png_512x512"],
    ["jpeg_333x517_444", "png_300x301"],
    ["png_rgba_97x211", "gif_120x90", "webp_500x375"],
    ["bmp_213x160", "webp_lossless_64x48", "jpeg_grey_200x150"],
    ["jpeg_2400x1800"],
]


@pytest.fixture(
    scope="module",
    params=CASES,
    ids=["-".join([c[0], c[1], *map(str, c[2].values()), *map(str, c[3].values())]) for c in CASES],
)
def pair(request):
    """(SGLang's own processor, the plug-in) for one case; the plug-in's pool is closed afterwards."""
    model_type, backend, pixels, overrides = request.param
    args = server_args(mm_process_config={"image": overrides} if overrides else {})
    config = hf_config(model_type)
    builtin = builtin_class(model_type)(config, args, hf_processor(model_type, backend, **pixels), "default")
    cls = plugin_class(model_type)
    assert cls is MmworkerQwenVLProcessor, f"SGLang picked {cls} for {model_type}"
    plugin = cls(config, args, hf_processor(model_type, backend, **pixels), "default")
    assert plugin.plan.spec is not None, plugin.plan.declined
    yield builtin, plugin
    plugin.shutdown()
    builtin.shutdown()


def assert_same(ours, theirs, *, served: bool = True) -> None:
    """Equal outputs; `served`: ours came from mmworker, so its items carry mmworker's hash."""
    assert ours.input_ids == list(theirs.input_ids), "expanded input ids differ"
    for name in ("im_token_id", "im_start_id", "im_end_id", "video_token_id", "audio_token_id"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert len(ours.mm_items) == len(theirs.mm_items)
    for k, (a, b) in enumerate(zip(ours.mm_items, theirs.mm_items, strict=True)):
        assert a.modality == b.modality == Modality.IMAGE
        assert a.offsets == b.offsets, f"image {k}: offsets"
        ga, gb = a.model_specific_data["image_grid_thw"], b.model_specific_data["image_grid_thw"]
        assert ga.dtype == gb.dtype and torch.equal(ga, gb), f"image {k}: grid {ga} vs {gb}"
        assert a.feature.dtype == b.feature.dtype == torch.float32 and a.feature.shape == b.feature.shape, k
        if not torch.equal(a.feature, b.feature):
            diff = (a.feature - b.feature).abs()
            raise AssertionError(
                f"image {k}: features differ in {(diff > 0).sum().item()} of {diff.numel()} values (max {diff.max().item()})"
            )
        if served:
            assert a.hash is not None and a.pad_values is not None, "the plug-in hands over its hash"
    assert ours.mrope_positions.dtype == theirs.mrope_positions.dtype
    assert torch.equal(ours.mrope_positions, theirs.mrope_positions), "M-RoPE positions differ"
    assert torch.equal(ours.mrope_position_delta, theirs.mrope_position_delta), "M-RoPE delta differs"


def same_and_served(builtin, plugin, images: list, text) -> None:
    """The request through both: equal outputs, and the plug-in's counters say it served it itself."""
    theirs = run(builtin, images, list(text) if isinstance(text, list) else text)
    before = plugin.stats()["served"]
    ours = run(plugin, images, list(text) if isinstance(text, list) else text)
    stats = plugin.stats()
    assert stats["served"] == before + 1, f"the plug-in did not serve the request itself: {stats}"
    assert_same(ours, theirs)


@pytest.mark.parametrize("names", REQUESTS, ids=["+".join(r) for r in REQUESTS])
def test_bytes(pair, names):
    same_and_served(*pair, [IMAGES[n] for n in names], prompt(len(names)))


def test_every_source_form(pair, tmp_path):
    """bytes, data: URL, path, file:// URL (quoted), ImageData, bare base64 and http URL: one request each way."""
    builtin, plugin = pair
    png, jpeg, webp = IMAGES["png_300x301"], IMAGES["jpeg_640x480"], IMAGES["webp_500x375"]
    odd_dir = tmp_path / "a dir with spaces"
    odd_dir.mkdir()
    (odd_dir / "p.png").write_bytes(png)
    (tmp_path / "j.jpg").write_bytes(jpeg)
    server = MediaServer()
    try:
        url = server.put("w.webp", webp)
        forms = [
            [png, f"data:image/png;base64,{base64.b64encode(png).decode()}", str(tmp_path / "j.jpg")],
            ["file://" + urllib.parse.quote(str(odd_dir / "p.png")), ImageData(url=str(tmp_path / "j.jpg"))],
            [base64.b64encode(png).decode(), url],
        ]
        for images in forms:
            same_and_served(builtin, plugin, images, prompt(len(images)))
    finally:
        server.stop()


def test_pre_tokenized_prompt(pair):
    """A list of ids (the request's input_ids) is used as SGLang uses it."""
    builtin, plugin = pair
    images = [IMAGES["jpeg_640x480"], IMAGES["png_300x301"]]
    same_and_served(builtin, plugin, images, plugin._processor.tokenizer.encode(prompt(2)))


def test_request_fields_are_sglangs(pair):
    """What SGLang's own tokenizer-side code reads off the output is there, in its types."""
    _, plugin = pair
    out = run(plugin, [IMAGES["png_300x301"]], prompt(1), rid="x")
    assert isinstance(out.input_ids, list) and all(type(t) is int for t in out.input_ids)
    assert out.padded_input_ids is not None and len(out.padded_input_ids) == len(out.input_ids)
    ((start, end),) = out.mm_items[0].offsets
    assert set(out.padded_input_ids[start : end + 1]) <= set(out.mm_items[0].pad_values)
    assert out.mrope_positions.shape == (3, len(out.input_ids)) and out.mrope_positions.dtype == torch.int64
