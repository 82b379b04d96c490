#!/usr/bin/env bash
# Fetch the reference Rust extension `_multimodal` from the sglang 0.5.23 wheel into
# .cache/ref_ext/ (gitignored). Safe to run again (idempotent).
#
# It is a benchmark yardstick and parity oracle ONLY: never committed, never imported by
# mmworker, never pip-installed (the wheel pins 139 requirements incl. plain Pillow).
# Tests that use it must skip when .cache/ref_ext/ is absent.
#   PYTHONPATH=.cache/ref_ext .venv/bin/python -c "import _multimodal; print(_multimodal.__all__)"
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
SGLANG_VERSION=0.5.23
DEST=${DEST:-$here/.cache/ref_ext}
py=${PY:-$here/.venv/bin/python}
[ -x "$py" ] || py=python3

say() { printf '[ref-ext] %s\n' "$*"; }
die() { printf '[ref-ext] ERROR: %s\n' "$*" >&2; exit 1; }

if ! compgen -G "$DEST/_multimodal*.so" >/dev/null; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    say "downloading sglang $SGLANG_VERSION wheel (~40 MB, no dependencies)"
    "$py" -m pip download -q --no-deps "sglang==$SGLANG_VERSION" -d "$tmp" \
        || die "pip download sglang==$SGLANG_VERSION failed (no wheel for this Python/arch? only cp311-313 exist)"
    whl=$(ls "$tmp"/sglang-"$SGLANG_VERSION"-*.whl 2>/dev/null | head -n1)
    [ -n "$whl" ] || die "no sglang wheel was downloaded"
    mkdir -p "$DEST"
    "$py" - "$whl" "$DEST" <<'PY'
import os
import sys
import zipfile

whl, dest = sys.argv[1], sys.argv[2]
prefix = "sglang/srt/rust_extensions/_multimodal"
n = 0
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith(prefix) and name.endswith(".so"):
            out = os.path.join(dest, os.path.basename(name))
            with z.open(name) as src, open(out + ".part", "wb") as dst:
                dst.write(src.read())
            os.replace(out + ".part", out)
            print(f"[ref-ext] extracted {os.path.basename(name)}")
            n += 1
if not n:
    sys.exit("[ref-ext] ERROR: no _multimodal*.so in the wheel")
PY
    rm -f "$whl"
fi

PYTHONPATH="$DEST" "$py" -c "import _multimodal; print('[ref-ext] ok:', _multimodal.__file__, _multimodal.__all__)"
