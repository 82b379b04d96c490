#!/usr/bin/env bash
# Take a fresh Debian machine to a working .venv for mmworker; safe to run again (idempotent).
#
# What it does, in order:
#   1. apt packages that pillow-simd's codecs build against (JPEG, zlib for PNG, WebP), libturbojpeg
#      (the same libjpeg-turbo, for the planes of large JPEGs) and ffmpeg (the command line that makes
#      the video test corpus), if missing;
#   2. .venv with the interpreter in $PYTHON (default python3, >= 3.11);
#   3. pillow-simd built from source, with AVX2 where the CPU has it (SSE4 otherwise), again whenever
#      the PIL that Python imports is not its own;
#   4. mmworker's dependencies but Pillow (pyproject.toml's, the test extra's: pytest, pytest-timeout,
#      hypothesis, ruff, and the video extra's: PyAV), then mmworker
#      itself with --no-deps (its `pillow` requirement is for other environments: here pip would put
#      plain Pillow over pillow-simd to satisfy it);
#   5. verification: every required codec present and no plain Pillow shadowing pillow-simd.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-$here/.venv}
PILLOW_SIMD_VERSION=12.1.1.post0

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=scripts/venv.sh
. "$here/scripts/venv.sh"

# 1. System packages. Headers only: Pillow decodes PNG with zlib, so libpng is not needed.
#    libturbojpeg0 is the TurboJPEG API of the libjpeg-turbo that pillow-simd links, which decodes
#    large 4:2:0 JPEGs into Y/Cb/Cr planes (mmworker.common.jpeg_planes, loaded with ctypes).
#    ffmpeg: tests/videos.py makes the video corpus with its command line (mmworker itself decodes video
#    with PyAV, which bundles its own FFmpeg; the video tests skip without the command line).
apt_packages=(libjpeg62-turbo-dev libturbojpeg0 zlib1g-dev libwebp-dev pkg-config ffmpeg)
missing=()
for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    say "installing apt packages: ${missing[*]}"
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# 2. Virtual environment.
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PYTHON is older than 3.11"
ensure_venv "$PYTHON" "$VENV"
py="$VENV/bin/python"
"$py" -m pip install -q --upgrade pip

# 3. pillow-simd from source. --no-cache-dir: pip's wheel cache does not key on CC, so a cached
#    SSE4 build would silently be reused for an AVX2 request (and vice versa).
if grep -qw avx2 /proc/cpuinfo; then simd=avx2; cc="cc -mavx2"; else simd=sse4; cc="cc"; fi
stamp="$VENV/.pillow-simd-$PILLOW_SIMD_VERSION-$simd"
# The imported PIL is pillow-simd's when that distribution owns PIL/__init__.py and PIL reports its
# version (mmworker.common.pillow); plain Pillow installed over it (a `pip install` of something that
# requires pillow) fails that, and the build below puts pillow-simd back.
is_pillow_simd='
import importlib.metadata as md, os, sys, PIL._imaging
dist = md.distribution("pillow-simd")
sys.exit(dist.version != PIL.__version__ or not os.path.samefile(dist.locate_file("PIL/__init__.py"), PIL.__file__))'
if [ ! -f "$stamp" ] || ! "$py" -c "$is_pillow_simd" 2>/dev/null; then
    say "building pillow-simd $PILLOW_SIMD_VERSION ($simd)"
    "$py" -m pip uninstall -q -y pillow pillow-simd >/dev/null 2>&1 || true
    CC="$cc" "$py" -m pip install -q --no-cache-dir --no-binary pillow-simd "pillow-simd==$PILLOW_SIMD_VERSION"
    rm -f "$VENV"/.pillow-simd-*
    touch "$stamp"
fi

# 4. The project's dependencies but Pillow, read from pyproject.toml (the test and video extras' too, so
#    the test tools, pytest-timeout included, and PyAV are installed on every run), then the project itself
#    without them. The constraint makes pip fail loudly, rather than install plain Pillow over
#    pillow-simd, should any of them ever come to require Pillow.
mapfile -t deps < <("$py" - <<'PY'
import re
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
extras = project["optional-dependencies"]
for requirement in project["dependencies"] + extras["test"] + extras["video"]:
    if re.match(r"[A-Za-z0-9._-]+", requirement)[0].lower() != "pillow":
        print(requirement)
PY
)
((${#deps[@]})) || die "no dependencies read from pyproject.toml"
no_pillow=$(mktemp)
trap 'rm -f "$no_pillow"' EXIT
echo "pillow<0" >"$no_pillow"
"$py" -m pip install -q -c "$no_pillow" "${deps[@]}"
"$py" -m pip install -q --no-deps -e .

# 5. Verify what the build produced; fail loudly rather than run with a missing codec.
"$py" - "$simd" <<'PY'
import importlib.metadata as md
import sys

from PIL import Image, features

problems = []
try:
    md.distribution("pillow")
    problems.append("plain Pillow is installed and shadows pillow-simd (pip uninstall pillow, rerun setup)")
except md.PackageNotFoundError:
    pass
try:
    dist = md.distribution("pillow-simd")
except md.PackageNotFoundError:
    problems.append("pillow-simd is not installed")
else:
    owned = {str(f) for f in dist.files or ()}
    if "PIL/__init__.py" not in owned:
        problems.append("the imported PIL package does not belong to pillow-simd")
for codec in ("jpg", "zlib", "webp"):
    if not features.check(codec):
        problems.append(f"codec {codec!r} is missing from the pillow-simd build")
from mmworker.common.jpeg_planes import turbojpeg
from mmworker.common.pillow import IS_PILLOW_SIMD
if not IS_PILLOW_SIMD:
    problems.append("mmworker does not see pillow-simd as the installed PIL (mmworker.common.pillow)")
if turbojpeg() is None:
    problems.append("libturbojpeg.so.0 is not loadable (apt's libturbojpeg0)")
if problems:
    sys.exit("[setup] ERROR: " + "; ".join(problems))
print(f"[setup] ok: pillow-simd {Image.__version__} ({sys.argv[1]}), "
      f"libjpeg-turbo {features.version('libjpeg_turbo')} (libturbojpeg too), zlib {features.version('zlib')}, webp {features.version('webp')}")
PY
