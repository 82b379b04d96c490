#!/usr/bin/env bash
# Build .venv-sglang: SGLang 0.5.23 with its own pinned dependencies (CPU only), then mmworker installed
# into it the documented way (`pip install <checkout>`), and prove the install changed nothing of SGLang's.
# Safe to run again: SGLang's part is built once (stamped); mmworker is reinstalled from the checkout
# every run, so the environment always holds the code being tested.
#
# What it does, in order:
#   1. .venv-sglang with Python 3.11 ($PYTHON, default python3.11; the sglang wheel is cp311);
#   2. torch 2.14.1 + torchvision 0.29.1 (SGLang's pin; the CUDA build, which runs on the CPU);
#   3. sglang 0.5.23 with --no-deps (its full set needs a GPU stack), then the part of its dependency
#      list that SGLang's tokenizer-side code imports, at SGLang's own pins where it pins one:
#      transformers 5.19.0, tokenizers 0.23.2, numba 0.65.1, an unpinned Pillow (stock: 13.0.0 today);
#      and the test tools (pytest, pytest-timeout, hypothesis), checked again on every run;
#   4. a record of every installed distribution and version, and of what `PIL` is;
#   5. `pip install <checkout>` (plain pip, no flags: what an operator runs);
#   6. verification: no distribution that was there before changed version or vanished, PIL is still
#      the Pillow pip lists (nothing shadows it), mmworker.sglang imports, and SGLang's built-in
#      Qwen-VL processor module imports.
# Used by tests/test_sglang_plugin.py and tests/test_sglang_client.py (both skip without it) and by
# bench/bench_sglang.py.
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

stamp="$VENV/.sglang-$SGLANG_VERSION-torch-$TORCH_VERSION"
if [ ! -f "$stamp" ]; then
    "$py" -m pip install -q --disable-pip-version-check --upgrade pip

    # 2. torch first, so nothing later picks another version.
    say "installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
    "${pip[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"

    # 3. SGLang without its GPU dependency set, then what its tokenizer side imports, at its pins
    #    (sglang 0.5.23's metadata: transformers==5.19.0, tokenizers==0.23.2, numba==0.65.1,
    #    sentencepiece==0.2.1, apache-tvm-ffi==0.1.11, compressed-tensors==0.18.0, openai==2.8.0,
    #    torchaudio==2.11.0; pillow, numpy and the rest unpinned). torch is repeated so that pip cannot
    #    move it while resolving the rest; torchaudio goes in --no-deps (its own pin wants another torch).
    #    datasets: SGLang's own test helper that stubs sgl_kernel (no CPU build) imports it; pytest,
    #    pytest-timeout and hypothesis run tests/sglang_env and the stock-Pillow part of the suite here.
    #    None of them is a dependency of mmworker.
    say "installing sglang==$SGLANG_VERSION (--no-deps) and its tokenizer-side dependencies"
    say "(pip then lists SGLang requirements that are not installed: expected, they are its GPU/server stack)"
    "${pip[@]}" --no-deps "sglang==$SGLANG_VERSION" "torchaudio==2.11.0"
    "${pip[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" \
        transformers==5.19.0 tokenizers==0.23.2 numba==0.65.1 sentencepiece==0.2.1 apache-tvm-ffi==0.1.11 \
        compressed-tensors==0.18.0 openai==2.8.0 \
        pillow numpy msgspec "pyzmq>=25.1.2" orjson psutil pybase64 requests aiohttp tqdm dill gguf \
        partial-json-parser ipython einops fastapi "uvicorn>=0.51" uvloop setproctitle pydantic python-multipart \
        prometheus-client scipy regex xxhash zstandard interegular packaging datasets "python-dateutil<3" \
        pytest "pytest-timeout>=2.4" hypothesis
    touch "$stamp"
fi

# The test tools again on every run, so that an environment built before one of them was added gets
# it. pip leaves what is installed already as it is (no --upgrade), and pytest-timeout needs nothing
# but pytest, so nothing of SGLang's moves.
"${pip[@]}" pytest "pytest-timeout>=2.4" hypothesis

# 4. What is there before mmworker: every distribution and its version, and which files PIL is.
before=$(mktemp)
after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
"$py" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null | grep -iv '^mmworker==' | sort >"$before"

# 5. The documented install: plain `pip install <checkout>`. --force-reinstall --no-deps on a
#    rerun only refreshes mmworker itself from the checkout (its dependencies are there already);
#    the first run is the plain command.
if "$py" -m pip show -q mmworker >/dev/null 2>&1; then
    say "refreshing mmworker from $here"
    "${pip[@]}" --force-reinstall --no-deps "$here"
else
    say "pip install $here"
    "${pip[@]}" "$here"
fi
"$py" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null | grep -iv '^mmworker==' | sort >"$after"

# 6. Verify: nothing of SGLang's environment changed; mmworker's plug-in and SGLang's processor import.
if ! PYTHONWARNINGS=ignore "$py" - "$before" "$after" "$SGLANG_VERSION" "$TORCH_VERSION" <<'PY'
import importlib.metadata as md
import sys

before_file, after_file, want_sglang, want_torch = sys.argv[1:]


def versions(path):
    with open(path) as f:
        return dict(line.strip().split("==", 1) for line in f if "==" in line)


before, after = versions(before_file), versions(after_file)
changed = {name: (v, after.get(name)) for name, v in before.items() if after.get(name) != v}
assert not changed, f"installing mmworker changed SGLang's environment: {changed}"
added = sorted(set(after) - set(before))

import PIL
from PIL import Image

pillow = md.version("pillow")
assert PIL.__version__ == pillow, f"PIL is {PIL.__version__} but pip lists pillow {pillow}: something shadows it"
owner = {str(f) for f in md.distribution("pillow").files or ()}
assert "PIL/__init__.py" in owner, "the imported PIL package does not belong to the pillow distribution"
try:
    md.distribution("pillow-simd")
    raise AssertionError("pillow-simd is installed beside SGLang's Pillow")
except md.PackageNotFoundError:
    pass

import sglang
import torch

assert sglang.__version__ == want_sglang, f"sglang {sglang.__version__} != {want_sglang}"
assert torch.__version__.split("+")[0] == want_torch, f"torch {torch.__version__} != {want_torch}"
import transformers

import mmworker.sglang  # noqa: F401  (the package SGLang is pointed at)

print(f"[setup-sglang] ok: sglang {sglang.__version__}, torch {torch.__version__}, transformers "
      f"{transformers.__version__}, Pillow {Image.__version__}, numba {md.version('numba')}; "
      f"mmworker {md.version('mmworker')} added {', '.join(added) or 'nothing else'}")
PY
then
    die "verification failed (see above)"
fi
