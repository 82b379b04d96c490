"""Feed mmworker's `to_sglang` output through SGLang 0.5.23's own scheduler-side code.

    .venv-sglang/bin/python tests/sglang_client_check.py DIR

Runs in the SGLang client venv (scripts/setup_sglang.sh), never in mmworker's own venv;
tests/test_sglang_client.py writes DIR and reads the results. DIR holds `manifest.json` and .npy
files only (no pickle): the manifest encodes each case's `to_sglang` dict, with every numpy array
replaced by {"__npy__": relative path} and every tuple by {"__tuple__": [...]}, so the dict is
rebuilt exactly as `to_sglang` returned it (same keys, same Python types, same dtypes and shapes).

Per case, what SGLang's scheduler does with such a dict:
  1. the scheduler-side shim: numpy -> torch with `torch.from_numpy` (zero-copy) where SGLang
     computes on tensors (feature, image_grid_thw, mrope_positions, mrope_position_delta);
  2. `MultimodalDataItem.from_dict` per item, `MultimodalProcessorOutput.from_dict`,
     `MultimodalInputs.from_processor_output` (which calls `set_pad_value` on every item), with
     `hash_feature` patched to raise: the scheduler must reuse our hash, never hash the feature;
  3. padded ids as the scheduler builds them when `padded_input_ids` is absent:
     `duplicate_pad_mm_input_ids(array("q", ids), mm_inputs, <Qwen2-VL pad function>)`, whose pad
     function is `pad_mm_tokens`, i.e. `MultiModalityDataPaddingPatternMultimodalTokens`; and
     `MultimodalProcessorOutput.build_padded_input_ids` (the precomputed-padding route);
  4. M-RoPE with `MRotaryEmbedding.get_rope_index` on the expanded ids, as SGLang's own Qwen
     processor calls it, compared with the positions and delta mmworker handed over.

Writes DIR/results.json ({"cases": {name: result}}) and prints one line per case. Exits 0 when every
case was processed (mismatches are data in the results, for the test to judge); exits 1 with a clear
message when SGLang raised on any case (the traceback is in the results as well), 2 on bad usage.
"""

import json
import os
import sys
import traceback
import warnings
from array import array
from pathlib import Path

import numpy as np

# Same values as the test; qwen2_vl's config.
IMAGE_TOKEN_ID = 151655
VIDEO_TOKEN_ID = 151656
VISION_START_TOKEN_ID = 151652
VISION_END_TOKEN_ID = 151653
SPATIAL_MERGE_SIZE = 2
MODEL_TYPE = "qwen2_vl"


def decode(value, root: Path):
    """Undo the test's encoding: npy references -> arrays, tagged tuples -> tuples."""
    if isinstance(value, dict):
        if set(value) == {"__npy__"}:
            return np.load(root / value["__npy__"], allow_pickle=False)
        if set(value) == {"__tuple__"}:
            return tuple(decode(v, root) for v in value["__tuple__"])
        return {k: decode(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v, root) for v in value]
    return value


def describe(value):
    """Type summary of a (nested) value, to show what SGLang was handed."""
    if isinstance(value, np.ndarray):
        return f"ndarray{list(value.shape)}:{value.dtype}"
    if type(value).__module__ == "torch":
        return f"Tensor{list(value.shape)}:{str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, dict):
        return {k: describe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value] if len(value) <= 8 else f"{type(value).__name__}[{len(value)}]"
    return type(value).__name__


def shim(out: dict):
    """What the scheduler-side adapter does before SGLang sees the dict: torch views, no copies."""
    import torch

    def tensor(a):
        return torch.from_numpy(a) if isinstance(a, np.ndarray) else a

    items = []
    for raw in out["mm_items"]:
        item = dict(raw)
        item["feature"] = tensor(item.get("feature"))
        item["model_specific_data"] = {k: tensor(v) for k, v in (item.get("model_specific_data") or {}).items()}
        items.append(item)
    shimmed = {k: v for k, v in out.items() if k != "mm_items"}
    shimmed["mm_items"] = items
    for key in ("mrope_positions", "mrope_position_delta"):
        if key in shimmed:
            shimmed[key] = tensor(shimmed[key])
    ids = shimmed.get("input_ids")
    if isinstance(ids, np.ndarray):
        shimmed["input_ids"] = ids.tolist()  # MultimodalProcessorOutput.input_ids: List[int]
    return shimmed


def int64_array(ids: np.ndarray) -> array:
    """The scheduler's token buffer type (array('q'), required by assert_int64_array)."""
    buf = array("q")
    buf.frombytes(np.ascontiguousarray(ids, dtype="<i8").tobytes())
    return buf


def span_report(ids: np.ndarray, padded: np.ndarray, spans: list, pads: list) -> dict:
    """Does `padded` differ from `ids` exactly on the spans, each filled with its pad values in turn?"""
    in_span = np.zeros(len(ids), bool)
    expected = ids.copy()
    for (start, end), values in zip(spans, pads, strict=True):
        in_span[start : end + 1] = True
        n = end - start + 1
        expected[start : end + 1] = np.resize(np.asarray(values, np.int64), n)
    changed = padded != ids
    return {
        "length_ok": len(padded) == len(ids),
        "equals_expected": bool(len(padded) == len(ids) and np.array_equal(padded, expected)),
        "changed_exactly_on_spans": bool(len(padded) == len(ids) and np.array_equal(changed, in_span)),
        "changed_positions": int(changed.sum()) if len(padded) == len(ids) else None,
        "span_positions": int(in_span.sum()),
        "unchanged_span_positions": int((in_span & ~changed).sum()) if len(padded) == len(ids) else None,
        "changed_outside_spans": int((changed & ~in_span).sum()) if len(padded) == len(ids) else None,
    }


def first_difference(a, b):
    if a.shape != b.shape:
        return {"shape_sglang": list(a.shape), "shape_ours": list(b.shape)}
    diff = np.argwhere(a != b)
    if not len(diff):
        return None
    idx = tuple(int(i) for i in diff[0])
    return {"index": list(idx), "sglang": int(a[idx]), "ours": int(b[idx]), "count": len(diff)}


def check_case(case: dict, root: Path) -> dict:
    import torch
    from sglang.srt.layers.rotary_embedding import MRotaryEmbedding
    from sglang.srt.managers import mm_utils
    from sglang.srt.managers.mm_utils import MultiModalityDataPaddingPatternMultimodalTokens, duplicate_pad_mm_input_ids
    from sglang.srt.managers.schedule_batch import (
        MultimodalDataItem,
        MultimodalInputs,
        MultimodalProcessorOutput,
        _compute_pad_values,
    )

    out = decode(case["to_sglang"], root)  # exactly the dict to_sglang returned
    ids = np.asarray(out["input_ids"])
    ours_pos = out.get("mrope_positions")
    ours_delta = out.get("mrope_position_delta")
    our_hashes = [item["hash"] for item in out["mm_items"]]
    spans = [tuple(item["offsets"][0]) for item in out["mm_items"]]
    res: dict = {"handed_over": describe(out), "dict_keys": sorted(out)}

    # Contract checks SGLang makes (or its Rust intake does) before hand-off, on our arrays.
    grids = [np.asarray(item["model_specific_data"]["image_grid_thw"]) for item in out["mm_items"]]
    res["contract"] = {
        "hash_types": [type(h).__name__ for h in our_hashes],
        "offsets_in_range": all(0 <= s <= e < len(ids) for s, e in spans),
        "spans_are_image_tokens": all(bool((ids[s : e + 1] == IMAGE_TOKEN_ID).all()) for s, e in spans),
        "image_tokens_all_in_spans": int((ids == IMAGE_TOKEN_ID).sum()) == sum(e - s + 1 for s, e in spans),
        "rows_match_grid": [
            int(np.prod(g)) == item["feature"].shape[0] for g, item in zip(grids, out["mm_items"], strict=True)
        ],
        "tokens_match_grid": [
            int(np.prod(g)) // SPATIAL_MERGE_SIZE**2 == e - s + 1 for g, (s, e) in zip(grids, spans, strict=True)
        ],
        "feature_dtypes": [str(item["feature"].dtype) for item in out["mm_items"]],
        "positions_shape_ok": ours_pos is not None and list(ours_pos.shape) == [3, len(ids)],
    }

    # 1-2. Shim, then SGLang's own construction. The scheduler must not hash: make hashing fatal.
    shimmed = shim(out)
    items = [MultimodalDataItem.from_dict(d) for d in shimmed["mm_items"]]
    po = MultimodalProcessorOutput.from_dict({**shimmed, "mm_items": items})

    def no_hashing(*_args, **_kwargs):
        raise AssertionError("SGLang tried to hash a feature: the item hash was not reused")

    saved = mm_utils.hash_feature
    mm_utils.hash_feature = no_hashing
    try:
        mm_inputs = MultimodalInputs.from_processor_output(po)
    finally:
        mm_utils.hash_feature = saved
    token_modalities = MultimodalProcessorOutput.build_token_modalities(po.input_ids, mm_inputs.mm_items)
    res["constructed"] = True
    res["items_kept"] = len(mm_inputs.mm_items)
    res["token_modalities_ok"] = token_modalities is not None and sum(1 for m in token_modalities if m) == sum(
        e - s + 1 for s, e in spans
    )
    res["sglang_token_ids"] = {
        k: getattr(mm_inputs, k) for k in ("im_token_id", "im_start_id", "im_end_id", "video_token_id")
    }

    # Pad values: SGLang's, and SGLang's own derivation from our hash (set_hash's rule).
    res["items"] = []
    for item, our_hash in zip(mm_inputs.mm_items, our_hashes, strict=True):
        derived = list(_compute_pad_values(our_hash.to_bytes(8, byteorder="big")))
        res["items"].append(
            {
                "our_hash": our_hash,
                "sglang_hash": item.hash,
                "pad_value": item.pad_value,
                "pad_values": list(item.pad_values) if item.pad_values is not None else None,
                "pad_values_from_our_hash": derived,
                "pad_values_match_our_hash": item.pad_values is not None and list(item.pad_values) == derived,
                "modality": item.modality.name,
                "offsets": [list(o) for o in item.offsets],
                "feature_is_zero_copy_view": isinstance(item.feature, torch.Tensor)
                and item.feature.data_ptr() == out["mm_items"][len(res["items"])]["feature"].ctypes.data,
                "image_grid_thw": item.image_grid_thw.tolist(),
            }
        )
    pads = [it["pad_values"] for it in res["items"]]

    # 3. Padded ids, built by SGLang's own code.
    pattern = MultiModalityDataPaddingPatternMultimodalTokens()
    padded = duplicate_pad_mm_input_ids(int64_array(ids), mm_inputs, pattern.pad_input_tokens)
    padded = np.frombuffer(padded, dtype=np.int64)
    res["scheduler_padding"] = span_report(ids, padded, spans, pads)
    res["scheduler_padded_sample"] = {f"{s}:{s + 8}": padded[s : s + 8].tolist() for s, _ in spans}
    prebuilt = MultimodalProcessorOutput.build_padded_input_ids(po.input_ids, mm_inputs.mm_items)
    res["build_padded_input_ids"] = (
        span_report(ids, np.asarray(prebuilt, np.int64), spans, pads) if prebuilt is not None else None
    )
    if mm_inputs.im_token_id is None:
        # Diagnosis only: what the scheduler would have built had the processor output carried the
        # image token id. The verdict above stays the one on what we actually handed over.
        mm_inputs.im_token_id = IMAGE_TOKEN_ID
        fixed = duplicate_pad_mm_input_ids(int64_array(ids), mm_inputs, pattern.pad_input_tokens)
        res["scheduler_padding_if_im_token_id_supplied"] = span_report(
            ids, np.frombuffer(fixed, dtype=np.int64), spans, pads
        )
        mm_inputs.im_token_id = None

    # 4. M-RoPE with SGLang's get_rope_index on the expanded ids, as its Qwen processor calls it.
    image_grid_thw = torch.cat([item.image_grid_thw for item in mm_inputs.mm_items], dim=0)
    positions, delta = MRotaryEmbedding.get_rope_index(
        spatial_merge_size=SPATIAL_MERGE_SIZE,
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_TOKEN_ID,
        model_type=MODEL_TYPE,
        input_ids=torch.from_numpy(ids).unsqueeze(0),
        image_grid_thw=image_grid_thw,
        video_grid_thw=None,
    )
    positions = positions.squeeze(1).numpy()
    delta = np.asarray(delta.numpy(), np.int64).reshape(-1)
    held = mm_inputs.mrope_positions
    res["mrope"] = {
        "sglang_shape": list(positions.shape),
        "sglang_dtype": str(positions.dtype),
        "sglang_delta": delta.tolist(),
        "our_delta": np.asarray(ours_delta).reshape(-1).tolist() if ours_delta is not None else None,
        "positions_equal": ours_pos is not None
        and positions.dtype == ours_pos.dtype
        and np.array_equal(positions, ours_pos),
        "delta_equal": ours_delta is not None and np.array_equal(delta, np.asarray(ours_delta).reshape(-1)),
        "first_difference": first_difference(positions, ours_pos) if ours_pos is not None else "missing",
        "held_by_sglang_as_tensor": isinstance(held, torch.Tensor),
        "held_is_zero_copy_view": isinstance(held, torch.Tensor) and held.data_ptr() == ours_pos.ctypes.data,
        "held_delta": mm_inputs.mrope_position_delta.tolist()
        if isinstance(mm_inputs.mrope_position_delta, torch.Tensor)
        else repr(mm_inputs.mrope_position_delta),
    }
    return res


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} DIR (a case directory written by tests/test_sglang_client.py)", file=sys.stderr)
        return 2
    root = Path(argv[1])
    manifest = json.loads((root / "manifest.json").read_text())
    for var in ("SGLANG_MM_SKIP_COMPUTE_HASH", "SGLANG_MM_BUFFER_SIZE_MB"):
        if os.environ.get(var):
            print(f"sglang_client_check: {var} is set; unset it (it changes the scheduler path)", file=sys.stderr)
            return 2
    warnings.filterwarnings("ignore")  # SGLang's import-time "only CUDA supports ..." notices
    try:
        import sglang
        import torch
    except Exception as exc:
        print(f"sglang_client_check: cannot import SGLang/torch in {sys.executable}: {exc!r}", file=sys.stderr)
        return 1
    results: dict = {"sglang": sglang.__version__, "torch": torch.__version__, "cases": {}}
    failed = []
    for case in manifest["cases"]:
        name = case["name"]
        try:
            res = check_case(case, root)
        except Exception as exc:
            failed.append(name)
            res = {"constructed": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            print(f"sglang_client_check: case {name}: SGLang raised {type(exc).__name__}: {exc}", file=sys.stderr)
            traceback.print_exc()
        else:
            pad = res["scheduler_padding"]
            print(
                f"{name}: constructed, positions_equal={res['mrope']['positions_equal']} "
                f"delta_equal={res['mrope']['delta_equal']} (sglang {res['mrope']['sglang_delta']}, "
                f"ours {res['mrope']['our_delta']}), padded_as_expected={pad['equals_expected']}, "
                f"pad_values={[it['pad_values'] for it in res['items']]}"
            )
        results["cases"][name] = res
    (root / "results.json").write_text(json.dumps(results, indent=1, default=repr))
    if failed:
        print(f"sglang_client_check: SGLang raised on case(s) {failed}; see {root / 'results.json'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
