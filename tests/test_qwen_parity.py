"""qwen_vl.preprocess against Hugging Face at zero tolerance, on golden fixtures (tests/golden/qwen).

Each mode is held to its own HF class: `aten_u8` to the torchvision Qwen2VLImageProcessor and `pil`
to Qwen2VLImageProcessorPil on stock Pillow 12.3, for PNG and JPEG alike, across five configs. Two
kinds of case have the crate, not HF, as their target (both recorded in the fixture from the Rust
extension): images so thin that transformers' own smart_resize differs from SGLang's
(behaviour.md §7.2 item 7), and very tall images for which Pillow 12.3 (not 12.1 or the crate)
runs the vertical pass first.
"""

import hashlib
import json

import numpy as np
import pytest
from conftest import GOLDEN

from mmworker import MmError
from mmworker.inkling import decode_patchify
from mmworker.qwen_vl import preprocess

QWEN = json.loads((GOLDEN / "qwen" / "qwen_cases.json").read_text())
INKLING = json.loads((GOLDEN / "qwen" / "inkling_cases.json").read_text())
INPUTS = GOLDEN / "qwen" / "inputs"


def target_of(case: dict) -> tuple[str, dict]:
    if case["hf_grid_matches_crate"] and not case["pillow_tall_vertical_first"]:
        return "hf", case["hf"]
    return "crate", case["rust"]


@pytest.mark.parametrize("case", QWEN["cases"], ids=lambda c: c["name"])
def test_preprocess_equals_reference(case):
    spec = {**QWEN["configs"][case["config"]], "resample": case["mode"]}
    data = (INPUTS / case["image"]).read_bytes()
    source, expected = target_of(case)
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


@pytest.mark.parametrize("case", INKLING["cases"], ids=lambda c: c["name"])
def test_inkling_bits_equal_reference(case):
    data = (INPUTS / case["png"]).read_bytes()
    h, w, bits = decode_patchify(data, case["patch_size"], case["rescale_frac"], case["rescale_cap"])
    assert (h, w) == (case["out_h"], case["out_w"])
    assert hashlib.sha256(bits.astype("<u2").tobytes()).hexdigest() == case["bits_sha256"]
    if case["bits_in_npz"]:
        with np.load(GOLDEN / "qwen" / "inkling_bits.npz") as npz:
            np.testing.assert_array_equal(bits, npz[case["name"]])
