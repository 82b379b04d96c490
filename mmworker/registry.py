"""Which family serves a spec: family names, where each family's class lives, every family's bundled specs.

A family is one module and one line here: its name and the import path of a class with
`from_spec(mapping)` that meets the `Family` protocol (mmworker.pipeline). A spec names its family by
that name (`"family": "qwen_vl"`), or by an import path ("package.module:Class") for a family that
lives outside mmworker. Pool workers are fresh interpreters that see only what is on disk, so the
pool hands them the spec with its family resolved to the import path (`worker_spec`): a family
registered in the client process at run time reaches its workers too.
"""

import importlib
from collections.abc import Mapping
from typing import Any

from mmworker.errors import MmError
from mmworker.inkling import NAMED_SPECS as INKLING_SPECS
from mmworker.pipeline import Family
from mmworker.pipeline import spec_mapping as parse_spec
from mmworker.qwen_vl import NAMED_SPECS as QWEN_SPECS

FAMILIES: dict[str, str] = {
    "qwen_vl": "mmworker.qwen_vl:QwenVL",
    "inkling": "mmworker.inkling:Inkling",
}

NAMED_SPECS: dict[str, dict[str, Any]] = {**QWEN_SPECS, **INKLING_SPECS}


def named_spec(name: str) -> dict[str, Any]:
    """A copy of a bundled spec, by checkpoint name (see NAMED_SPECS)."""
    if name not in NAMED_SPECS:
        raise MmError(f"unknown named spec {name!r}; known: {', '.join(NAMED_SPECS)}")
    return parse_spec(name, NAMED_SPECS)


def spec_mapping(spec: Mapping[str, Any] | str) -> dict[str, Any]:
    """`spec` as a new dict: a bundled name ("qwen2_vl", ...), a JSON object's text, or a mapping."""
    return parse_spec(spec, NAMED_SPECS)


def family_path(spec: Mapping[str, Any]) -> str:
    """The import path ("module:Class") of the family a spec names."""
    family = spec.get("family")
    if isinstance(family, str) and family in FAMILIES:
        return FAMILIES[family]
    if isinstance(family, str) and ":" in family:  # a family outside mmworker, by import path
        return family
    raise MmError(f"unknown mm family: {family!r}; known: {', '.join(FAMILIES)}")


def worker_spec(spec: Mapping[str, Any] | str) -> dict[str, Any]:
    """`spec` for a fresh process: a new dict whose family is the import path of its class."""
    spec = spec_mapping(spec)
    return {**spec, "family": family_path(spec)}


def pipeline_from_spec(spec: Mapping[str, Any] | str) -> Family:
    """The family for `spec`: a mapping, a JSON object's text, or a bundled name such as "qwen2_vl"."""
    spec = spec_mapping(spec)
    path = family_path(spec)
    module_name, _, class_name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise MmError(f"mm family {spec.get('family')!r}: cannot load {path}: {exc}") from exc
    return cls.from_spec(spec)
