#!/usr/bin/env bash
# Add the video reference decoder to SGLang's environment: torchcodec 0.17.0 (what SGLang 0.5.23 decodes
# video with) and PyAV 16.1 (mmworker's decoder), so that tests/sglang_env/test_video_decode_torchcodec.py
# compares the two frame for frame. Safe to run again (idempotent).
#
# What it does, in order:
#   1. apt's ffmpeg, if missing: torchcodec bundles no FFmpeg and loads the system's shared libraries
#      (libavcodec etc., majors 4-9; Debian 12 has 5.1); the ffmpeg command line also generates the
#      test corpus (tests/videos.py);
#   2. .venv-sglang must exist already (scripts/setup_sglang.sh builds it; this script builds nothing else);
#   3. a record of every installed distribution and version, then torchcodec==0.17.0 and av==16.1.*
#      (pip leaves them alone when already there);
#   4. verification: nothing that was installed before changed version or vanished (torchcodec declares
#      no torch requirement today; should a release ever pull another torch, this fails and says so),
#      both import, torchcodec finds FFmpeg, and the versions are printed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
VENV=${VENV:-$here/.venv-sglang}
TORCHCODEC_VERSION=0.17.0
# PyAV's pin and why: pyproject.toml's `video` extra.
AV_REQUIREMENT="av==16.1.*"

say() { printf '[setup-video-ref] %s\n' "$*"; }
die() { printf '[setup-video-ref] ERROR: %s\n' "$*" >&2; exit 1; }

# 1. System FFmpeg (shared libraries for torchcodec, the CLI for the corpus).
if ! dpkg-query -W -f='${Status}' ffmpeg 2>/dev/null | grep -q 'install ok installed'; then
    say "installing apt package ffmpeg"
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq ffmpeg >/dev/null
fi

# 2. SGLang's environment, built elsewhere.
py="$VENV/bin/python"
[ -x "$py" ] || die "no $VENV (bash scripts/setup_sglang.sh builds it first)"

# 3. The two decoders, recorded around the install.
before=$(mktemp)
after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
freeze() { "$py" -m pip list --format=freeze --disable-pip-version-check 2>/dev/null | sort; }
freeze >"$before"
say "installing torchcodec==$TORCHCODEC_VERSION $AV_REQUIREMENT into $VENV"
say "(on a first install pip lists SGLang requirements that are not installed: expected, its GPU/server stack)"
"$py" -m pip install -q --disable-pip-version-check "torchcodec==$TORCHCODEC_VERSION" "$AV_REQUIREMENT"
freeze >"$after"

# 4. Verify.
if ! PYTHONWARNINGS=ignore "$py" - "$before" "$after" "$TORCHCODEC_VERSION" <<'PY'
import importlib.metadata as md
import sys

before_file, after_file, want_torchcodec = sys.argv[1:]


def versions(path):
    with open(path) as f:
        return dict(line.strip().split("==", 1) for line in f if "==" in line)


before, after = versions(before_file), versions(after_file)
changed = {name: (v, after.get(name)) for name, v in before.items() if after.get(name) != v}
assert not changed, f"installing the video decoders changed SGLang's environment: {changed}"
added = sorted(set(after) - set(before))

import av
import torch
import torchcodec
from torchcodec.decoders import VideoDecoder  # noqa: F401  (loads torchcodec's FFmpeg-linked core)

assert md.version("torchcodec") == want_torchcodec, f"torchcodec {md.version('torchcodec')} != {want_torchcodec}"
assert av.__version__.startswith("16.1."), f"PyAV {av.__version__} is not 16.1.*"
ffmpeg = torchcodec._core.get_ffmpeg_library_versions()
print(f"[setup-video-ref] ok: torchcodec {md.version('torchcodec')} (system FFmpeg {ffmpeg.get('ffmpeg_version')}), "
      f"PyAV {av.__version__} (bundled FFmpeg {av.ffmpeg_version_info}), torch {torch.__version__}; "
      f"added {', '.join(added) or 'nothing (already installed)'}")
PY
then
    die "verification failed (see above)"
fi
