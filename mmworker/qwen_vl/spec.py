"""The qwen_vl spec: which checkpoint's preprocessing to reproduce, parsed and checked once.

Keys as in SGLang's `RustMmSpec` JSON (docs/behaviour.md §7.1); unknown keys are ignored. One key is
mmworker's own: `pillow`, the version string of the stock Pillow whose BICUBIC the `pil` mode
reproduces (Qwen2VLImageProcessorPil resizes with whatever Pillow is installed beside it, and
Pillow 12.2 and 13.0 changed the order of the resize's passes: mmworker.common.pillow). Absent, it
is the installed Pillow's version, or "12.1.1" under pillow-simd (whose own resize is ATen's, so
`pil` has always meant stock Pillow 12 there). A version outside 12.0-13.x is refused (MmError), so
that a caller can fall back to its own path. `to_mapping` writes the version resolved, so that a
process given the mapping follows the same rule as the one that parsed it.

Another is `feature_dtype`: "float32" (the default: HF's pixel_values) or "bfloat16", the same values
each rounded to nearest even bf16 (as `torch.from_numpy(pixel_values).to(torch.bfloat16)`), in half
the bytes, held as uint16 bf16 bits (numpy has no bfloat16). SGLang's Qwen vision towers cast
pixel_values to their own dtype, bfloat16 for the released checkpoints, so the model sees the same
input either way. It is a key of the spec, and nowhere else (no pool setting): the spec is what
fixes a feature's bytes, what the pool hands its workers and what names a result.

Three keys are for videos (mmworker.qwen_vl.video, .video_layout): `model_type`, SGLang's
hf_config.model_type ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", their _moe variants), which
picks the video processors and the M-RoPE time axis; `tokens_per_second` (Qwen2.5-VL's vision
config: 2 in the released checkpoints); `timestamp_table` (Qwen3-VL/3.5: the ids of the timestamp
text's pieces in the checkpoint's tokenizer, `video_layout.timestamp_token_table`: workers hold no
tokenizer). A spec serves videos when it has what its model type needs (`video_problem` says what is
missing otherwise) and the vision start, end and video token ids.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmworker.common.pillow import SUPPORTED, check_version, installed, pil_mode_default
from mmworker.errors import MmError

# Which Hugging Face processor a spec reproduces bit for bit: "aten_u8" = Qwen2VLImageProcessor
# (torchvision on uint8; the default), "pil" = Qwen2VLImageProcessorPil.
RESAMPLE_MODES = ("aten_u8", "pil")
# The feature's dtype -> its storage: bf16 bits in uint16 (module docstring).
FEATURE_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(np.uint16)}

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


def _checkpoint(tokens: dict, patch_size: int, min_pixels: int, max_pixels: int, mean: list, std: list,
                **video: Any) -> dict:  # fmt: skip
    return {"family": "qwen_vl", **tokens, "patch_size": patch_size, "merge_size": 2, "temporal_patch_size": 2,
            "min_pixels": min_pixels, "max_pixels": max_pixels, "image_mean": mean, "image_std": std,
            **video}  # fmt: skip


# The Qwen3 specs have no `timestamp_table`: their tokenizers are not bundled (the SGLang plug-in builds
# the table from the tokenizer SGLang loads; mmworker.qwen_vl.video_layout.timestamp_token_table).
# Qwen2.5-VL's images are preprocessed as Qwen2-VL's; its videos' time axis counts tokens_per_second.
NAMED_SPECS: dict[str, dict[str, Any]] = {
    "qwen2_vl": _checkpoint(_QWEN2_TOKENS, 14, 3136, 12845056, _CLIP_MEAN, _CLIP_STD, model_type="qwen2_vl"),
    "qwen2_5_vl": _checkpoint(
        _QWEN2_TOKENS, 14, 3136, 12845056, _CLIP_MEAN, _CLIP_STD, model_type="qwen2_5_vl", tokens_per_second=2
    ),
    "qwen3_vl": _checkpoint(_QWEN2_TOKENS, 16, 65536, 16777216, _HALF, _HALF, model_type="qwen3_vl"),
    "qwen3_5": _checkpoint(_QWEN3_5_TOKENS, 16, 65536, 16777216, _HALF, _HALF, model_type="qwen3_5"),
}


@dataclass(frozen=True)
class QwenSpec:
    image_token_id: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    image_mean: tuple[float, float, float]  # float32 values
    image_std: tuple[float, float, float]
    resample: str = "aten_u8"
    feature_dtype: str = "float32"  # or "bfloat16" (module docstring)
    # The stock Pillow version whose BICUBIC the pil mode reproduces (module docstring). None given
    # means the installed one, resolved on construction; it stays None only for aten_u8 under an
    # installed Pillow that the pil mode could not reproduce (aten_u8 never resizes as Pillow does).
    pillow: str | None = None
    # Drain-side token ids (not used by preprocessing): SGLang's processor output carries them, and
    # its scheduler pads the image tokens only when it knows them.
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    video_token_id: int | None = None
    # Video keys (module docstring); None where the spec does not say.
    model_type: str | None = None
    tokens_per_second: float | None = None
    timestamp_table: Mapping[str, tuple[int, ...]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.feature_dtype, str) or self.feature_dtype not in FEATURE_DTYPES:
            raise MmError(
                f"qwen_vl spec: `feature_dtype` must be one of {', '.join(map(repr, FEATURE_DTYPES))}, "
                f"got {self.feature_dtype!r}"
            )
        if self.pillow is not None:
            try:
                check_version(self.pillow)
            except MmError as exc:
                raise MmError(f"qwen_vl spec: `pillow`: {exc}") from None
            return
        default = pil_mode_default()
        try:
            object.__setattr__(self, "pillow", check_version(default))
        except MmError:
            if self.resample == "pil":
                raise MmError(
                    f"qwen_vl spec: `pillow` names no version, and the installed {installed()} is not one "
                    f"the pil mode reproduces ({SUPPORTED})"
                ) from None

    @property
    def factor(self) -> int:
        """Side lengths are multiples of this: patch_size * merge_size (28 or 32)."""
        return self.patch_size * self.merge_size

    @property
    def feature_dim(self) -> int:
        """Floats per patch row of pixel_values: 3 * temporal_patch_size * patch_size^2."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def feature_storage(self) -> np.dtype:
        """The numpy dtype features are written in: float32, or uint16 holding bf16 bits."""
        return FEATURE_DTYPES[self.feature_dtype]

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any]) -> "QwenSpec":
        def field(name: str) -> Any:
            if name not in spec:
                raise MmError(f"qwen_vl spec: missing field `{name}`")
            return spec[name]

        def integer(name: str) -> int:
            value = field(name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise MmError(f"qwen_vl spec: `{name}` must be an integer, got {value!r}")
            return value

        def triple(name: str) -> tuple[float, float, float]:
            value = field(name)
            if (
                not isinstance(value, (list, tuple))
                or len(value) != 3
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            ):
                raise MmError(f"qwen_vl spec: `{name}` must be 3 numbers, got {value!r}")
            values = np.asarray(value, dtype=np.float64).astype(np.float32)
            if not np.isfinite(values).all():
                raise MmError(f"qwen_vl spec: `{name}` must be finite, got {value!r}")
            return tuple(float(v) for v in values)  # type: ignore[return-value]

        sizes = [integer(k) for k in ("patch_size", "merge_size", "temporal_patch_size")]
        if min(sizes) <= 0:
            raise MmError("qwen_vl spec: sizes must be positive")
        resample = spec.get("resample", "aten_u8")
        if resample not in RESAMPLE_MODES:
            raise MmError(f"qwen_vl spec: unknown variant `{resample}`, expected `aten_u8` or `pil`")
        min_pixels, max_pixels = integer("min_pixels"), integer("max_pixels")
        if min_pixels < 0 or max_pixels <= 0:
            raise MmError(f"qwen_vl spec: pixel budget must be positive, got {min_pixels}..{max_pixels}")
        std = triple("image_std")
        if 0.0 in std:
            raise MmError(f"qwen_vl spec: `image_std` must be non-zero, got {list(std)}")
        token = integer("image_token_id")
        if token < 0:
            raise MmError(f"qwen_vl spec: `image_token_id` must be non-negative, got {token}")
        optional: dict[str, Any] = {}
        for name in ("model_type", "tokens_per_second", "timestamp_table"):
            if spec.get(name) is not None:
                optional[name] = spec[name]
        for name in ("vision_start_token_id", "vision_end_token_id", "video_token_id"):
            if spec.get(name) is not None:
                optional[name] = integer(name)
                if optional[name] < 0:
                    raise MmError(f"qwen_vl spec: `{name}` must be non-negative, got {optional[name]}")
        return cls(
            image_token_id=token,
            patch_size=sizes[0],
            merge_size=sizes[1],
            temporal_patch_size=sizes[2],
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            image_mean=triple("image_mean"),
            image_std=std,
            resample=resample,
            feature_dtype=spec.get("feature_dtype", "float32"),
            pillow=spec.get("pillow"),
            **optional,
        )

    def to_mapping(self) -> dict[str, Any]:
        """The JSON form (family key included), e.g. for the Rust extension's `spec_json`."""
        return {
            "family": "qwen_vl",
            "image_token_id": self.image_token_id,
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "temporal_patch_size": self.temporal_patch_size,
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
            "resample": self.resample,
            "feature_dtype": self.feature_dtype,
            **({"pillow": self.pillow} if self.pillow is not None else {}),
            **{
                name: getattr(self, name)
                for name in (
                    "vision_start_token_id",
                    "vision_end_token_id",
                    "video_token_id",
                    "model_type",
                    "tokens_per_second",
                )
                if getattr(self, name) is not None
            },
            **(
                {"timestamp_table": {k: list(v) for k, v in self.timestamp_table.items()}}
                if self.timestamp_table is not None
                else {}
            ),
        }
