"""mmworker's output through SGLang 0.5.23's own scheduler-side code (a real client, CPU only).

    bash scripts/setup_sglang.sh && .venv/bin/python -m pytest tests/test_sglang_client.py

A real WorkerPool processes prompts with 1, 2 and 3 photo-like images; each reply's `to_sglang` dict
is written as .npy files plus a JSON manifest (no pickle) and handed to tests/sglang_client_check.py,
which runs in a separate interpreter with SGLang installed (its dependencies pull plain Pillow, so it
cannot share mmworker's venv). There SGLang builds `MultimodalDataItem`s, the processor output and
`MultimodalInputs` (setting pad values from our hashes), pads the ids with its Qwen2-VL padding
pattern and computes M-RoPE with `MRotaryEmbedding.get_rope_index`; this test asserts that all of it
agrees with what the pool handed over.

Skipped unless an interpreter with sglang 0.5.23 is found: $MMWORKER_SGLANG_PYTHON, or
.venv-sglang/bin/python (built by scripts/setup_sglang.sh).
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mmworker import WorkerPool, to_sglang
from mmworker.corpus import encode, photo_like

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tests" / "sglang_client_check.py"
SGLANG_VERSION = "0.5.23"

IMG, VSTART, VEND = 151655, 151652, 151653


def _image(width, height, fmt, seed):
    return encode(photo_like(width, height, seed=seed), fmt)


def _prompt(n_images):
    ids = [100]
    for k in range(n_images):
        ids += [VSTART, IMG, VEND, 101 + k]
    return ids


@pytest.fixture(scope="session")
def sglang_python():
    """The interpreter with SGLang, checked once per session."""
    python = os.environ.get("MMWORKER_SGLANG_PYTHON") or str(ROOT / ".venv-sglang" / "bin" / "python")
    if not Path(python).exists():
        pytest.skip(f"no SGLang client interpreter at {python} (bash scripts/setup_sglang.sh)")
    probe = subprocess.run(
        [python, "-c", f"import sglang; assert sglang.__version__ == {SGLANG_VERSION!r}, sglang.__version__"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        pytest.skip(f"{python} has no sglang {SGLANG_VERSION}: {probe.stderr.strip().splitlines()[-1:]}")
    return python


def _encode(value, root: Path, stem: str):
    """to_sglang dict -> JSON-able manifest entry; arrays go to .npy files, tuples are tagged."""
    if isinstance(value, np.ndarray):
        rel = f"{stem}.npy"
        np.save(root / rel, value, allow_pickle=False)
        return {"__npy__": rel}
    if isinstance(value, dict):
        assert all(isinstance(k, str) for k in value), value.keys()
        return {k: _encode(v, root, f"{stem}.{k}") for k, v in value.items()}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, root, f"{stem}.{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, root, f"{stem}.{i}") for i, v in enumerate(value)]
    assert value is None or type(value) in (int, float, str, bool), (stem, type(value))
    return value


CASES = {
    # name: [(width, height, format, seed), ...]
    "one_image": [(640, 480, "JPEG", 11)],
    "two_images": [(300, 301, "PNG", 12), (1024, 683, "JPEG", 13)],
    "three_images": [(1024, 683, "JPEG", 13), (640, 480, "JPEG", 11), (300, 301, "PNG", 12)],
}


@pytest.fixture(scope="module")
def sglang_results(sglang_python, tmp_path_factory):
    """Run every case through the pool, hand the dicts to the check script, return (ours, results)."""
    root = tmp_path_factory.mktemp("sglang_client")
    manifest, ours = {"cases": []}, {}
    with WorkerPool("qwen2_vl", {"workers": 1, "ring_mib": 128}) as pool:
        for name, images in CASES.items():
            prompt = _prompt(len(images))
            with pool.process(prompt, [_image(*spec) for spec in images]) as reply:
                assert reply.ok, f"{name}: pool rejected the request: {reply.error}"
                out = to_sglang(reply)
                manifest["cases"].append({"name": name, "prompt": prompt, "to_sglang": _encode(out, root, name)})
                ours[name] = {
                    "hashes": [item["hash"] for item in out["mm_items"]],
                    "offsets": [item["offsets"] for item in out["mm_items"]],
                    "grids": [item["model_specific_data"]["image_grid_thw"].tolist() for item in out["mm_items"]],
                    "length": len(out["input_ids"]),
                    "delta": int(out["mrope_position_delta"][0, 0]),
                }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_MM_SKIP_COMPUTE_HASH", "SGLANG_MM_BUFFER_SIZE_MB")}
    env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [sglang_python, str(CHECK), str(root)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    print(proc.stdout)
    assert proc.returncode == 0, (
        f"sglang_client_check.py exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-6000:]}"
    )
    results = json.loads((root / "results.json").read_text())
    assert results["sglang"] == SGLANG_VERSION
    return ours, results["cases"]


@pytest.fixture(params=list(CASES), ids=list(CASES))
def case(request, sglang_results):
    ours, results = sglang_results
    name = request.param
    return name, ours[name], results[name]


def test_sglang_constructs_everything(case):
    name, ours, res = case
    assert res["constructed"], f"{name}: {res.get('error')}\n{res.get('traceback')}"
    assert res["items_kept"] == len(ours["hashes"]), f"{name}: SGLang dropped items"
    assert res["token_modalities_ok"], f"{name}: SGLang's offset validation disagrees"
    contract = res["contract"]
    assert contract["hash_types"] == ["int"] * len(ours["hashes"])
    assert contract["offsets_in_range"] and contract["spans_are_image_tokens"] and contract["image_tokens_all_in_spans"]
    assert all(contract["rows_match_grid"]) and all(contract["tokens_match_grid"]), contract
    assert contract["feature_dtypes"] == ["float32"] * len(ours["hashes"])
    assert contract["positions_shape_ok"]
    for item, grid, offsets in zip(res["items"], ours["grids"], ours["offsets"], strict=True):
        assert item["modality"] == "IMAGE"
        assert item["image_grid_thw"] == grid
        assert [tuple(o) for o in item["offsets"]] == [tuple(o) for o in offsets]
        assert item["feature_is_zero_copy_view"], f"{name}: the feature was copied on the way into SGLang"


def test_mrope_matches_sglang_get_rope_index(case):
    name, ours, res = case
    mrope = res["mrope"]
    assert mrope["sglang_shape"] == [3, ours["length"]] and mrope["sglang_dtype"] == "int64", mrope
    assert mrope["positions_equal"], f"{name}: M-RoPE positions differ from SGLang's get_rope_index: {mrope}"
    assert mrope["delta_equal"], f"{name}: delta differs: SGLang {mrope['sglang_delta']}, ours {mrope['our_delta']}"
    assert mrope["held_by_sglang_as_tensor"] and mrope["held_is_zero_copy_view"], mrope
    assert mrope["held_delta"] == [[ours["delta"]]], mrope


def test_pad_values_come_from_our_hash(case):
    name, ours, res = case
    shown = []
    for item, our_hash in zip(res["items"], ours["hashes"], strict=True):
        assert item["our_hash"] == our_hash and item["sglang_hash"] == our_hash, item
        assert item["pad_values_match_our_hash"], f"{name}: pad values not derived from our hash: {item}"
        assert len(item["pad_values"]) == 4 and item["pad_value"] == item["pad_values"][0], item
        shown.append(f"hash {our_hash:#018x} -> pad_values {item['pad_values']}")
    distinct = {tuple(item["pad_values"]) for item in res["items"]}
    assert len(distinct) == len(res["items"]), f"{name}: two different images got the same pad values"
    print(f"{name}:\n  " + "\n  ".join(shown))


def test_padded_ids_are_sglangs(case):
    """The scheduler's own padding replaces exactly our offset spans, each with its pad values in turn."""
    name, _ours, res = case
    pad = res["scheduler_padding"]
    hint = ""
    if "scheduler_padding_if_im_token_id_supplied" in res:
        hint = (
            f"\nSGLang saw token ids {res['sglang_token_ids']}: the dict from to_sglang carries no im_token_id "
            f"(keys {res['dict_keys']}), and SGLang's pad_mm_tokens skips a modality whose token id is None. "
            f"With im_token_id=151655 supplied the padding would be: "
            f"{res['scheduler_padding_if_im_token_id_supplied']}"
        )
    assert pad["equals_expected"] and pad["changed_exactly_on_spans"], (
        f"{name}: SGLang's scheduler padding (duplicate_pad_mm_input_ids + "
        f"MultiModalityDataPaddingPatternMultimodalTokens) does not replace exactly our offset spans: {pad}{hint}"
    )
    prebuilt = res["build_padded_input_ids"]
    assert prebuilt is not None and prebuilt["equals_expected"], f"{name}: build_padded_input_ids: {prebuilt}"
