"""Plain transcriptions of Qwen's normalisation and patch order (docs/behaviour.md §7.3), used as test oracles."""

import numpy as np


def reference_table(mean, std, resample) -> np.ndarray:
    """float32 [3, 256]: docs/behaviour.md §7.3's LUT, in numpy float32 arithmetic (an independent oracle)."""
    v = np.arange(256, dtype=np.float32)
    f255 = np.float32(255)
    rows = []
    for m, s in zip(np.float32(mean), np.float32(std), strict=True):
        rows.append((v / f255 - m) / s if resample == "pil" else (v - m * f255) / (s * f255))
    return np.stack(rows)


def hf_patchify(pixels, table, ps, m, tps):
    """Hugging Face's reshape/transpose route (Qwen2VLImageProcessor), as an independent oracle."""
    h, w, _ = pixels.shape
    x = np.stack([table[c][pixels[:, :, c]] for c in range(3)])  # C, H, W
    x = np.repeat(x[None], tps, axis=0)  # T, C, H, W
    gh, gw = h // ps, w // ps
    x = x.reshape(1, tps, 3, gh // m, m, ps, gw // m, m, ps).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gh * gw, 3 * tps * ps * ps)
