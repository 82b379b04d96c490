"""The qwen_vl family (Qwen2-VL, 2.5-VL, 3-VL, 3.5) and its Python face, as the crate's `qwen_vl` module.

| function | does |
|---|---|
| `preprocess(data, spec)` | encoded image -> (pixel_values float32 [gh * gw, dim], (t, gh, gw)) |
| `smart_resize(h, w, factor, min_pixels, max_pixels)` | target (h', w') |
| `mrope_image_only(input_len, items, merge_size)` | M-RoPE positions int64 [3, L] and delta |

`spec` is a bundled name ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"), a mapping or JSON
object text with the keys of docs/behaviour.md §7.1, or a `QwenSpec`; `resample` picks the
Hugging Face processor reproduced bit for bit: "aten_u8" (default, Qwen2VLImageProcessor with
torchvision) or "pil" (Qwen2VLImageProcessorPil).
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from mmworker.common.decode import with_image
from mmworker.pipeline import spec_mapping
from mmworker.qwen_vl.family import QwenVL
from mmworker.qwen_vl.mrope import mrope_image_only
from mmworker.qwen_vl.sizing import smart_resize
from mmworker.qwen_vl.spec import NAMED_SPECS, QwenSpec

__all__ = ["NAMED_SPECS", "QwenSpec", "QwenVL", "as_spec", "mrope_image_only", "preprocess", "smart_resize"]


def as_spec(spec: QwenSpec | Mapping[str, Any] | str) -> QwenSpec:
    """A QwenSpec from a QwenSpec, a bundled name ("qwen2_vl", ...), a JSON object's text or a mapping."""
    if isinstance(spec, QwenSpec):
        return spec
    return QwenSpec.from_mapping(spec_mapping(spec, NAMED_SPECS))


def preprocess(data: bytes | memoryview, spec: QwenSpec | Mapping[str, Any] | str) -> tuple[np.ndarray, tuple]:
    """Decode -> smart_resize -> resize -> normalise -> patchify one image."""
    item = with_image(data, QwenVL(as_spec(spec)).process_item)
    return item.feature, tuple(int(v) for v in item.aux["image_grid_thw"])
