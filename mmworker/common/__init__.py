"""Media primitives: the Python face of the crate's `common` module (same names, same arguments).

| function | does |
|---|---|
| `image_decode_rgb(data)` | JPEG/PNG/WebP/GIF/BMP bytes -> `(h, w, uint8[h, w, 3])`, equal to PIL |
| `resize_rgb(arr, out_w, out_h, resample)` | `pil_lanczos`, `pil_bicubic` (Pillow 12.x), `aten_u8` (torchvision) |
| `scaled_dims(w, h, rescale_frac, rescale_cap)` | Inkling long-edge rescale arithmetic |
| `content_hash(data)` | blake3 of the raw bytes, first 8 bytes big-endian |

Every failure is an `mmworker.MmError` (a ValueError) carrying the upstream message text.
"""

from mmworker.common.decode import image_decode_rgb
from mmworker.common.dims import scaled_dims
from mmworker.common.hashing import content_hash
from mmworker.common.resize import resize_rgb

