"""Media primitives: the Python face of the crate's `common` module (same names, same arguments).

| function | does |
|---|---|
| `image_decode_rgb(data)` | JPEG/PNG/WebP/GIF/BMP bytes -> `(h, w, uint8[h, w, 3])`, equal to PIL |
| `resize_rgb(arr, out_w, out_h, resample)` | `pil_*` (stock Pillow; `pillow=` its version), `aten_u8` (torchvision) |
| `scaled_dims(w, h, rescale_frac, rescale_cap)` | Inkling long-edge rescale arithmetic |
| `content_hash(data)` | blake3 of the raw bytes, first 8 bytes big-endian |
| `fetch_bytes(source)` | http(s), file://, absolute path, data: URL, bare base64 (64 MiB budget) |
| `base64_decode(s)` | strict standard base64 |

Every failure is an `mmworker.MmError` (a ValueError) carrying the upstream message text.
"""

from mmworker.common.decode import image_decode_rgb
from mmworker.common.dims import scaled_dims
from mmworker.common.fetch import fetch_bytes
from mmworker.common.hashing import content_hash
from mmworker.common.inline import base64_decode
from mmworker.common.resize import resize_rgb

__all__ = ["base64_decode", "content_hash", "fetch_bytes", "image_decode_rgb", "resize_rgb", "scaled_dims"]
