"""Moving pixels between Pillow images and numpy without hidden copies.

Pillow keeps RGB and RGBA images as 4 bytes per pixel (RGBX / RGBA). Through the Arrow C data
interface (a stable, documented ABI that Pillow >= 11.2 exports) a single-block image can be read
in place as a `(h, w, 4)` uint8 array, so a decoded or pillow-simd-resized image reaches our numba
kernels without `tobytes()` (which copies twice: into chunks, then joins them). Images that Pillow
spread over several memory blocks cannot be exported that way; they take the `tobytes()` path.
Worker processes raise `PILLOW_BLOCK_SIZE` so that never happens on the hot path.
"""

import ctypes
from dataclasses import dataclass

import numpy as np
from numba import njit
from PIL import Image

from mmworker.errors import MmError

# The four-byte-per-pixel modes whose first three bytes are R, G, B.
RGB_STORAGE_MODES = frozenset({"RGB", "RGBA", "RGBX"})


@dataclass(eq=False)
class RgbImage:
    """Pixels whose first three channels are R, G, B, and the Pillow image that owns them, if any.

    `pixels` is (height, width, C) uint8: C = 4 when it is a read-only view of Pillow's own
    RGBX/RGBA storage (no copy was made) or a decoder's buffer of 4-byte pixels, C = 3 for a plain
    array. `pil` lets pillow-simd work on the same storage without converting back; it is None for
    pixels that live in numpy (`to_pil` maps 4-byte ones for Pillow without a copy).
    """

    pixels: np.ndarray
    pil: Image.Image | None = None
    # The flat uint8 array holding `pixels` when nothing else refers to it (a decoder's fresh
    # buffer): whoever consumes the image may then overwrite that memory and shrink it.
    buffer: np.ndarray | None = None

    def release(self) -> None:
        """Drop this object's hold on the pixels, so their memory is freed once nothing else holds it.

        Whoever consumes an image (a family's process_item) calls this as soon as it no longer
        needs the pixels, although its caller still holds the object: then the memory of a decoded
        image can be reused for what is computed from it. Afterwards the image is empty (0 x 0).
        """
        self.pixels = np.empty((0, 0, 3), np.uint8)
        self.pil = None
        self.buffer = None

    @property
    def height(self) -> int:
        return self.pixels.shape[0]

    @property
    def width(self) -> int:
        return self.pixels.shape[1]

    def to_pil(self) -> Image.Image:
        """A Pillow image of these pixels' colour: the owner itself, 4-byte pixels (an RGBA owner's
        storage, a decoder's buffer) seen as RGBX, or a copy made for Pillow.

        Never RGBA: Pillow resizes RGBA premultiplied by alpha, which changes the colour of every
        pixel that is not opaque, and alpha is dropped here by rule, never composited. RGBX has the
        same layout and is resized channel by channel like RGB. That RGBX image maps the pixels'
        memory (Image.frombuffer), so it must not be given to `storage_view`; what Pillow computes
        from it is an ordinary image.
        """
        if self.pil is not None and self.pil.mode != "RGBA":
            return self.pil
        if self.pixels.shape[2] == 4 and self.pixels.flags.c_contiguous:
            h, w = self.pixels.shape[:2]
            # Maps the same memory (no copy); it keeps the view, and with it the owner, alive.
            return Image.frombuffer("RGBX", (w, h), self.pixels, "raw", "RGBX", 0, 1)
        return image_from_rgb(self.pixels)


class _ArrowArray(ctypes.Structure):
    pass


_ArrowArray._fields_ = [
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(_ArrowArray))),
    ("dictionary", ctypes.c_void_p),
    ("release", ctypes.c_void_p),
    ("private_data", ctypes.c_void_p),
]

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def storage_view(image: Image.Image, *, writable: bool = False) -> np.ndarray | None:
    """(h, w, 4) uint8 view of a Pillow-allocated RGB/RGBA/RGBX image's storage, or None if not exportable.

    The view keeps the exported Arrow array (and with it Pillow's memory) alive for as long as it
    exists. It is read-only unless `writable` (only for filling an image nobody else has seen yet).
    Never call this on an image made by `Image.frombuffer`: Pillow's Arrow export does not support
    such mapped images and crashes on them.
    """
    if image.mode not in RGB_STORAGE_MODES:
        return None
    image.load()
    try:
        array_capsule = image.im.__arrow_c_array__()
    except ValueError:  # "Image is in multiple array blocks"
        return None
    array = _ArrowArray.from_address(_capsule_pointer(array_capsule, b"arrow_array"))
    pixels = array.children[0].contents  # fixed-size list of 4 x uint8 per pixel
    w, h = image.size
    nbytes = w * h * 4
    if pixels.length - pixels.offset < nbytes or pixels.n_buffers < 2:
        return None
    raw = (ctypes.c_uint8 * nbytes).from_address(pixels.buffers[1] + pixels.offset)
    # ctypes keeps `_keepalive` referenced from the buffer object; numpy keeps the buffer.
    raw._keepalive = array_capsule
    view = np.frombuffer(raw, dtype=np.uint8).reshape(h, w, 4)
    view.flags.writeable = writable
    return view


def rgb_pixels(image: Image.Image) -> np.ndarray:
    """The pixels of an RGB/RGBA image as (h, w, C) uint8, C = 4 in place when possible, else 3."""
    view = storage_view(image)
    if view is not None:
        return view
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    w, h = rgb.size
    return np.frombuffer(rgb.tobytes(), dtype=np.uint8).reshape(h, w, 3)


@njit(cache=True)
def pack_rgb(src: np.ndarray, out: np.ndarray) -> None:
    """out = src[..., :3] for flat C-ordered buffers of 4-byte and 3-byte pixels (drops X or alpha)."""
    for i in range(out.shape[0] // 3):
        out[3 * i] = src[4 * i]
        out[3 * i + 1] = src[4 * i + 1]
        out[3 * i + 2] = src[4 * i + 2]


@njit(cache=True)
def unpack_rgb(src: np.ndarray, out: np.ndarray) -> None:
    """out = RGBX of src for flat C-ordered buffers of 3-byte and 4-byte pixels (X = 255, like Pillow)."""
    for i in range(src.shape[0] // 3):
        out[4 * i] = src[3 * i]
        out[4 * i + 1] = src[3 * i + 1]
        out[4 * i + 2] = src[3 * i + 2]
        out[4 * i + 3] = 255


def copy_rgb(pixels: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """(h, w, 3) uint8 copy of (h, w, C >= 3) pixels, written into `out` when given."""
    h, w = pixels.shape[0], pixels.shape[1]
    if out is None:
        out = np.empty((h, w, 3), np.uint8)
    if pixels.shape[2] == 3:
        out[...] = pixels
    else:
        pack_rgb(np.ascontiguousarray(pixels).reshape(-1), out.reshape(-1))
    return out


def rgbx_copy(pixels: np.ndarray) -> np.ndarray:
    """(h, w, 4) uint8 copy of (h, w, 3) pixels, as Pillow lays RGB out (pad byte 255)."""
    h, w = pixels.shape[0], pixels.shape[1]
    out = np.empty((h, w, 4), np.uint8)
    unpack_rgb(np.ascontiguousarray(pixels).reshape(-1), out.reshape(-1))
    return out


def image_from_rgb(arr: np.ndarray) -> Image.Image:
    """A new Pillow RGB image holding (h, w, C >= 3) uint8 pixels, written straight into its storage.

    Pillow's own RGB unpacking is slower than ours, and `frombuffer` cannot be used instead: its
    mapped images cannot be viewed in place afterwards (see storage_view).
    """
    h, w, c = arr.shape
    # Image.new would zero-fill and may split the image over blocks; new_block is one allocation.
    image = Image.Image()._new(Image.core.new_block("RGB", (w, h)))
    target = storage_view(image, writable=True)
    if target is None:  # cannot happen for a single block; kept so a Pillow change fails loudly
        raise MmError(f"cannot view the storage of a new {w}x{h} Pillow image")
    flat = np.ascontiguousarray(arr).reshape(-1)
    if c == 3:
        unpack_rgb(flat, target.reshape(-1))
    else:
        target[...] = arr[:, :, :4]
    return image


def from_pil(image: Image.Image) -> RgbImage:
    """Wrap an RGB/RGBA Pillow image, viewing its storage in place when Pillow allows it."""
    return RgbImage(pixels=rgb_pixels(image), pil=image)
