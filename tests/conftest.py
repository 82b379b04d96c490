"""Shared test setup: golden-fixture paths, the optional reference Rust extension, the per-test timeout's plugin."""

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
GOLDEN = TESTS / "golden"
REF_EXT = TESTS.parent / ".cache" / "ref_ext"

# tests/golden/sources.py rebuilds fixture sources; tests/ holds the small reference helpers.
for path in (GOLDEN, TESTS):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


# tests/sglang_env needs SGLang, which only SGLang's own environment has (tests/test_sglang_env.py
# runs it there); elsewhere it is not collected.
if importlib.util.find_spec("sglang") is None:
    collect_ignore = ["sglang_env"]


def pytest_configure(config: pytest.Config) -> None:
    # pyproject.toml's per-test timeout is pytest-timeout's: without the plugin pytest only warns of
    # an unknown option, and a hung test would stall the run with no traceback.
    if not config.pluginmanager.hasplugin("timeout"):
        raise pytest.UsageError(
            "pytest-timeout is not active (install the `test` extra, as scripts/setup.sh does; "
            "to run without a per-test timeout, keep the plugin and pass --timeout=0)"
        )


def load_golden(name: str) -> dict:
    return json.loads((GOLDEN / name).read_text())


@pytest.fixture(scope="session")
def rust_ext():
    """The sglang 0.5.23 Rust extension (scripts/get_reference_ext.sh), a parity oracle only."""
    if not REF_EXT.is_dir():
        pytest.skip("reference Rust extension not fetched (scripts/get_reference_ext.sh)")
    sys.path.insert(0, str(REF_EXT))
    try:
        return importlib.import_module("_multimodal")
    except ImportError as exc:
        pytest.skip(f"reference Rust extension not importable: {exc}")
    finally:
        sys.path.remove(str(REF_EXT))
