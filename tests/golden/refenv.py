"""The reference environment check shared by the golden generators: stock Pillow 12.x (never
pillow-simd, whose resamplers differ), and torch held to one thread like everything we compare."""

from __future__ import annotations

import importlib.metadata
import sys


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
