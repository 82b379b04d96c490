"""The inkling family: Inkling's image preprocessing described as data, for the driver and the pool.

An image is decoded whole, its long edge rescaled (Pillow LANCZOS, mmworker.common.dims.scaled_dims)
and patchified into bf16 bits (mmworker.inkling.patches), written straight into the feature the
allocator hands out: uint16 [patches, patch_size^2 * 3]. One token per patch: the image's placeholder
repeats once per patch, as SGLang's Inkling processor expands it. Positions are plain 1-D (`Rope1D`).
The aux tensor `image_size` is the rescaled (height, width), which a consumer needs to read the
patches back into pixels.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmworker.common.dims import scaled_dims
from mmworker.common.jpeg_rows import JpegRows
from mmworker.common.pixels import RgbImage
from mmworker.common.resize import resize_image
from mmworker.errors import MmError
from mmworker.inkling.patches import check_patch_size, grid, patchify_into
from mmworker.pipeline import (
    Allocator,
    Capabilities,
    Grid,
    ProcessedItem,
    Rope1D,
    TokenLayout,
    layout_by_placeholder,
    numpy_allocator,
)

# SGLang's Inkling processor: patch size 40, long edge doubled up to 2048, and the image
# placeholder id of its tokenizer (sglang.srt.parser.inkling_tokenizer.IMAGE_TOKEN_ID), which is
# negative: it never collides with a vocabulary id.
NAMED_SPECS: dict[str, dict[str, Any]] = {
    "inkling": {
        "family": "inkling",
        "image_token_id": -101,
        "patch_size": 40,
        "rescale_image_frac": 2.0,
        "rescale_image_max_upscaled_long_edge": 2048,
    },
}


@dataclass(frozen=True)
class InklingSpec:
    image_token_id: int
    patch_size: int
    rescale_image_frac: float | None = None
    rescale_image_max_upscaled_long_edge: int | None = None

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any]) -> "InklingSpec":
        def integer(name: str, value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise MmError(f"inkling spec: `{name}` must be an integer, got {value!r}")
            return value

        for name in ("image_token_id", "patch_size"):
            if name not in spec:
                raise MmError(f"inkling spec: missing field `{name}`")
        patch_size = integer("patch_size", spec["patch_size"])
        try:
            check_patch_size(patch_size)
        except MmError as exc:
            raise MmError(f"inkling spec: {exc}") from None
        frac = spec.get("rescale_image_frac")
        if frac is not None and (isinstance(frac, bool) or not isinstance(frac, (int, float))):
            raise MmError(f"inkling spec: `rescale_image_frac` must be a number, got {frac!r}")
        cap = spec.get("rescale_image_max_upscaled_long_edge")
        if cap is not None:
            cap = integer("rescale_image_max_upscaled_long_edge", cap)
        try:
            scaled_dims(1, 1, frac, cap)  # refuses a frac or cap that makes no sense, by name
        except MmError as exc:
            raise MmError(f"inkling spec: {exc}") from None
        return cls(integer("image_token_id", spec["image_token_id"]), patch_size,
                   None if frac is None else float(frac), cap)  # fmt: skip


def rescaled(image: RgbImage, rescale_frac: float | None, rescale_cap: int | None) -> RgbImage:
    """`image` with its long edge rescaled (Pillow LANCZOS), or itself when the size stays."""
    w, h = scaled_dims(image.width, image.height, rescale_frac, rescale_cap)
    if (w, h) == (image.width, image.height):
        return image
    return resize_image(image, w, h, "pil_lanczos", consume=True)


class Inkling:
    """Decode -> rescale the long edge -> bf16 patches; one placeholder token per patch; 1-D positions."""

    name = "inkling"
    modality = "IMAGE"

    def __init__(self, spec: InklingSpec) -> None:
        self.spec = spec

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> "Inkling":
        return cls(InklingSpec.from_mapping(spec))

    def __repr__(self) -> str:
        return f"Inkling({self.spec})"

    def describe(self) -> str:
        spec = self.spec
        rescale = "no rescale"
        if spec.rescale_image_frac is not None:
            cap = spec.rescale_image_max_upscaled_long_edge
            rescale = f"long edge x{spec.rescale_image_frac:g}" + (f" (upscaled to {cap} at most)" if cap else "")
        return f"inkling: patch {spec.patch_size}, {rescale} with Pillow's LANCZOS, bf16 patches"

    def image_prompt(self) -> tuple[int, ...]:
        return (self.spec.image_token_id,)

    def token_ids(self) -> dict[str, int]:
        return {"im_token_id": self.spec.image_token_id}

    def warm_up_images(self) -> tuple[tuple[int, int, str], ...]:
        return (64, 48, "PNG"), (320, 200, "JPEG")

    def model_data(self, aux: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {}  # SGLang's Inkling items carry the feature and offsets only

    def capabilities(self) -> Capabilities:
        return Capabilities()

    def process_item(self, image: RgbImage | JpegRows, alloc: Allocator = numpy_allocator) -> ProcessedItem:
        spec = self.spec
        decoded = image.load() if isinstance(image, JpegRows) else image
        resized = rescaled(decoded, spec.rescale_image_frac, spec.rescale_image_max_upscaled_long_edge)
        rows, cols = grid(resized.height, resized.width, spec.patch_size)
        feature = alloc((rows * cols, spec.patch_size * spec.patch_size * 3), np.dtype(np.uint16))
        patchify_into(resized.pixels, spec.patch_size, feature)
        size = np.array([resized.height, resized.width], np.int64)
        return ProcessedItem(feature=feature, aux={"image_size": size}, geometry=Grid(1, rows, cols))

    def layout(self, input_ids: np.ndarray, geometries: Sequence[Grid]) -> TokenLayout:
        return layout_by_placeholder(input_ids, self.spec.image_token_id, [g.h * g.w for g in geometries])

    def positions(
        self, input_ids: np.ndarray, offsets: Sequence[tuple[int, int]], geometries: Sequence[Grid]
    ) -> Rope1D:
        return Rope1D()
