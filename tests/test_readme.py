"""The README and docs/ stay true: the two commands exist as written, every Python snippet runs as
written, the example configuration parses to the defaults, the command line has the commands and
options the README names and docs/cli.md names every option it has, docs/architecture.md names
every module of the pool and every registered family, links and section citations resolve, and
the tests the reliability page cites exist."""

import argparse
import dataclasses
import functools
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mmworker.cli import build_parser
from mmworker.pool.config import PoolConfig

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))
EXAMPLE_CONFIG = ROOT / "examples" / "pool.toml"
SNIPPET_TIMEOUT_S = 300  # a pool starts its workers (numba loads its cached kernels) within this


def _python_snippets(path: Path) -> list[tuple[str, str]]:
    """(id, code) of every ```python block of a Markdown file, in order."""
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
    return [(f"{path.relative_to(ROOT)}#{i}", code) for i, code in enumerate(blocks)]


SNIPPETS = [s for path in [ROOT / "README.md", *DOCS] for s in _python_snippets(path)]


@functools.cache
def _run(code: str) -> str:
    """Run `code` as a script in a fresh interpreter from the repository root; its stdout (each
    snippet runs once per session, however many tests look at what it printed)."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_exactly_two_commands_and_ci_runs_the_test_one():
    block = re.search(r"## Two commands.*?```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == [
        "./scripts/setup.sh && .venv/bin/mmworker loadtest",
        "./scripts/setup.sh && .venv/bin/python -m pytest",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci


def test_the_readme_has_a_python_quick_start():
    assert len(_python_snippets(ROOT / "README.md")) >= 3


@pytest.mark.parametrize(("where", "code"), SNIPPETS, ids=[where for where, _ in SNIPPETS])
def test_every_python_snippet_runs_as_written(where, code):
    assert _run(code).strip(), f"{where} printed nothing"


def test_the_quick_starts_print_what_their_comments_say():
    readme = dict(_python_snippets(ROOT / "README.md"))
    first = _run(readme["README.md#0"]).strip()
    assert first == "float32 (1564, 1176) (1, 34, 46)"
    pool = _run(readme["README.md#2"]).strip().splitlines()
    assert pool == [f"{rid} (1564, 1176) True" for rid in range(4)]
    # The family that is not Qwen's: bf16 patches, no M-RoPE keys (docs/api.md).
    [inkling] = [code for _, code in _python_snippets(ROOT / "docs" / "api.md") if 'WorkerPool("inkling"' in code]
    assert _run(inkling).strip().splitlines() == [
        "uint16 (792, 4800)",
        "[960, 1280]",
        "None ['im_token_id', 'input_ids', 'mm_items']",
    ]


def test_the_example_configuration_parses_to_the_defaults():
    config = PoolConfig.from_any(EXAMPLE_CONFIG)
    defaults = PoolConfig()
    for f in dataclasses.fields(PoolConfig):
        if f.name != "media":
            assert getattr(config, f.name) == getattr(defaults, f.name), f.name
    assert config.media_policy() == defaults.media_policy()
    assert config.plan().workers == defaults.plan().workers


def test_the_example_configuration_names_every_key():
    text = EXAMPLE_CONFIG.read_text()
    named = set(re.findall(r"^#?\s*([a-z_]+) = ", text, re.M))
    assert {f.name for f in dataclasses.fields(PoolConfig)} - {"media"} <= named
    media = tomllib.loads(text)["media"]
    assert set(media) == set(PoolConfig().media_policy().to_mapping())


def _options() -> dict[str, set[str]]:
    """Every subcommand's option strings."""
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {name: {o for a in sub._actions for o in a.option_strings} for name, sub in action.choices.items()}
    raise AssertionError("no subcommands")


def test_the_command_line_section_names_real_commands_and_options():
    section = README.split("## Command line", 1)[1].split("\n## ", 1)[0]
    options = _options()
    commands = re.findall(r"`mmworker ([a-z]+)", section)
    assert commands
    for command in commands:
        assert command in options, command
    every = set().union(*options.values())
    for option in set(re.findall(r"(--[a-z][a-z-]+)", section)) - {"--version", "--help"}:
        assert option in every, option
    version = subprocess.run([sys.executable, "-m", "mmworker", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert version.returncode == 0 and version.stdout.startswith("mmworker "), version.stderr


def test_the_cli_page_names_every_option():
    page = (ROOT / "docs" / "cli.md").read_text()
    parser = build_parser()
    hidden = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                hidden |= {o for a in sub._actions if a.help == argparse.SUPPRESS for o in a.option_strings}
    for command, options in _options().items():
        assert f"`mmworker {command}" in page, command
        for option in options - hidden - {"-h", "--help"}:
            assert f"`{option}" in page, f"docs/cli.md does not name {command} {option}"


def test_the_architecture_page_names_every_part_of_the_pool_and_every_family():
    page = (ROOT / "docs" / "architecture.md").read_text()
    table = page.split("## The client's parts", 1)[1].split("\n## ", 1)[0]
    for module in sorted((ROOT / "mmworker" / "pool").glob("*.py")):
        if module.stem != "__init__":
            assert f"`{module.stem}`" in table, f"docs/architecture.md's pool table lacks {module.stem}"
    from mmworker.registry import FAMILIES

    for name, path in FAMILIES.items():
        assert f'"{name}": "{path}"' in page, f"docs/architecture.md does not name family {name} ({path})"


def test_links_stay_inside_the_repository():
    for path in [ROOT / "README.md", *DOCS]:
        text = path.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            assert not target.startswith(("http://", "https://", "/")), f"{path.name}: {target}"
            assert (path.parent / target).exists(), f"{path.name}: {target} does not exist"
        for outside in ("measurements.md", "integration.md", "/work/"):
            assert outside not in text, f"{path.name} points outside the repository: {outside}"


def _cited_sections() -> set[tuple[str, str]]:
    """(file, section) of every "docs/behaviour.md §N" cited in the code, tests and scripts."""
    cited = set()
    for path in [*ROOT.glob("mmworker/**/*.py"), *ROOT.glob("ipc/*.py"), *ROOT.glob("tests/**/*.py"),
                 *ROOT.glob("bench/*.py"), *ROOT.glob("scripts/*.sh")]:  # fmt: skip
        for number in re.findall(r"docs/behaviour\.md §(\d+(?:\.\d+)?)", path.read_text()):
            cited.add((str(path.relative_to(ROOT)), number))
    return cited


def test_cited_sections_of_the_behaviour_spec_exist():
    spec = (ROOT / "docs" / "behaviour.md").read_text()
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", spec, re.M))
    cited = _cited_sections()
    assert cited
    for where, number in sorted(cited):
        assert number in headings, f"{where} cites docs/behaviour.md §{number}, which has no heading"


def test_tests_the_reliability_page_cites_exist():
    page = (ROOT / "docs" / "reliability.md").read_text()
    sources = {p.name: p.read_text() for p in (ROOT / "tests").rglob("test_*.py")}
    checked = 0
    for row in (line for line in page.splitlines() if line.startswith("| ") and "test_" in line):
        current = None
        for token in re.findall(r"`([^`]*)`", row.rsplit("|", 2)[-2]):
            file, _, name = token.rpartition("::") if "::" in token else (token, "", "")
            if file.endswith(".py"):
                current = Path(file).name
                assert current in sources, f"docs/reliability.md cites {file}, which does not exist"
            if name:
                # "name..." stands for every test whose name begins so
                pattern = re.escape(name.rstrip(".")) + (r"\w*" if name.endswith("...") else "") + r"\("
                assert re.search(rf"def {pattern}", sources[current]), f"docs/reliability.md cites {current}::{name}"
                checked += 1
    assert checked > 20
