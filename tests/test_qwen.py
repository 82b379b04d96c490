"""qwen_vl: spec parsing, smart_resize, normalisation, patch order with the fused vertical pass, and M-RoPE."""

import io
import json
import re

import numpy as np
import pytest
from aligned import float_view_at
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from qwen_reference import hf_patchify, reference_table
from reference_resize import pillow_vertical_first
from reference_resize import resize as reference_resize

from mmworker import MmError
from mmworker.common import image_decode_rgb, resize_rgb
from mmworker.common.pillow import pil_mode_default
from mmworker.common.pixels import RgbImage, rgbx_copy
from mmworker.common.resize import vertical_coefficients
from mmworker.corpus import encode, photo_like
from mmworker.qwen_vl import NAMED_SPECS as QWEN_SPECS
from mmworker.qwen_vl import QwenSpec, QwenVL, as_spec, mrope_image_only, preprocess, smart_resize
from mmworker.qwen_vl import family as family_module
from mmworker.qwen_vl import spec as spec_module
from mmworker.qwen_vl.patchify import normalisation, patchify_into
from mmworker.registry import named_spec, pipeline_from_spec

TINY = {"family": "qwen_vl", "image_token_id": 1, "patch_size": 2, "merge_size": 2, "temporal_patch_size": 2,
        "min_pixels": 4, "max_pixels": 2**30, "image_mean": [0, 0, 0], "image_std": [1, 1, 1]}  # fmt: skip


# --- smart_resize -------------------------------------------------------------------------------


# docs/behaviour.md §12 TV-Q1, verbatim.
@pytest.mark.parametrize(
    ("args", "expected"),
    [((1365, 2048, 28, 3136, 12845056), (1372, 2044)), ((100, 100, 28, 3136, 12845056), (112, 112)),
     ((3000, 4000, 28, 3136, 1003520), (840, 1148)), ((20, 20, 28, 3136, 12845056), (56, 56)),
     ((1365, 2048, 32, 65536, 16777216), (1376, 2048)), ((4000, 48, 32, 4, 2**30), (4000, 64)),
     ((768, 1024, 28, 3136, 1003520), (756, 1036)), ((3024, 4032, 28, 3136, 1003520), (840, 1148)),
     ((480, 640, 28, 3136, 1003520), (476, 644)), ((720, 1280, 28, 3136, 1003520), (728, 1288)),
     ((1080, 1920, 28, 3136, 1003520), (728, 1316))],
)  # fmt: skip
def test_smart_resize_vectors(args, expected):
    assert smart_resize(*args) == expected


def test_smart_resize_aspect_ratio_limit():
    assert smart_resize(28, 5600, 28, 3136, 12845056)[1] > 0  # exactly 200 passes
    with pytest.raises(MmError, match=r"^absolute aspect ratio must be smaller than 200, got 1000$"):
        smart_resize(10000, 10, 28, 3136, 12845056)
    with pytest.raises(MmError, match=r"got 200\.5$"):
        smart_resize(1, 200.5, 28, 3136, 12845056)


def test_smart_resize_degenerate_and_empty():
    with pytest.raises(
        MmError, match=r"^smart_resize: 10x2000 degenerates to 0x\d+ at max_pixels=3136; image is too thin"
    ):
        smart_resize(10, 2000, 28, 3136, 3136)
    with pytest.raises(MmError, match=r"^empty image$"):
        smart_resize(0, 5, 28, 3136, 3136)


def test_smart_resize_parity_with_rust_extension(rust_ext):
    rng = np.random.default_rng(1)
    cases = [(int(h), int(w)) for h, w in rng.integers(1, 5000, (400, 2))] + [
        (4000, 48),
        (48, 4000),
        (1, 1),
        (3, 600),
    ]
    for factor, lo, hi in (
        (28, 3136, 1003520),
        (28, 3136, 12845056),
        (32, 65536, 16777216),
        (28, 3136, 3136),
    ):
        for h, w in cases:
            try:
                ours = smart_resize(h, w, factor, lo, hi)
            except MmError:
                with pytest.raises(ValueError):
                    rust_ext.qwen_vl.smart_resize_py(h, w, factor, lo, hi)
                continue
            assert ours == tuple(rust_ext.qwen_vl.smart_resize_py(h, w, factor, lo, hi)), (h, w, factor)


# --- spec ---------------------------------------------------------------------------------------


def test_named_specs_parse():
    for name in QWEN_SPECS:
        family = pipeline_from_spec(name)
        capabilities = family.capabilities()
        assert capabilities.audio is False
        # Qwen2/2.5 serve videos as bundled; Qwen3's need the tokenizer's timestamp table (not bundled).
        assert capabilities.video is (name in ("qwen2_vl", "qwen2_5_vl")), name
        assert capabilities.video or "timestamp_table" in capabilities.note
        assert family.spec == QwenSpec.from_mapping(named_spec(name))
    assert pipeline_from_spec("qwen2_vl").spec.feature_dim == 1176
    assert pipeline_from_spec("qwen3_5").spec.feature_dim == 1536 and pipeline_from_spec("qwen3_5").spec.factor == 32


@pytest.mark.parametrize(
    ("change", "message"),
    [({"resample": "pil_bicubic"}, "qwen_vl spec: unknown variant `pil_bicubic`, expected `aten_u8` or `pil`"),
     ({"patch_size": 0}, "qwen_vl spec: sizes must be positive"),
     ({"merge_size": -2}, "qwen_vl spec: sizes must be positive"),
     ({"patch_size": "14"}, "qwen_vl spec: `patch_size` must be an integer"),
     ({"image_mean": [0.5, 0.5]}, "qwen_vl spec: `image_mean` must be 3 numbers"),
     ({"image_std": [0.5, 0, 0.5]}, "qwen_vl spec: `image_std` must be non-zero"),
     ({"max_pixels": 0}, "qwen_vl spec: pixel budget must be positive")],
)  # fmt: skip
def test_spec_errors(change, message):
    with pytest.raises(MmError, match=rf"^{message}"):
        pipeline_from_spec({**TINY, **change})


def test_spec_missing_field_and_registry_errors():
    spec = dict(TINY)
    del spec["image_std"]
    with pytest.raises(MmError, match=r"^qwen_vl spec: missing field `image_std`$"):
        pipeline_from_spec(spec)
    with pytest.raises(MmError, match=r"^unknown mm family: 'intern_vl'; known: qwen_vl, inkling$"):
        pipeline_from_spec({**TINY, "family": "intern_vl"})
    with pytest.raises(MmError, match=r"^mm family 'no_such_module:Family': cannot load no_such_module:Family: "):
        pipeline_from_spec({**TINY, "family": "no_such_module:Family"})
    with pytest.raises(MmError, match=r"^unknown named spec 'qwen9_vl'; known: qwen2_vl, "):
        pipeline_from_spec("qwen9_vl")
    with pytest.raises(MmError, match=r"^mm spec: "):
        pipeline_from_spec("{not json")
    with pytest.raises(MmError, match=r"^mm spec: expected a JSON object"):
        pipeline_from_spec("[1, 2]")
    assert pipeline_from_spec(json.dumps({**TINY, "unknown_key": 5, "feature_shm": True})).spec.patch_size == 2


def test_spec_pillow_is_resolved_and_written_back():
    # Absent: the installed stock Pillow's version, or 12.1.1 under pillow-simd; a worker given
    # to_mapping() as JSON resolves nothing again.
    spec = pipeline_from_spec({**TINY, "resample": "pil"}).spec
    assert spec.pillow == pil_mode_default()
    assert spec.to_mapping()["pillow"] == spec.pillow and as_spec(json.dumps(spec.to_mapping())) == spec
    named = pipeline_from_spec({**TINY, "resample": "pil", "pillow": "13.0.0"}).spec
    assert named.pillow == "13.0.0" and as_spec(json.dumps(named.to_mapping())) == named


@pytest.mark.parametrize("version", ["11.3.0", "14.0.0", "12", 13, "latest"])
def test_spec_refuses_an_unsupported_pillow(version):
    message = f"Pillow {version!r} is not supported: the pil resize reproduces stock Pillow 12.0 to 13.x"
    for resample in ("pil", "aten_u8"):  # a bad value is a bad spec, whichever mode it would serve
        with pytest.raises(MmError, match=rf"^qwen_vl spec: `pillow`: {re.escape(message)}$"):
            pipeline_from_spec({**TINY, "resample": resample, "pillow": version})


def test_an_unsupported_installed_pillow_is_refused_for_the_pil_mode_alone(monkeypatch):
    monkeypatch.setattr(spec_module, "pil_mode_default", lambda: "14.0.0")
    monkeypatch.setattr(spec_module, "installed", lambda: "Pillow 14.0.0")
    with pytest.raises(
        MmError,
        match=r"^qwen_vl spec: `pillow` names no version, and the installed Pillow 14\.0\.0 is not one the pil mode "
        r"reproduces \(stock Pillow 12\.0 to 13\.x\)$",
    ):
        pipeline_from_spec({**TINY, "resample": "pil"})
    assert pipeline_from_spec({**TINY, "resample": "pil", "pillow": "12.3.0"}).spec.pillow == "12.3.0"
    spec = pipeline_from_spec(TINY).spec  # aten_u8 never resizes as Pillow does: nothing to resolve
    assert spec.pillow is None and "pillow" not in spec.to_mapping()


# (w, h, max_pixels): Pillow 13 resizes the first three vertically first (the height shrinks by more
# than twice as many pixels as the width: 640x480 -> 644x476 too), 12.2+ the tall one, nobody the
# last; 600x3000 would stream (its decoded pixels outweigh half the feature), but not vertically first.
ORDER_CASES = [
    (640, 480, 1003520),
    (1024, 768, 1003520),
    (600, 3000, 401408),
    (19, 2000, 1003520),
    (1280, 720, 1003520),
]


@pytest.mark.parametrize("version", ["12.1.1", "12.3.0", "13.0.0"])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize(("w", "h", "max_pixels"), ORDER_CASES)
def test_pil_mode_resizes_in_the_named_pillows_order(version, fmt, w, h, max_pixels, monkeypatch):
    spec = as_spec({**named_spec("qwen2_vl"), "max_pixels": max_pixels, "resample": "pil", "pillow": version})
    data = encode(photo_like(w, h, seed=5), fmt)
    th, tw = smart_resize(h, w, spec.factor, spec.min_pixels, spec.max_pixels)
    first = pillow_vertical_first(version, w, h, tw, th)
    if first:  # decoded whole: a streamed decode would mean the patchify's vertical pass ran
        monkeypatch.setattr(family_module, "horizontal_rows", lambda *args: pytest.fail("streamed"))
    pixel_values, grid = preprocess(data, spec)
    resized = resize_rgb(image_decode_rgb(data)[2], tw, th, "pil_bicubic", pillow=version)
    expected = hf_patchify(resized, reference_table(spec.image_mean, spec.image_std, "pil"), 14, 2, 2)
    assert grid == (1, th // 14, tw // 14)
    np.testing.assert_array_equal(pixel_values.view(np.uint32), expected.view(np.uint32))
    if version == "13.0.0":
        assert first == ((w, h) != (1280, 720))


# --- normalisation and patch order ---------------------------------------------------------------


def kernel_table(mean, std, resample) -> np.ndarray:
    """The same table, computed by patchify_into: one 16x16 patch holding every byte value once."""
    pixels = rgbx_copy(np.repeat(np.arange(256, dtype=np.uint8).reshape(16, 16, 1), 3, axis=2))
    out = np.empty((1, 3 * 256), np.float32)
    patchify_into(pixels, vertical_coefficients(16, 16, "aten_u8"), normalisation(mean, std, resample), 16, 1, 1, out)
    return out.reshape(3, 256)


@pytest.mark.parametrize("resample", ["pil", "aten_u8"])
@pytest.mark.parametrize(("mean", "std"), [((0.5,) * 3, (0.5,) * 3),
                                           ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))])  # fmt: skip
def test_normalisation_is_the_lut_of_behaviour_md(resample, mean, std):
    np.testing.assert_array_equal(kernel_table(mean, std, resample).view(np.uint32),
                                  reference_table(mean, std, resample).view(np.uint32))  # fmt: skip


def test_tv_q2_modes_differ_on_128_entries():
    pil = kernel_table((0.5,) * 3, (0.5,) * 3, "pil")
    aten = kernel_table((0.5,) * 3, (0.5,) * 3, "aten_u8")
    assert int((pil[0] != aten[0]).sum()) == 128
    for table in (pil, aten):
        assert table[0, 0] == -1.0 and table[0, 255] == 1.0 and table.dtype == np.float32


def test_tv_q3_patch_order():
    y, x, c = np.mgrid[0:4, 0:8, 0:3]
    img = (16 * y + 2 * x + c).astype(np.uint8)
    table = reference_table((0.0,) * 3, (1.0,) * 3, "pil")
    pv = np.empty((8, 24), np.float32)
    norm = normalisation((0.0,) * 3, (1.0,) * 3, "pil")
    patchify_into(rgbx_copy(img), vertical_coefficients(4, 4, "pil_bicubic"), norm, 2, 2, 2, pv)
    flat = pv.reshape(-1)
    value = lambda yy, xx, cc: table[cc, 16 * yy + 2 * xx + cc]  # noqa: E731
    assert flat[24] == value(0, 2, 0)
    assert flat[48] == value(2, 0, 0)
    assert flat[96] == value(0, 4, 0)
    assert flat[24 + 4] == flat[24]  # temporal copy
    assert flat[8] == value(0, 0, 1)


@settings(max_examples=80, deadline=None)
@given(ps=st.integers(1, 18), m=st.integers(1, 3), tps=st.integers(1, 3), bh=st.integers(1, 4),
       bw=st.integers(1, 4), extra_rows=st.integers(-20, 40), resample=st.sampled_from(["aten_u8", "pil"]),
       seed=st.integers(0, 2**31))  # fmt: skip
def test_patchify_equals_vertical_resize_then_hf_reshape(ps, m, tps, bh, bw, extra_rows, resample, seed):
    # The vertical pass inside the kernel, against the plain transcription of docs/behaviour.md §5
    # (a vertical-only resize: the width is already the output's), then HF's patch order.
    rng = np.random.default_rng(seed)
    out_h, w = bh * m * ps, bw * m * ps
    in_h = max(1, out_h + extra_rows)
    pixels = rng.integers(0, 256, (in_h, w, 3), dtype=np.uint8)
    mean, std = tuple(rng.random(3)), tuple(rng.random(3) + 0.1)
    resampler = "aten_u8" if resample == "aten_u8" else "pil_bicubic"
    out = np.empty((bh * m * bw * m, 3 * tps * ps * ps), np.float32)
    patchify_into(rgbx_copy(pixels), vertical_coefficients(in_h, out_h, resampler), normalisation(mean, std, resample),
                  ps, m, tps, out)  # fmt: skip
    resized = reference_resize(pixels, w, out_h, resampler)
    expected = hf_patchify(resized, reference_table(mean, std, resample), ps, m, tps)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("shift", [0, 1, 3, 8, 15])
@pytest.mark.parametrize("ps, m, tps", [(14, 2, 2), (16, 2, 2), (14, 1, 1), (16, 1, 3)])
def test_patchify_streams_a_large_output_at_any_alignment(shift, ps, m, tps):
    # Qwen's patch sizes, ~20 x 30 patches: with shift 0 the merge blocks go straight from the
    # band to out as whole lines (but for 14 x 14 x 3 floats, not a whole number of line groups),
    # otherwise through the stage with the head of every one unaligned; nothing is written past the end.
    rng = np.random.default_rng(shift)
    side = 20 * ps
    pixels = rng.integers(0, 256, (side, 30 * ps, 4), dtype=np.uint8)
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    expected = hf_patchify(pixels[:, :, :3], reference_table(mean, std, "aten_u8"), ps, m, tps)
    raw, flat = float_view_at(shift, expected.size)
    patchify_into(pixels, vertical_coefficients(side, side, "aten_u8"), normalisation(mean, std, "aten_u8"), ps, m,
                  tps, flat.reshape(expected.shape))  # fmt: skip
    np.testing.assert_array_equal(flat.reshape(expected.shape), expected)
    tail = raw[flat.ctypes.data - raw.ctypes.data + flat.nbytes :]
    assert (tail == 0xAB).all()


def test_patchify_refuses_what_it_cannot_read_safely():
    pixels = np.zeros((8, 8, 4), np.uint8)
    norm = normalisation((0.5,) * 3, (0.5,) * 3, "aten_u8")
    out = np.empty((16, 24), np.float32)
    with pytest.raises(MmError, match=r"^patchify: expected C-contiguous \(h, w, 4\) uint8 pixels"):
        patchify_into(pixels[:, :, :3], vertical_coefficients(8, 8, "pil_bicubic"), norm, 2, 2, 2, out)
    bounds, weights, precision = vertical_coefficients(8, 8, "pil_bicubic")
    bounds = bounds.copy()
    bounds[-1, 0] = 8  # past the last source row
    with pytest.raises(MmError, match=r"^patchify: vertical pass coefficients do not fit 8 source rows read in order$"):
        patchify_into(pixels, (bounds, weights, precision), norm, 2, 2, 2, out)
    bounds[:4, 0], bounds[4:, 0] = 2, 0  # in range, but the second merge-block row reads rows before the first's
    with pytest.raises(MmError, match=r"^patchify: vertical pass coefficients do not fit 8 source rows read in order$"):
        patchify_into(pixels, (bounds, weights, precision), norm, 2, 2, 2, out)
    with pytest.raises(MmError, match=r"^patchify: out must be C-contiguous float32"):
        patchify_into(pixels, vertical_coefficients(8, 8, "pil_bicubic"), norm, 2, 2, 2, out[:, :12])
    with pytest.raises(MmError, match=r"^patchify: 8x6 is not a positive multiple of 4"):
        patchify_into(pixels, vertical_coefficients(8, 6, "pil_bicubic"), norm, 2, 2, 2, out)


def test_preprocess_tv_d1_shapes():
    img = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    pv, thw = preprocess(buf.getvalue(), TINY)
    assert thw == (1, 4, 4) and pv.shape == (16, 24) and pv.dtype == np.float32
    family = QwenVL(QwenSpec.from_mapping({**TINY, "merge_size": 3, "min_pixels": 1}))
    item = family.process_item(RgbImage(pixels=np.zeros((8, 8, 3), np.uint8)))  # factor 6: 8 -> 6
    assert item.geometry.h == 3 and item.feature.shape == (9, 24)


def _encoded_with_modes() -> dict[str, bytes]:
    rgba = Image.fromarray(np.random.default_rng(3).integers(0, 256, (157, 233, 4), dtype=np.uint8), "RGBA")
    rgb = rgba.convert("RGB")
    cases = {
        "webp lossless rgba": (rgba, "WEBP", {"lossless": True}),
        "webp lossy rgba": (rgba, "WEBP", {"quality": 80}),
        "webp lossy rgb": (rgb, "WEBP", {"quality": 80}),
        "bmp rgba": (rgba, "BMP", {}),
        "gif with transparency": (rgba.convert("P"), "GIF", {"transparency": 3}),
        "png rgba": (rgba, "PNG", {}),
        "png la": (rgba.convert("LA"), "PNG", {}),
        "png palette trns": (rgba.convert("P"), "PNG", {"transparency": 5}),
        "png 1-bit": (rgba.convert("1"), "PNG", {}),
        "jpeg grey": (rgba.convert("L"), "JPEG", {}),
        "jpeg cmyk": (rgb.convert("CMYK"), "JPEG", {}),
    }
    out = {}
    for name, (image, fmt, options) in cases.items():
        buf = io.BytesIO()
        image.save(buf, fmt, **options)
        out[name] = buf.getvalue()
    return out


ENCODED_WITH_MODES = _encoded_with_modes()


@pytest.mark.parametrize("resample", ["aten_u8", "pil"])
@pytest.mark.parametrize("name", list(ENCODED_WITH_MODES))
def test_every_mode_is_processed_as_its_rgb_conversion(name, resample):
    # docs/behaviour.md: convert("RGB"), alpha dropped, never composited. Pillow decodes some of these
    # into RGBA storage, which pillow-simd would resize premultiplied by alpha.
    data = ENCODED_WITH_MODES[name]
    png = io.BytesIO()
    Image.open(io.BytesIO(data)).convert("RGB").save(png, "PNG")
    spec = {**named_spec("qwen2_vl"), "max_pixels": 1003520, "resample": resample}
    got, grid = preprocess(data, spec)
    expected, expected_grid = preprocess(png.getvalue(), spec)
    assert grid == expected_grid == (1, 12, 16)  # 157 x 233 -> 168 x 224: resized both ways
    np.testing.assert_array_equal(got, expected)


# --- M-RoPE --------------------------------------------------------------------------------------


def test_tv_m1():
    pos, delta = mrope_image_only(11, [(3, 8, (1, 4, 6))], 2)
    assert pos.tolist() == [[0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7], [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
                            [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]]  # fmt: skip
    assert delta == -3 and pos.dtype == np.int64


def test_mrope_errors():
    with pytest.raises(MmError, match=r"^mrope: item range \(3,11\) out of order/bounds$"):
        mrope_image_only(11, [(3, 11, (1, 4, 6))], 2)
    with pytest.raises(MmError, match=r"^mrope: item range \(2,3\) out of order/bounds$"):
        mrope_image_only(20, [(5, 10, (1, 4, 6)), (2, 3, (1, 2, 2))], 2)
    with pytest.raises(MmError, match=r"^mrope: token span does not match grid$"):
        mrope_image_only(11, [(3, 7, (1, 4, 6))], 2)
    assert mrope_image_only(0, [], 2)[1] == -1


def get_rope_index_reference(input_ids, grids, merge, image_token_id):
    """The image branch of HF/SGLang get_rope_index, written as they write it (search, then append)."""
    tokens = list(input_ids)
    parts, st_ = [], 0
    for t, h, w in grids:
        ed = tokens.index(image_token_id, st_)
        lt, lh, lw = t, h // merge, w // merge
        st_idx = parts[-1].max() + 1 if parts else 0
        text_len = ed - st_
        parts.append(np.tile(np.arange(text_len), (3, 1)) + st_idx)
        t_index = np.repeat(np.arange(lt), lh * lw)
        h_index = np.tile(np.repeat(np.arange(lh), lw), lt)
        w_index = np.tile(np.arange(lw), lt * lh)
        parts.append(np.stack([t_index, h_index, w_index]) + text_len + st_idx)
        st_ = ed + lt * lh * lw
    if st_ < len(tokens):
        st_idx = parts[-1].max() + 1 if parts else 0
        parts.append(np.tile(np.arange(len(tokens) - st_), (3, 1)) + st_idx)
    pos = np.concatenate(parts, axis=1)
    return pos, int(pos.max()) + 1 - len(tokens)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=3),
       st.integers(0, 5), st.sampled_from([1, 2]))  # fmt: skip
def test_mrope_equals_get_rope_index(images, tail, merge):
    P = 151655
    ids, items = [], []
    for lead, gh, gw in images:
        ids.extend([7] * lead + [151652])  # text, then <|vision_start|>
        n = gh * gw
        items.append((len(ids), len(ids) + n - 1, (1, gh * merge, gw * merge)))
        ids.extend([P] * n + [151653])  # image pads, <|vision_end|>
    ids.extend([8] * tail)
    ours, delta = mrope_image_only(len(ids), items, merge)
    ref, ref_delta = get_rope_index_reference(ids, [g for _, _, g in items], merge, P)
    np.testing.assert_array_equal(ours, ref)
    assert delta == ref_delta


def test_mrope_parity_with_rust_extension(rust_ext):
    items = [(3, 8, (1, 4, 6)), (10, 13, (1, 4, 4))]
    flat, delta = rust_ext.qwen_vl.mrope_image_only_py(20, [(s, e, *g) for s, e, g in items], 2)
    ours, our_delta = mrope_image_only(20, items, 2)
    np.testing.assert_array_equal(ours.reshape(-1), np.asarray(flat))
    assert our_delta == delta
