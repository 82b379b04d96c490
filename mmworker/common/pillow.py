"""Which PIL is installed, and the one thing stock Pillow versions resize differently: the order of the passes.

mmworker runs on either of two PILs. `pip install mmworker` takes stock Pillow 12.x or 13.x
(pyproject.toml: `pillow>=12,<14`), or leaves the one already installed alone (SGLang's
environment); scripts/setup.sh builds pillow-simd 12.1.1.post0 into the project's own `.venv`
instead, as an accelerator. pillow-simd's BICUBIC is ATen's arithmetic (torchvision's uint8
antialiased resize), so aten_u8 may hand passes to it (mmworker.common.resize); stock Pillow's is
not. So pillow-simd's resize is used only when the `PIL` that Python imports really is
pillow-simd's (`IS_PILLOW_SIMD`): the pillow-simd distribution owns the `PIL/__init__.py` that was
imported, and its version is `PIL.__version__` (both distributions install the same files, so the
one whose version the package reports is the one that wrote them last). Anything else is taken for
stock Pillow of version `PIL.__version__`, and our own kernels do every resize.

The `pil` resample mode reproduces stock Pillow's BICUBIC (and resize_rgb's pil_* its LANCZOS too).
Its coefficients and fixed-point arithmetic are the same from 12.0 to 13.0 (precompute_coeffs and
normalize_coeffs_8bpc read alike in their Resample.c), but the uint8 intermediate between the two
passes is rounded, so the order of the passes changes the bytes, and that changed:

| stock Pillow | vertical pass first when                                   | where                          |
|--------------|------------------------------------------------------------|--------------------------------|
| 12.0, 12.1   | never                                                      |                                |
| 12.2, 12.3   | in_h > 100 * in_w and out_h < in_h                         | Python, `Image.resize` (#9524) |
| 13.0         | in_h - out_h > 0 and in_h - out_h > 2 * (in_w - out_w)     | C, `ImagingResampleInner`      |

(12.2/12.3 make two C calls: a vertical-only resize at the full width, then a horizontal-only one;
13.0 drops that Python rule and decides in C, also when the width grows: 1024x768 -> 1036x756, a
common Qwen smart_resize, goes vertical first.) Horizontal first, the vertical pass reads only the
rows it needs of the horizontal pass's output; vertical first, it runs over every source row at the
source width, and the horizontal pass over its out_h rows. Later 12.x and 13.x releases are taken to
keep their line's rule; other major versions are refused (`check_version`), so that a caller can
fall back to its own path rather than get bytes that nobody checked.
"""

import functools
import importlib.metadata
import os
import re

import PIL

from mmworker.errors import MmError

SUPPORTED = "stock Pillow 12.0 to 13.x"
# What the `pil` mode reproduces under pillow-simd, whose own BICUBIC is ATen's: stock Pillow 12's
# passes, horizontal first (as the crate and mmworker always did there).
PILLOW_SIMD_PIL_MODE = "12.1.1"
# A release number and whatever PEP 440 may follow it ("13.0.0", "12.2.0.dev0", "13.0.0rc1").
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.\d+)*(?:[._+-]?[A-Za-z0-9]+)*")


def _is_pillow_simd() -> bool:
    try:
        dist = importlib.metadata.distribution("pillow-simd")
    except importlib.metadata.PackageNotFoundError:
        return False
    if dist.version != PIL.__version__ or "PIL/__init__.py" not in {str(f) for f in dist.files or ()}:
        return False
    try:
        return os.path.samefile(dist.locate_file("PIL/__init__.py"), PIL.__file__)
    except OSError:
        return False


# The imported PIL is pillow-simd's (see the module docstring).
IS_PILLOW_SIMD = _is_pillow_simd()


def installed() -> str:
    """What the installed PIL is, for messages: "pillow-simd 12.1.1.post0", "Pillow 13.0.0"."""
    return f"{'pillow-simd' if IS_PILLOW_SIMD else 'Pillow'} {PIL.__version__}"


def pil_mode_default() -> str:
    """The stock Pillow version that the `pil` mode reproduces when nothing names one: the installed
    Pillow's, or `PILLOW_SIMD_PIL_MODE` under pillow-simd. Not checked (`check_version` does that)."""
    return PILLOW_SIMD_PIL_MODE if IS_PILLOW_SIMD else PIL.__version__


@functools.cache
def _release(version: str) -> tuple[int, int] | None:
    match = _VERSION.fullmatch(version)
    if match is None:
        return None
    release = int(match[1]), int(match[2])
    return release if release[0] in (12, 13) else None


def check_version(version: object) -> str:
    """`version` if it names a stock Pillow whose resize we reproduce (12.0 to 13.x), else MmError."""
    if not isinstance(version, str) or _release(version) is None:
        raise MmError(f"Pillow {version!r} is not supported: the pil resize reproduces {SUPPORTED}")
    return version


def vertical_first(version: str, in_w: int, in_h: int, out_w: int, out_h: int) -> bool:
    """Whether stock Pillow `version` runs the vertical pass first when resizing in_w x in_h to
    out_w x out_h (the table in the module docstring); the version must pass `check_version`."""
    release = _release(check_version(version))
    if release >= (13, 0):
        return in_h - out_h > 0 and in_h - out_h > (in_w - out_w) * 2
    if release >= (12, 2):
        return in_h > in_w * 100 and out_h < in_h
    return False
