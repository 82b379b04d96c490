"""The names inside a worker's Done (tensors, meta keys): the worker names them, the client reads them back.

    tensors  "input_ids"          int64 [L], the expanded prompt
             "positions"          the family's M-RoPE positions (absent under 1-D positions)
             "feature.<i>"        item i's feature, in whatever dtype and shape its family makes it
             "aux.<i>.<name>"     item i's aux tensor <name> (e.g. a patch grid), dtype and shape kept
    meta     "offsets"            [[start, end], ...] inclusive, per item: its span
             "runs"               [[start, end, start, end, ...], ...] per item, its placeholder runs
                                  (inclusive pairs, flattened: the wire nests lists two deep at most)
             "modalities"         ["IMAGE" | "VIDEO", ...] per item (the images, then the videos)
             "hashes"             [int, ...] per item
             "delta"              the M-RoPE position delta (absent under 1-D positions)
             "grids"              [[t, h, w], ...] per item, its patch grid (what the cache keeps)

An item the client has cached (a job's "known" items) has no feature or aux tensors here: the
client has them. A feature's descriptor names the ring it lies in: the worker's ring, or its cache
partition (mmworker.pool.cache).

Every tensor lies in the worker's ring, so on the client each is a view; `unpack` sorts them by role.
"""

from collections.abc import Container, Mapping, Sequence
from typing import Any, TypeVar

INPUT_IDS = "input_ids"
POSITIONS = "positions"
_FEATURE = "feature."
_AUX = "aux."

OFFSETS = "offsets"
RUNS = "runs"
MODALITIES = "modalities"
HASHES = "hashes"
DELTA = "delta"
GRIDS = "grids"

T = TypeVar("T")


def feature_name(item: int) -> str:
    return f"{_FEATURE}{item}"


def aux_name(item: int, name: str) -> str:
    return f"{_AUX}{item}.{name}"


def feature_item(name: str) -> int | None:
    """The item a feature tensor's name is for; None for any other name."""
    if not name.startswith(_FEATURE):
        return None
    try:
        return int(name[len(_FEATURE) :])
    except ValueError:
        return None


def pack_runs(runs: Sequence[Sequence[tuple[int, int]]]) -> list[list[int]]:
    """Each item's runs as the meta carries them: [start, end, start, end, ...]."""
    return [[int(bound) for run in item for bound in run] for item in runs]


def runs_of(rows: Any, items: int) -> list[tuple[tuple[int, int], ...]]:
    """Each item's runs from their meta form (`pack_runs`); ValueError unless there is one list per
    item, each a non-empty even-length list of ints."""
    if not isinstance(rows, list) or len(rows) != items:
        raise ValueError(f"runs for {len(rows) if isinstance(rows, list) else '?'} items, not {items}")
    out = []
    for row in rows:
        if not isinstance(row, list) or not row or len(row) % 2 or not all(type(v) is int for v in row):
            raise ValueError(f"malformed runs {row!r}")
        out.append(tuple(zip(row[::2], row[1::2], strict=True)))
    return out


def unpack(
    tensors: Mapping[str, T], items: int, known: Container[int] = ()
) -> tuple[T, T | None, list[T | None], list[dict[str, T]]]:
    """(input_ids, positions or None, each item's feature, each item's aux tensors by name) of a Done
    with `items` items, the `known` ones without features (None in their places). KeyError if a
    tensor is missing, IndexError or ValueError if a name points at an item the request lacks or
    is malformed: what a worker sends is checked, never trusted."""
    auxes: list[dict[str, T]] = [{} for _ in range(items)]
    for name, tensor in tensors.items():
        if name.startswith(_AUX):
            _, item, key = name.split(".", 2)
            index = int(item)
            if index < 0:  # a list would take it from the end
                raise IndexError(f"tensor {name!r}: no item {index}")
            auxes[index][key] = tensor
    features = [None if i in known else tensors[f"{_FEATURE}{i}"] for i in range(items)]
    return tensors[INPUT_IDS], tensors.get(POSITIONS), features, auxes
