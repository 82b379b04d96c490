"""The layering the project promises, checked on the source: every import of every module under ipc/ and mmworker/.

    cli, loadtest -> pool -> driver -> families (qwen_vl, inkling) -> common; everyone -> ipc

Each module's imports are read with `ast`, at module level and inside functions (an import in a
function is a dependency all the same), `import x` and `from x import y` alike, relative imports
resolved against the module's package; `from package import name` counts as importing the
submodule when `name` is one. A violation names the file, the line, the statement and the rule.
Imports of modules outside the project (numpy, zmq, ...) are checked only for sglang and torch.
"""

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ipc", "mmworker")
FAMILIES = ("mmworker.qwen_vl", "mmworker.inkling")
# What a family may import of mmworker besides its own package.
FAMILY_MAY_IMPORT = ("mmworker.common", "mmworker.pipeline", "mmworker.errors")
# Third-party packages only the SGLang plug-in may import (its host's, not mmworker's dependencies).
PLUG_IN_ONLY = ("sglang", "torch")


def within(module: str, *packages: str) -> bool:
    """Whether `module` is one of `packages` or inside one of them."""
    return any(module == p or module.startswith(p + ".") for p in packages)


def broken_rule(importer: str, target: str) -> str | None:
    """The rule that `importer` importing `target` breaks, or None."""
    if within(importer, "ipc") and within(target, "mmworker"):
        return "ipc imports nothing of mmworker"
    if within(importer, "mmworker.common") and within(
        target, *FAMILIES, "mmworker.driver", "mmworker.registry", "mmworker.pool", "mmworker.cli",
        "mmworker.loadtest", "mmworker.sglang",
    ):  # fmt: skip
        return "mmworker.common imports no family, driver, registry, pool, cli, loadtest or sglang"
    for family in FAMILIES:
        if within(importer, family) and within(target, "mmworker") and not within(target, *FAMILY_MAY_IMPORT, family):
            return f"a family imports only {', '.join(FAMILY_MAY_IMPORT)} and its own package ({family})"
    if within(importer, "mmworker.driver") and within(
        target, "mmworker.pool", "mmworker.cli", "mmworker.loadtest", "mmworker.registry", *FAMILIES
    ):
        return "mmworker.driver imports no pool, cli, loadtest, registry or family"
    if within(importer, "mmworker.pool") and within(target, "mmworker.cli", "mmworker.loadtest"):
        return "mmworker.pool never imports mmworker.cli or mmworker.loadtest"
    if within(target, *PLUG_IN_ONLY) and not within(importer, "mmworker.sglang"):
        return f"only mmworker.sglang imports {' or '.join(PLUG_IN_ONLY)}"
    return None


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    importer: str
    target: str
    statement: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.target} (`{self.statement}`): {self.rule}"


def imported_modules(module: str, is_package: bool, tree: ast.AST, known: set[str]) -> list[tuple[ast.stmt, str]]:
    """(statement, module it imports) for every import anywhere in `tree`, the source of `module`."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    raise ValueError(f"{module}:{node.lineno}: relative import beyond the top-level package")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.append((node, submodule if submodule in known else base))
    return found


def check_source(module: str, source: str, *, path: str, is_package: bool = False,
                 known: frozenset[str] = frozenset()) -> list[Violation]:  # fmt: skip
    """The layering violations in one module's source (`known`: the project's module names, to tell
    `from package import submodule` from `from module import name`)."""
    tree = ast.parse(source, filename=path)
    violations = []
    for node, target in imported_modules(module, is_package, tree, set(known)):
        rule = broken_rule(module, target)
        if rule is not None:
            violations.append(Violation(path, node.lineno, module, target, ast.unparse(node), rule))
    return violations


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module under the checked packages, by dotted name."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def check_tree(root: Path = ROOT) -> tuple[list[Violation], int]:
    """(violations, number of imports read) over every module under ipc/ and mmworker/."""
    modules = project_modules(root)
    known = frozenset(modules)
    violations, imports = [], 0
    for name, path in modules.items():
        source = path.read_text()
        is_package = path.name == "__init__.py"
        imports += len(imported_modules(name, is_package, ast.parse(source), set(known)))
        rel = str(path.relative_to(root))
        violations += check_source(name, source, path=rel, is_package=is_package, known=known)
    return violations, imports


def test_the_tree_keeps_its_layers():
    violations, imports = check_tree()
    assert imports > 200  # every module was read: a checker that saw nothing would pass anything
    assert not violations, "layering violations:\n" + "\n".join(map(str, violations))


KNOWN = frozenset({"mmworker", "mmworker.pool", "mmworker.pool.client", "mmworker.qwen_vl", "mmworker.qwen_vl.spec",
                   "mmworker.common", "mmworker.common.png", "mmworker.errors", "mmworker.sglang"})  # fmt: skip


@pytest.mark.parametrize(
    ("module", "is_package", "source", "line", "target"),
    [
        # a function-level import in ipc
        ("ipc.fake", False, "import os\n\ndef f():\n    from mmworker.pool import client\n", 4, "mmworker.pool.client"),
        # a relative import out of common into a family
        ("mmworker.common.fake", False, "from ..qwen_vl import spec\n", 1, "mmworker.qwen_vl.spec"),
        # a relative import from a package's __init__ resolves against the package itself
        ("mmworker.common", True, "from .png import decode\nfrom ..pool import WorkerPool\n", 2, "mmworker.pool"),
        # a family reaching above its layer, `import x` form
        ("mmworker.inkling.fake", False, "import numpy\nimport mmworker.driver\n", 2, "mmworker.driver"),
        # a family importing another family
        ("mmworker.inkling.family", False, "from mmworker.qwen_vl import spec\n", 1, "mmworker.qwen_vl.spec"),
        # the driver importing the registry
        ("mmworker.driver", False, "def g():\n    import mmworker.registry as r\n", 2, "mmworker.registry"),
        # the pool importing the CLI
        ("mmworker.pool.reply", False, "from mmworker.cli import main\n", 1, "mmworker.cli"),
        # sglang and torch outside the plug-in
        ("mmworker.pool.reply", False, "from sglang.srt.utils import ImageData\n", 1, "sglang.srt.utils"),
        ("mmworker.driver", False, "import torch\n", 1, "torch"),
    ],
)
def test_the_checker_catches_a_violation(module, is_package, source, line, target):
    [violation] = check_source(module, source, path="synthetic.py", is_package=is_package, known=KNOWN)
    assert (violation.line, violation.importer, violation.target) == (line, module, target)
    assert str(violation).startswith(f"synthetic.py:{line}: {module} imports {target} (`")


def test_the_checker_allows_what_the_layers_allow():
    allowed = {
        "mmworker.qwen_vl.family": "import numpy\nfrom mmworker.common import png\nfrom . import spec\n"
        "from mmworker.pipeline import Family\nfrom mmworker.errors import MmError\n",
        "mmworker.pool.client": "import zmq\nfrom ipc.wire import Job\nfrom mmworker.driver import process\n"
        "from mmworker.registry import pipeline_from_spec\n",
        "mmworker.sglang.plan": "import torch\nfrom sglang.srt.utils import ImageData\nfrom mmworker.pool import client\n",
        "mmworker.cli": "from mmworker.pool import WorkerPool\nfrom mmworker.loadtest import app\n",
        "ipc.ring": "import numpy as np\nfrom ipc.segment import Segment\nfrom .errors import IpcError\n",
    }
    for module, source in allowed.items():
        assert check_source(module, source, path="synthetic.py", known=KNOWN) == [], module


def test_a_relative_import_past_the_top_is_an_error():
    with pytest.raises(ValueError, match="beyond the top-level package"):
        check_source("ipc.fake", "from ... import x\n", path="synthetic.py")
