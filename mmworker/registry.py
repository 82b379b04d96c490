"""Which family serves a spec (`pipeline_from_spec`), and the bundled specs of released Qwen checkpoints."""

import json
from collections.abc import Mapping
from typing import Any

from mmworker.errors import MmError
from mmworker.pipeline import Family
from mmworker.qwen_vl import QwenSpec, QwenVL

_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
_HALF = [0.5, 0.5, 0.5]

# preprocessor_config.json of the released checkpoints (Qwen/Qwen2-VL-7B-Instruct,
# Qwen/Qwen2.5-VL-7B-Instruct, Qwen/Qwen3-VL-8B-Instruct, Qwen/Qwen3.5-*), image_token_id from
# their tokenizers (<|image_pad|>). `resample` is left at the default (the torchvision processor,
# which SGLang uses unless --disable-fast-image-processor).
_QWEN2_TOKENS = {"image_token_id": 151655, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
                 "video_token_id": 151656}  # fmt: skip
_QWEN3_5_TOKENS = {"image_token_id": 248056, "vision_start_token_id": 248053, "vision_end_token_id": 248054,
                   "video_token_id": 248057}  # fmt: skip


def _qwen_vl(tokens: dict, patch_size: int, min_pixels: int, max_pixels: int, mean: list, std: list) -> dict:
    return {"family": "qwen_vl", **tokens, "patch_size": patch_size, "merge_size": 2, "temporal_patch_size": 2,
            "min_pixels": min_pixels, "max_pixels": max_pixels, "image_mean": mean, "image_std": std}  # fmt: skip


NAMED_SPECS: dict[str, dict[str, Any]] = {
    "qwen2_vl": _qwen_vl(_QWEN2_TOKENS, 14, 3136, 12845056, _CLIP_MEAN, _CLIP_STD),
    "qwen2_5_vl": _qwen_vl(_QWEN2_TOKENS, 14, 3136, 12845056, _CLIP_MEAN, _CLIP_STD),  # the same as Qwen2-VL's
    "qwen3_vl": _qwen_vl(_QWEN2_TOKENS, 16, 65536, 16777216, _HALF, _HALF),
    "qwen3_5": _qwen_vl(_QWEN3_5_TOKENS, 16, 65536, 16777216, _HALF, _HALF),
}

_FAMILIES = {"qwen_vl": lambda spec: QwenVL(QwenSpec.from_mapping(spec))}


def named_spec(name: str) -> dict[str, Any]:
    """A copy of a bundled spec, by checkpoint family name (see NAMED_SPECS)."""
    if name not in NAMED_SPECS:
        raise MmError(f"unknown named spec {name!r}; known: {', '.join(NAMED_SPECS)}")
    return json.loads(json.dumps(NAMED_SPECS[name]))


def spec_mapping(spec: Mapping[str, Any] | str) -> dict[str, Any]:
    """`spec` as a new dict: a bundled name ("qwen2_vl", ...), a JSON object string, or a mapping."""
    if isinstance(spec, str):
        if spec in NAMED_SPECS:
            return named_spec(spec)
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            if spec.strip().isidentifier():  # meant as a name, not as JSON
                named_spec(spec)  # raises "unknown named spec"
            raise MmError(f"mm spec: {exc}") from exc
    if not isinstance(spec, Mapping):
        raise MmError(f"mm spec: expected a JSON object, got {type(spec).__name__}")
    return dict(spec)


def pipeline_from_spec(spec: Mapping[str, Any] | str) -> Family:
    """The family for `spec`: a mapping, a JSON object string, or a bundled name such as "qwen2_vl"."""
    spec = spec_mapping(spec)
    family = spec.get("family")
    if family not in _FAMILIES:
        raise MmError(f"unknown mm family: {family}")
    return _FAMILIES[family](spec)
