"""mmworker: image preprocessing for SGLang (the Qwen-VL and Inkling families), bit-exact, as a worker pool."""

from mmworker.errors import MmError, Outcome, UsageError

__all__ = ["MmError", "Outcome", "PoolConfig", "Reply", "UsageError", "WorkerPool", "__version__", "to_sglang"]


def _version() -> str:
    """pyproject.toml's version: read from it in a source checkout (an editable install's metadata
    keeps the version it was installed with), else from the installed package's metadata."""
    from pathlib import Path

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        try:
            project = tomllib.loads(pyproject.read_text()).get("project", {})
        except (OSError, tomllib.TOMLDecodeError):
            project = {}
        if project.get("name") == "mmworker" and isinstance(project.get("version"), str):
            return project["version"]
    from importlib import metadata

    try:
        return metadata.version("mmworker")
    except metadata.PackageNotFoundError:
        return "0+unknown"  # neither installed nor a checkout: a copied tree


def __getattr__(name: str):
    # The pool pulls in ZeroMQ and the families; `import mmworker` for MmError alone stays light.
    if name in ("WorkerPool", "PoolConfig", "Reply", "to_sglang"):
        from mmworker import pool

        return getattr(pool, name)
    if name == "__version__":
        globals()["__version__"] = version = _version()
        return version
    raise AttributeError(f"module 'mmworker' has no attribute {name!r}")
