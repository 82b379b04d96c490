"""SGLang's real TokenizerManager picks the plug-in by the environment variable, and its scheduler gets SGLang's bytes.

tokenizer_manager_check.py runs in a process of its own (see its docstring); this test reads its report.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_tokenizer_manager_serves_through_mmworker(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "tokenizer_manager_check.py"), str(out)],
        capture_output=True, text=True, timeout=600, cwd=HERE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]), "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert proc.returncode == 0 and out.exists(), proc.stderr[-6000:]
    report = json.loads(out.read_text())
    assert report["processor"] == "mmworker.sglang.qwen_vl.MmworkerQwenVLProcessor", report["processor"]
    for case in report["cases"]:
        assert case["ids_equal"] and all(case["features_equal"]) and all(case["offsets_equal"]), case
        assert case["mrope_equal"] and case["pad_values_from_hash"], case
        # SGLang copied the features into its message to the scheduler and dropped its tensors:
        # the ring memory is back with the workers.
        assert case["shm_held_after_dispatch"] == 0, case
    assert report["stats"]["served"] == len(report["cases"]) and report["stats"]["delegated"] == 0, report["stats"]
