#!/usr/bin/env bash
# Build the SEPARATE reference environment .venv-ref: it regenerates the tests/golden/ fixtures
# (tests/golden/generate_golden.py) and runs bench/bench_preprocess.py's torchvision yardstick.
# Safe to run again (idempotent).
#
# Why a separate environment: torchvision depends on plain Pillow, which would overwrite
# pillow-simd in .venv. Here stock Pillow 12.x is exactly what we want: it is the reference for
# the `pil_*` resamplers (Pillow 13 changed BICUBIC pass order, pillow-simd rounds differently),
# and torchvision's uint8 antialiased bicubic is the reference for `aten_u8`.
# The test suite never needs this environment.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-$here/.venv-ref}
TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
TRANSFORMERS_VERSION=${TRANSFORMERS_VERSION:-5.24.0}
# Stock Pillow 12.x (NOT 13, whose BICUBIC runs the passes in another order for some sizes:
# docs/behaviour.md §5.4). 12.3.0 preferred, 12.1.1 as fallback.
PILLOW_VERSIONS=(12.3.0 12.1.1)

say() { printf '[setup-ref] %s\n' "$*"; }
die() { printf '[setup-ref] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=scripts/venv.sh
. "$here/scripts/venv.sh"

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PYTHON is older than 3.11"
ensure_venv "$PYTHON" "$VENV"
py="$VENV/bin/python"
"$py" -m pip install -q --upgrade pip

have() {  # have DIST VERSION -> true if exactly that version is installed
    [ "$("$py" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null)" = "$2" ]
}

if ! have torch "$TORCH_VERSION" || ! have torchvision "$TORCHVISION_VERSION"; then
    say "installing torch $TORCH_VERSION, torchvision $TORCHVISION_VERSION (large; a few minutes)"
    "$py" -m pip install -q "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi

if ! have transformers "$TRANSFORMERS_VERSION"; then
    say "installing transformers $TRANSFORMERS_VERSION"
    "$py" -m pip install -q "transformers==$TRANSFORMERS_VERSION"
fi
"$py" -m pip install -q numpy  # every run: the generators need it whatever the steps above skipped

# Pillow last, so nothing above re-resolves it to a newer release.
pillow_ok=
for v in "${PILLOW_VERSIONS[@]}"; do
    if have pillow "$v"; then pillow_ok=$v; break; fi
done
if [ -z "$pillow_ok" ]; then
    for v in "${PILLOW_VERSIONS[@]}"; do
        say "installing stock Pillow $v"
        if "$py" -m pip install -q "pillow==$v"; then pillow_ok=$v; break; fi
    done
fi
[ -n "$pillow_ok" ] || die "could not install any of Pillow ${PILLOW_VERSIONS[*]}"

"$py" - <<'PY'
import importlib.metadata as md
import sys

import numpy
import PIL
import torch
import torchvision
import transformers
from PIL import features

problems = []
if not PIL.__version__.startswith("12."):
    problems.append(f"PIL is {PIL.__version__}, expected stock Pillow 12.x")
try:
    md.distribution("pillow-simd")
    problems.append("pillow-simd is installed in the reference env")
except md.PackageNotFoundError:
    pass
for codec in ("jpg", "zlib", "webp"):
    if not features.check(codec):
        problems.append(f"codec {codec!r} missing from Pillow")
if problems:
    sys.exit("[setup-ref] ERROR: " + "; ".join(problems))
print(f"[setup-ref] ok: Pillow {PIL.__version__}, torch {torch.__version__}, "
      f"torchvision {torchvision.__version__}, transformers {transformers.__version__}, "
      f"numpy {numpy.__version__}")
PY
