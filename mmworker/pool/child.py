"""How every pool child process (worker, I/O process) starts and stops: lifeline, pinning, logging,
the pickle tripwire, then serve until told to stop or until the parent dies."""

import json
import logging
import os
from collections.abc import Callable
from typing import Protocol

from ipc.lifeline import die_with_parent
from mmworker.runtime import install_pickle_tripwire


class Service(Protocol):
    def serve(self) -> None: ...

    def close(self) -> None: ...


def run_child(argv: list[str], label: str, make: Callable[[dict], Service]) -> int:
    """`python -m <module> '<json args>'`: args carry "parent" (pid), "cores" (a list, or null: not
    pinned), "nice" (added to the parent's) and "sched" ("idle": SCHED_IDLE; "normal")."""
    args = json.loads(argv[1])
    die_with_parent(int(args["parent"]))
    if args["cores"]:
        os.sched_setaffinity(0, {int(c) for c in args["cores"]})
    # Before any thread exists: threads started later (libzmq's) inherit both.
    if args["nice"]:
        os.nice(int(args["nice"]))
    if args["sched"] == "idle":
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    logging.basicConfig(level=logging.WARNING, format=f"[mmworker {label}] %(message)s")
    service = make(args)  # start-up (warm-up, mapping, Hello) happens before the tripwire is set
    if os.environ.get("MMWORKER_PICKLE_TRIPWIRE"):
        install_pickle_tripwire(os.environ["MMWORKER_PICKLE_TRIPWIRE"])
    try:
        service.serve()
    finally:
        service.close()
    return 0
