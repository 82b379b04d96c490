"""qwen_vl.preprocess against Hugging Face at zero tolerance, on golden fixtures (tests/golden/qwen).

Each mode is held to its own HF class: `aten_u8` to the torchvision Qwen2VLImageProcessor and `pil`
to Qwen2VLImageProcessorPil on stock Pillow 12.3 (the fixture's), for PNG and JPEG alike, across
five configs. Images so thin that transformers' own smart_resize differs from SGLang's
(docs/behaviour.md §7.2 item 7) have the crate, not HF, as their target (recorded in the fixture from
the Rust extension). Very tall images are resized vertically first by Pillow 12.3, not by 12.1
or the crate: a spec naming Pillow 12.3.0 equals HF there, one naming 12.1.1 (what `pil` means
under pillow-simd) the crate. Where the installed PIL is stock Pillow, a spec that names none
follows the installed one, and every `pil` case is checked against that Pillow's own resize too.
"""

import hashlib
import json

import numpy as np
import PIL
import pytest
from conftest import GOLDEN
from PIL import Image
from qwen_reference import hf_patchify, reference_table

from mmworker import MmError
from mmworker.common import image_decode_rgb
from mmworker.common.pillow import IS_PILLOW_SIMD
from mmworker.inkling import decode_patchify
from mmworker.qwen_vl import as_spec, preprocess

QWEN = json.loads((GOLDEN / "qwen" / "qwen_cases.json").read_text())
INKLING = json.loads((GOLDEN / "qwen" / "inkling_cases.json").read_text())
INPUTS = GOLDEN / "qwen" / "inputs"


def target_of(case: dict, pillow: str | None = None) -> tuple[str, dict]:
    """The reference a case is held to; for `pil`, under the stock Pillow version `pillow` names."""
    tall_differs = case["pillow_tall_vertical_first"] and pillow != "12.3.0"
    if case["hf_grid_matches_crate"] and not tall_differs:
        return "hf", case["hf"]
    return "crate", case["rust"]


def spec_of(case: dict, pillow: str | None = None) -> dict:
    return {**QWEN["configs"][case["config"]], "resample": case["mode"], **({"pillow": pillow} if pillow else {})}


def cases_with_pillow():
    # aten_u8 has one order; pil as the crate and pillow-simd run it (12.1.1) and as the fixture's Pillow (12.3.0).
    for case in QWEN["cases"]:
        for pillow in ("12.1.1", "12.3.0") if case["mode"] == "pil" else (None,):
            yield pytest.param(case, pillow, id=f"{case['name']}/{pillow}" if pillow else case["name"])


@pytest.mark.parametrize(("case", "pillow"), list(cases_with_pillow()))
def test_preprocess_equals_reference(case, pillow):
    check_against_target(case, spec_of(case, pillow), *target_of(case, pillow))


@pytest.mark.parametrize("case", [c for c in QWEN["cases"] if c["mode"] == "pil"], ids=lambda c: c["name"])
def test_a_spec_naming_no_pillow_follows_the_installed_pil(case):
    spec = spec_of(case)
    assert as_spec(spec).pillow == ("12.1.1" if IS_PILLOW_SIMD else PIL.__version__)
    if IS_PILLOW_SIMD or PIL.__version__.startswith(("12.1.", "12.3.")):
        check_against_target(case, spec, *target_of(case, "12.1.1" if IS_PILLOW_SIMD else "12.3.0"))


@pytest.mark.skipif(
    IS_PILLOW_SIMD, reason="compares with the installed Pillow's resize, and the installed PIL is pillow-simd"
)
@pytest.mark.parametrize("case", [c for c in QWEN["cases"] if c["mode"] == "pil"], ids=lambda c: c["name"])
def test_pil_mode_equals_the_installed_pillows_resize(case):
    # What HF's Qwen2VLImageProcessorPil computes beside this Pillow: its BICUBIC resize of the decoded
    # image, then HF's normalisation and patch order (plain numpy), at the grid SGLang's smart_resize gives.
    spec = as_spec(spec_of(case))
    data = (INPUTS / case["image"]).read_bytes()
    if "error" in case["rust"]:
        with pytest.raises(MmError, match=f"^{case['rust']['error']}$"):
            preprocess(data, spec)
        return
    pixel_values, (_, gh, gw) = preprocess(data, spec)
    size = (gw * spec.patch_size, gh * spec.patch_size)
    resized = np.asarray(Image.fromarray(image_decode_rgb(data)[2]).resize(size, Image.Resampling.BICUBIC))
    table = reference_table(spec.image_mean, spec.image_std, "pil")
    expected = hf_patchify(resized, table, spec.patch_size, spec.merge_size, spec.temporal_patch_size)
    np.testing.assert_array_equal(pixel_values.view(np.uint32), expected.view(np.uint32))


def check_against_target(case: dict, spec: dict, source: str, expected: dict) -> None:
    data = (INPUTS / case["image"]).read_bytes()
    if "error" in expected:
        with pytest.raises(MmError, match=f"^{case['rust']['error']}$"):
            preprocess(data, spec)
        return
    pixel_values, grid = preprocess(data, spec)
    assert list(grid) == expected["grid_thw"] == case["crate_formula"]["grid_thw"]
    assert list(pixel_values.shape) == expected["shape"] and pixel_values.dtype == np.float32
    digest = hashlib.sha256(np.ascontiguousarray(pixel_values).astype("<f4").tobytes()).hexdigest()
    assert digest == expected["sha256"], f"differs from {source}"


def test_tv_q4_hf_defaults_1024x768():
    case = next(c for c in QWEN["cases"] if c["config"] == "qwen2_vl_hf_default" and "w1024_h768" in c["image"])
    pixel_values, grid = preprocess((INPUTS / case["image"]).read_bytes(), QWEN["configs"]["qwen2_vl_hf_default"])
    assert pixel_values.shape == (3996, 1176) and grid == (1, 54, 74)


def test_fixture_covers_what_the_issue_asks():
    cases = QWEN["cases"]
    assert {c["config"] for c in cases} >= {"qwen2_vl", "qwen3_vl", "qwen3_5", "qwen2_5_vl_fixture"}
    assert {c["format"] for c in cases} == {"PNG", "JPEG"} and {c["mode"] for c in cases} == {
        "aten_u8",
        "pil",
    }
    sizes = {(c["w"], c["h"]) for c in cases}
    assert {(50, 40), (300, 301), (1, 1), (10, 10)} <= sizes  # odd and lifted-by-the-clamp sizes
    assert {(28, 5572), (28, 5600), (2814, 14)} <= sizes  # aspect 199, 200, 201
    assert sum(target_of(c)[0] == "hf" for c in cases) >= 200
    # Pillow 12.3 resizes these vertically first: the 5 whose grid is HF's equal HF under a spec naming 12.3.0.
    assert sum(c["pillow_tall_vertical_first"] for c in cases) == 8


@pytest.mark.parametrize("case", INKLING["cases"], ids=lambda c: c["name"])
def test_inkling_bits_equal_reference(case):
    data = (INPUTS / case["png"]).read_bytes()
    h, w, bits = decode_patchify(data, case["patch_size"], case["rescale_frac"], case["rescale_cap"])
    assert (h, w) == (case["out_h"], case["out_w"])
    assert hashlib.sha256(bits.astype("<u2").tobytes()).hexdigest() == case["bits_sha256"]
    if case["bits_in_npz"]:
        with np.load(GOLDEN / "qwen" / "inkling_bits.npz") as npz:
            np.testing.assert_array_equal(bits, npz[case["name"]])
