"""The README stays true: its two commands exist as written, and its embedding example runs."""

import re
import subprocess
import sys
from pathlib import Path

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_exactly_two_commands_and_ci_runs_the_test_one():
    block = re.search(r"## Two commands.*?```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == [
        "./scripts/setup.sh && .venv/bin/mmworker loadtest",
        "./scripts/setup.sh && .venv/bin/python -m pytest",
    ]
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert commands[1] in ci


def test_embedding_example_runs():
    section = README.split("## Embedding in the SGLang scheduler", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 8 and all("(1564, 1176) [[1, 34, 46]] (3, 395)" in line for line in lines)
