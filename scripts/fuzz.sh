#!/usr/bin/env bash
# Long fuzzing run of tests/test_fuzz.py: N examples per target (default 20000; CI runs 300).
#   scripts/fuzz.sh [N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MMWORKER_FUZZ_EXAMPLES=${1:-20000} exec .venv/bin/python -m pytest tests/test_fuzz.py -q -p no:cacheprovider
