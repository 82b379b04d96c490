"""bfloat16 features (spec `feature_dtype`): every way an image is resized gives the float32 feature rounded to bf16.

The float32 features are held to Hugging Face by test_qwen_parity.py; here the bf16 ones are held to
those, rounded to nearest even (`bf16_bits`, torch's rounding: tests/sglang_env/test_bf16_torch.py
checks it against torch itself), bit for bit, on the golden images under all four bundled specs and
both resample modes, on odd sizes, on large streamed JPEGs, on the vertical-first path, and through
a pool: the reply's feature is uint16 of half the bytes and `to_sglang` hands it on as is.
"""

import json

import numpy as np
import pytest
from conftest import GOLDEN

from mmworker import MmError, WorkerPool, to_sglang
from mmworker.common.resize import vertical_coefficients
from mmworker.corpus import encode, photo_like
from mmworker.inkling.patches import bf16_bits
from mmworker.qwen_vl import NAMED_SPECS, QwenSpec, QwenVL, as_spec, preprocess
from mmworker.qwen_vl import family as family_module
from mmworker.qwen_vl.patchify import normalisation, patchify_into
from mmworker.registry import named_spec

QWEN = json.loads((GOLDEN / "qwen" / "qwen_cases.json").read_text())
INPUTS = GOLDEN / "qwen" / "inputs"
IMAGES = sorted({case["image"] for case in QWEN["cases"]})
# pil under the Pillow that runs the horizontal pass first (12.1.1) and under one that runs the
# vertical pass first for shrinking heights (13.0.0: the vertical-first path of mmworker.qwen_vl.family).
MODES = [("aten_u8", None), ("pil", "12.1.1"), ("pil", "13.0.0")]


def both(data: bytes, spec: dict) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(float32 feature, bf16 feature, grid) of one image under `spec`, checking the two agree on all but the values."""
    f32, grid = preprocess(data, {**spec, "feature_dtype": "float32"})
    bf16, grid16 = preprocess(data, {**spec, "feature_dtype": "bfloat16"})
    assert grid16 == grid and bf16.dtype == np.uint16 and f32.dtype == np.float32
    assert bf16.shape == f32.shape and bf16.nbytes * 2 == f32.nbytes and bf16.flags.c_contiguous
    return f32, bf16, grid


def assert_rounded(f32: np.ndarray, bf16: np.ndarray) -> None:
    assert np.isfinite(f32).all()  # what the kernel's rounding relies on (mmworker.qwen_vl.patchify)
    np.testing.assert_array_equal(bf16, bf16_bits(f32))


def spec_with(name: str, mode: str, pillow: str | None) -> dict:
    return {**named_spec(name), "resample": mode, **({"pillow": pillow} if pillow else {})}


@pytest.mark.parametrize(("mode", "pillow"), MODES, ids=[f"{m}-{p}" for m, p in MODES])
@pytest.mark.parametrize("name", list(NAMED_SPECS))
def test_golden_images_bf16_is_float32_rounded(name, mode, pillow):
    spec = spec_with(name, mode, pillow)
    checked = 0
    for image in IMAGES:
        data = (INPUTS / image).read_bytes()
        try:
            f32, _ = preprocess(data, spec)
        except MmError as exc:  # the same refusal, word for word, whatever the dtype
            with pytest.raises(MmError) as raised:
                preprocess(data, {**spec, "feature_dtype": "bfloat16"})
            assert str(raised.value) == str(exc)
            continue
        f32, bf16, _ = both(data, spec)
        assert_rounded(f32, bf16)
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize("config", sorted(QWEN["configs"]))
def test_golden_configs_bf16_is_float32_rounded(config):
    # The fixture's own configs (HF's default pixel budget, the 2.5-VL fixture's mean and std) on its cases.
    for case in QWEN["cases"]:
        if case["config"] != config or "error" in case["rust"]:
            continue
        spec = {**QWEN["configs"][config], "resample": case["mode"]}
        assert_rounded(*both((INPUTS / case["image"]).read_bytes(), spec)[:2])


@pytest.mark.parametrize(("mode", "pillow"), MODES, ids=[f"{m}-{p}" for m, p in MODES])
@pytest.mark.parametrize("name", ["qwen2_vl", "qwen3_5"])
@pytest.mark.parametrize(("w", "h", "fmt"), [(1, 1, "PNG"), (31, 17, "PNG"), (333, 97, "JPEG"), (97, 1999, "PNG"),
                                             (1001, 37, "JPEG"), (645, 483, "JPEG")])  # fmt: skip
def test_odd_sizes(name, mode, pillow, w, h, fmt):
    spec = spec_with(name, mode, pillow)
    assert_rounded(*both(encode(photo_like(w, h, seed=w * h), fmt), spec)[:2])


class Spy:
    """Counts calls of a family-module function while it still runs."""

    def __init__(self, monkeypatch, name: str) -> None:
        self.calls, real = 0, getattr(family_module, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(family_module, name, counted)


@pytest.mark.parametrize("mode", ["aten_u8", "pil"])
@pytest.mark.parametrize(
    ("w", "h", "name"), [(4032, 3024, "qwen2_vl"), (3000, 4000, "qwen3_vl"), (2999, 2001, "qwen3_5")]
)
def test_large_jpegs_are_streamed_and_rounded(monkeypatch, mode, w, h, name):
    spy = Spy(monkeypatch, "horizontal_rows")
    spec = {**spec_with(name, mode, "12.1.1"), "max_pixels": 1003520}
    data = encode(photo_like(w, h, seed=7), "JPEG")
    f32, bf16, _ = both(data, spec)
    assert spy.calls == 2  # both dtypes took the streamed path (PatchifyRows as rows decode)
    assert_rounded(f32, bf16)


def test_vertical_first_path_is_rounded(monkeypatch):
    spy = Spy(monkeypatch, "vertical_resize")
    spec = {**spec_with("qwen2_vl", "pil", "13.0.0"), "max_pixels": 1003520}
    data = encode(photo_like(400, 3000, seed=9), "JPEG")  # the height shrinks by more than twice the width
    f32, bf16, _ = both(data, spec)
    assert spy.calls == 2
    assert_rounded(f32, bf16)


@pytest.mark.parametrize("shift", [0, 2, 62])  # bytes past a line: the aligned fast path and the staged one
@pytest.mark.parametrize("patch", [14, 16, 3])  # 3: no line shuffle for it, always staged
def test_patchify_into_any_alignment(shift, patch):
    merge, temporal = 2, 2
    rng = np.random.default_rng(patch + shift)
    pixels = rng.integers(0, 256, (5 * patch * merge, 3 * patch * merge, 4), np.uint8)
    vertical = vertical_coefficients(pixels.shape[0], 2 * patch * merge, "aten_u8")
    norm = normalisation((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711), "aten_u8")
    shape = ((2 * merge) * (3 * merge), 3 * temporal * patch * patch)
    f32 = np.empty(shape, np.float32)
    patchify_into(pixels, vertical, norm, patch, merge, temporal, f32)
    raw = np.full(f32.nbytes // 2 + 128, 0xAB, np.uint8)
    start = -raw.ctypes.data % 64 + shift
    out = raw[start : start + f32.nbytes // 2].view(np.uint16).reshape(shape)
    patchify_into(pixels, vertical, norm, patch, merge, temporal, out)
    assert_rounded(f32, out)
    assert (raw[:start] == 0xAB).all() and (raw[start + out.nbytes :] == 0xAB).all()  # nothing written outside


def test_spec_key():
    assert as_spec("qwen2_vl").feature_dtype == "float32"  # the default: HF's pixel_values
    spec = as_spec({**named_spec("qwen3_vl"), "feature_dtype": "bfloat16"})
    assert spec.feature_storage == np.uint16 and spec.to_mapping()["feature_dtype"] == "bfloat16"
    assert QwenSpec.from_mapping(spec.to_mapping()) == spec
    assert as_spec("qwen3_vl").to_mapping()["feature_dtype"] == "float32"
    assert "bfloat16 features" in QwenVL(spec).describe()
    for bad in ("float16", "bf16", 16, None, ["bfloat16"]):
        with pytest.raises(MmError, match=r"^qwen_vl spec: `feature_dtype` must be one of 'float32', 'bfloat16', got"):
            as_spec({**named_spec("qwen2_vl"), "feature_dtype": bad})


def test_pool_reply_is_bf16_bits_in_half_the_bytes():
    spec = {**named_spec("qwen2_vl"), "max_pixels": 1003520}
    data = [encode(photo_like(640, 480, seed=2), "JPEG"), encode(photo_like(4032, 3024, seed=3), "JPEG")]
    prompt = [1, 151652, 151655, 151653, 2, 151652, 151655, 151653]
    features = {}
    for dtype in ("float32", "bfloat16"):
        # No cache: the features are in the ring, which reply.nbytes counts (test_cache covers bf16 hits).
        with WorkerPool({**spec, "feature_dtype": dtype}, {"workers": 1, "cache_mib": 0, "ring_mib": 128}) as pool:
            reply = pool.process(prompt, data, timeout=120)
            assert reply.ok, reply.error
            out = to_sglang(reply)
            for item, handed in zip(reply.items, out["mm_items"], strict=True):
                assert handed["feature"] is item.feature  # the ring's view, as is: no copy, no cast
            features[dtype] = [np.array(f) for f in reply.features]
            ids, positions, nbytes = reply.input_ids.copy(), reply.positions.copy(), reply.nbytes
            grids = [item["model_specific_data"]["image_grid_thw"].tolist() for item in out["mm_items"]]
            features[dtype + " rest"] = (ids.tolist(), positions.tolist(), grids, reply.hashes)
            features[dtype + " bytes"] = nbytes
            reply.release()
    assert features["float32 rest"] == features["bfloat16 rest"]  # ids, M-RoPE, grids, hashes: the same
    for f32, bf16 in zip(features["float32"], features["bfloat16"], strict=True):
        assert bf16.dtype == np.uint16 and bf16.nbytes * 2 == f32.nbytes
        assert_rounded(f32, bf16)
    feature_bytes = {dtype: sum(f.nbytes for f in features[dtype]) for dtype in ("float32", "bfloat16")}
    saved = features["float32 bytes"] - features["bfloat16 bytes"]
    assert saved == feature_bytes["float32"] // 2  # the reply holds half the feature bytes, the rest alike
