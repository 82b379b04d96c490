"""What both golden generators share: the reference-environment check (stock Pillow 12.x, never
pillow-simd, whose resamplers differ; torch on one thread), the versions they record, array digests
and the stable, diffable JSON writer."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
from pathlib import Path

import numpy as np


def require_reference_env() -> None:
    """Exit with the reason unless this interpreter is .venv-ref (scripts/setup_reference.sh)."""
    import PIL

    if not PIL.__version__.startswith("12."):
        sys.exit(f"stock Pillow 12.x required (found {PIL.__version__}); run in .venv-ref")
    try:
        importlib.metadata.distribution("pillow-simd")
    except importlib.metadata.PackageNotFoundError:
        import torch

        torch.set_num_threads(1)
        return
    sys.exit("pillow-simd is installed here; run in .venv-ref (stock Pillow 12.x)")


def sha256_array(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def reference_versions(codecs: tuple[str, ...]) -> dict:
    """The library versions a fixture was made with, and those of Pillow's `codecs`."""
    import PIL
    import torch
    import torchvision
    from PIL import features

    versions = {
        "python": sys.version.split()[0],
        "pillow": PIL.__version__,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "numpy": np.__version__,
    }
    try:
        import transformers

        versions["transformers"] = transformers.__version__
    except ImportError:  # the primitives generator does not need it
        pass
    for name in codecs:
        versions[f"pillow_{name}"] = features.version(name)
    return versions


def write_json(path: Path, header: dict, key: str, rows: list[dict]) -> None:
    """Stable, diffable JSON: one header key (or one sub-key or list entry of its value) per line, one case per line."""
    parts = []
    for k in sorted(header):
        val = header[k]
        if isinstance(val, dict) and val:
            inner = ",\n".join(f"  {json.dumps(sk)}: {json.dumps(val[sk], sort_keys=True)}" for sk in sorted(val))
            parts.append(f" {json.dumps(k)}: {{\n{inner}\n }}")
        elif isinstance(val, list) and val and isinstance(val[0], (dict, list)):
            inner = ",\n".join(f"  {json.dumps(x, sort_keys=True)}" for x in val)
            parts.append(f" {json.dumps(k)}: [\n{inner}\n ]")
        else:
            parts.append(f" {json.dumps(k)}: {json.dumps(val, sort_keys=True)}")
    lines = ",\n".join("  " + json.dumps(r, sort_keys=True) for r in rows)
    parts.append(f" {json.dumps(key)}: [\n{lines}\n ]")
    path.write_text("{\n" + ",\n".join(parts) + "\n}\n")
