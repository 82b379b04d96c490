#!/usr/bin/env bash
# Build .venv-sglang: a CPU-only client environment with SGLang 0.5.23's own scheduler-side code,
# for tests/test_sglang_client.py. Safe to run again (idempotent: a finished build is only verified).
#
# Kept apart from .venv on purpose: SGLang's dependencies pull plain Pillow, which would shadow
# pillow-simd there. What it does, in order (see shared/reference/measurements.md, last section):
#   1. .venv-sglang with Python 3.11 ($PYTHON, default python3.11);
#   2. torch 2.14.1 + torchvision 0.29.1 (CUDA build; runs on CPU);
#   3. sglang 0.5.23 with --no-deps (its full dependency set needs a GPU stack);
#   4. only the packages SGLang's scheduler-side modules need at import time;
#   5. verification: the classes and functions the client check uses import and are where we expect.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-$here/.venv-sglang}
TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
SGLANG_VERSION=0.5.23

say() { printf '[setup-sglang] %s\n' "$*"; }
die() { printf '[setup-sglang] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=scripts/venv.sh
. "$here/scripts/venv.sh"

# 1. Virtual environment.
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || die "$PYTHON is not Python 3.11 (the sglang $SGLANG_VERSION wheel is cp311)"
ensure_venv "$PYTHON" "$VENV"
py="$VENV/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)

stamp="$VENV/.sglang-client-$SGLANG_VERSION-torch-$TORCH_VERSION"
if [ ! -f "$stamp" ]; then
    "$py" -m pip install -q --disable-pip-version-check --upgrade pip

    # 2. torch first, so nothing later picks another version.
    say "installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
    "${pip[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"

    # 3. SGLang itself, without its (GPU) dependency set.
    say "installing sglang==$SGLANG_VERSION (--no-deps)"
    "${pip[@]}" --no-deps "sglang==$SGLANG_VERSION"

    # 4. Import-time needs of sglang.srt.managers.schedule_batch, mm_utils and rotary_embedding
    #    (found by importing them; nothing beyond measurements.md's list was missing). Where
    #    sglang 0.5.23 pins a version in its metadata, that version; torch is repeated so pip cannot
    #    move it while resolving the rest.
    say "installing SGLang's import-time dependencies"
    say "(pip then lists SGLang requirements that are not installed: expected, they are its GPU/server stack)"
    "${pip[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" \
        orjson psutil pybase64 pillow starlette msgspec "pyzmq>=25.1.2" tqdm aiohttp dill gguf \
        partial-json-parser ipython \
        transformers==5.19.0 tokenizers==0.23.2 sentencepiece==0.2.1 apache-tvm-ffi==0.1.11 \
        compressed-tensors==0.18.0 openai==2.8.0
    touch "$stamp"
fi

# 5. Verify; on failure drop the stamp so the next run installs again.
if ! PYTHONWARNINGS=ignore "$py" - "$SGLANG_VERSION" "$TORCH_VERSION" <<'PY'
import sys

import sglang
import torch

want_sglang, want_torch = sys.argv[1], sys.argv[2]
assert sglang.__version__ == want_sglang, f"sglang {sglang.__version__} != {want_sglang}"
assert torch.__version__.split("+")[0] == want_torch, f"torch {torch.__version__} != {want_torch}"

from sglang.srt.layers.rotary_embedding import MRotaryEmbedding
from sglang.srt.managers.mm_utils import MultiModalityDataPaddingPatternMultimodalTokens
from sglang.srt.managers.schedule_batch import (
    MultimodalDataItem,
    MultimodalInputs,
    MultimodalProcessorOutput,
)

for name, obj in [
    ("MultimodalDataItem.from_dict", getattr(MultimodalDataItem, "from_dict", None)),
    ("MultimodalProcessorOutput.from_dict", getattr(MultimodalProcessorOutput, "from_dict", None)),
    ("MultimodalInputs.from_processor_output", getattr(MultimodalInputs, "from_processor_output", None)),
    ("MRotaryEmbedding.get_rope_index", getattr(MRotaryEmbedding, "get_rope_index", None)),
    ("MultiModalityDataPaddingPatternMultimodalTokens.pad_input_tokens",
     getattr(MultiModalityDataPaddingPatternMultimodalTokens, "pad_input_tokens", None)),
]:
    assert callable(obj), f"{name} is missing"
print(f"[setup-sglang] ok: sglang {sglang.__version__}, torch {torch.__version__} (cuda available: "
      f"{torch.cuda.is_available()})")
PY
then
    rm -f "$stamp"
    die "verification failed (see above); rerun after fixing"
fi
