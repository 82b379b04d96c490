"""bfloat16 features against torch itself, and the plug-in handing them to SGLang as torch.bfloat16.

tests/test_bf16.py holds the bf16 features to `bf16_bits` of the float32 ones; here the reference is
torch's own `.to(torch.bfloat16)`, on the golden images under all four bundled specs and both
modes (pil under the installed stock Pillow), and on floats whose rounding is hardest.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from plugin_env import builtin_class, encoded, hf_config, hf_processor, plugin_class, prompt, run, server_args
from test_plugin_parity import assert_same

from mmworker import MmError
from mmworker.common.stream import stream_out
from mmworker.qwen_vl import NAMED_SPECS, preprocess
from mmworker.registry import named_spec

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "qwen"
IMAGES = sorted({case["image"] for case in json.loads((GOLDEN / "qwen_cases.json").read_text())["cases"]})


def torch_bf16_bits(f32: np.ndarray) -> np.ndarray:
    """`torch.from_numpy(f32).to(torch.bfloat16)`'s bits, as uint16."""
    return torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("mode", ["aten_u8", "pil"])
@pytest.mark.parametrize("name", list(NAMED_SPECS))
def test_golden_images_equal_torchs_rounding(name, mode):
    spec = {**named_spec(name), "resample": mode}
    checked = 0
    for image in IMAGES:
        data = (GOLDEN / "inputs" / image).read_bytes()
        try:
            f32, grid = preprocess(data, spec)
        except MmError:
            continue
        bf16, grid16 = preprocess(data, {**spec, "feature_dtype": "bfloat16"})
        assert grid16 == grid and bf16.dtype == np.uint16
        np.testing.assert_array_equal(bf16, torch_bf16_bits(f32))
        checked += 1
    assert checked >= 20


def test_hardest_roundings_equal_torchs():
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32) & np.uint32(0x7F7FFFFF)  # finite
    ties = np.array([0x8000, 0x7FFF, 0x8001, 0x0000, 0xFFFF], np.uint32)
    bits = (bits & np.uint32(0xFFFF0000)) | rng.choice(ties, bits.size)
    bits |= rng.choice(np.array([0, 0x80000000], np.uint32), bits.size)
    stage = bits.view(np.float32)
    out = np.zeros(stage.size, np.uint16)
    stream_out(out, 0, stage, stage.size, out.ctypes.data)
    np.testing.assert_array_equal(out, torch_bf16_bits(stage))


MODEL = "qwen2_5_vl"


def plugin_with(monkeypatch, tmp_path, toml: str):
    config = tmp_path / "pool.toml"
    config.write_text(toml)
    monkeypatch.setenv("MMWORKER_SGLANG_CONFIG", str(config))
    args = server_args()  # published before SGLang looks the class up
    return plugin_class(MODEL)(hf_config(MODEL), args, hf_processor(MODEL, "torchvision"), "default")


def test_plugin_hands_bf16_features_when_the_operator_opts_in(monkeypatch, tmp_path):
    args = server_args()
    builtin = builtin_class(MODEL)(hf_config(MODEL), args, hf_processor(MODEL, "torchvision"), "default")
    plugin = plugin_with(monkeypatch, tmp_path, 'feature_dtype = "bfloat16"\nring_mib = 96\n')
    try:
        assert plugin.plan.spec["feature_dtype"] == "bfloat16" and "bfloat16 features" in plugin.plan.describe()
        assert plugin.plan.pool_config["ring_mib"] == 96 and "feature_dtype" not in plugin.plan.pool_config
        images = [encoded(640, 480, "JPEG", 1), encoded(333, 201, "PNG", 2)]
        ours, theirs = run(plugin, images, prompt(2)), run(builtin, images, prompt(2))
        assert plugin.stats()["served"] == 1
        for a, b in zip(ours.mm_items, theirs.mm_items, strict=True):
            assert a.feature.dtype == torch.bfloat16 and b.feature.dtype == torch.float32
            assert a.feature.shape == b.feature.shape
            assert torch.equal(a.feature.view(torch.int16), b.feature.to(torch.bfloat16).view(torch.int16))
            a.feature = b.feature  # everything but the feature's dtype is SGLang's own output
        assert_same(ours, theirs)
    finally:
        plugin.shutdown()
        builtin.shutdown()


def test_plugin_default_is_float32_and_a_bad_dtype_stops_the_start(monkeypatch, tmp_path):
    plugin = plugin_with(monkeypatch, tmp_path, "ring_mib = 64\n")
    try:
        assert plugin.plan.spec["feature_dtype"] == "float32"
        out = run(plugin, [encoded(64, 48, "PNG", 3)], prompt(1))
        assert out.mm_items[0].feature.dtype == torch.float32
    finally:
        plugin.shutdown()
    with pytest.raises(MmError, match=r"MMWORKER_SGLANG_CONFIG=.*`feature_dtype` must be one of 'float32', 'bfloat16'"):
        plugin_with(monkeypatch, tmp_path, 'feature_dtype = "float16"\n')
