"""Runs tests/sglang_env (the SGLang plug-in against SGLang's own processor), and the suites that depend
on the installed PIL, inside SGLang's environment (stock Pillow 13, numba 0.65.1).

    bash scripts/setup_sglang.sh && .venv/bin/python -m pytest tests/test_sglang_env.py

Those tests need SGLang 0.5.23, torch and stock Pillow, which cannot share mmworker's own venv
(pillow-simd); scripts/setup_sglang.sh builds that environment (.venv-sglang) and installs mmworker
into it the documented way, `pip install <checkout>`. This test first checks that the installed copy
is this checkout's code (a stale install would test old code), then runs the directory with that
interpreter's pytest and fails with its output; likewise the resize, decode and pipeline suites, which
there run against stock Pillow instead of .venv's pillow-simd. Skipped when the environment does not exist
($MMWORKER_SGLANG_PYTHON names another interpreter); .ci/run builds it.
"""

import filecmp
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SGLANG_TESTS = ROOT / "tests" / "sglang_env"
# The suites whose results depend on which PIL and numba are installed.
STOCK_PILLOW_SUITES = ("test_resize.py", "test_qwen_parity.py", "test_qwen.py", "test_decode.py",
                       "test_jpeg_rows.py", "test_png.py")  # fmt: skip


@pytest.fixture(scope="module")
def sglang_python() -> Path:
    python = Path(os.environ.get("MMWORKER_SGLANG_PYTHON") or ROOT / ".venv-sglang" / "bin" / "python")
    if not python.exists():
        pytest.skip(f"no SGLang environment at {python} (bash scripts/setup_sglang.sh builds it)")
    return python


def test_installed_copy_is_this_checkout(sglang_python):
    where = subprocess.run(
        [str(sglang_python), "-P", "-c", "import mmworker, ipc; print(mmworker.__path__[0]); print(ipc.__path__[0])"],
        capture_output=True, text=True, cwd="/", timeout=120,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    installed = [Path(p) for p in where.stdout.split()]
    checkout = [(ROOT / name).resolve() for name in ("mmworker", "ipc")]
    assert [p.resolve() for p in installed] != checkout, f"mmworker is imported from the checkout: {installed}"
    stale = []
    for package, copy in zip(("mmworker", "ipc"), installed, strict=True):
        for source in (ROOT / package).rglob("*.py"):
            target = copy / source.relative_to(ROOT / package)
            if not target.exists() or not filecmp.cmp(source, target, shallow=False):
                stale.append(str(source.relative_to(ROOT)))
    assert not stale, f"the installed mmworker is not this checkout ({stale[:5]}...): run scripts/setup_sglang.sh"


def _pytest(python: Path, *targets: Path) -> None:
    proc = subprocess.run(
        [str(python.parent / "pytest"), "-q", "-p", "no:cacheprovider", "-x", *map(str, targets)],
        capture_output=True, text=True, cwd=ROOT, timeout=1500, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, f"{targets} failed in {python}:\n{proc.stdout[-12000:]}\n{proc.stderr[-4000:]}"


def test_plugin_in_sglangs_environment(sglang_python):
    _pytest(sglang_python, SGLANG_TESTS)


def test_stock_pillow_13_and_sglangs_numba(sglang_python):
    """The suites whose results depend on the installed PIL and numba, where PIL is stock Pillow 13 and
    numba SGLang's pin (0.65.1): the pil mode against the live Pillow, aten_u8 without pillow-simd,
    the decoders against their goldens."""
    _pytest(sglang_python, *(ROOT / "tests" / name for name in STOCK_PILLOW_SUITES))
