"""Process-level settings for a process that does mmworker work: allocator, thread counts, Pillow memory.

They must be in the environment before the interpreter starts (glibc reads MALLOC_* once, Pillow
reads PILLOW_* at import, numba/BLAS read theirs at first use), so processes we start get them in
their environment and a command-line entry point can re-execute itself with them.

Why each one:
- MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_: large buffers come from a heap that is reused
  instead of fresh mmapped pages; page faults on fresh image-sized buffers cost more than SIMD saves.
- PILLOW_BLOCK_SIZE: one memory block per image (up to 1 GiB), so decoded and resized images can
  be viewed in place (mmworker.common.pixels) instead of copied out twice.
- PILLOW_BLOCKS_MAX=0: Pillow keeps no freed blocks of its own. They go back to the (untrimmed)
  heap, which reuses them just as well and for anything, numpy included: a freed decoded image's
  memory can then hold the resized image and the output, where Pillow's own cache would keep the
  resize's intermediate image out of the heap's reach and raise each image's peak memory.
- *_NUM_THREADS = 1: concurrency comes from processes; no library may start a pool of its own.
"""

import os
import sys

# Modules whose classes numba's on-disk cache unpickles when it loads a compiled kernel.
_CACHE_UNPICKLES = ("numba", "llvmlite", "copyreg", "builtins")

TUNED_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(16 << 30),
    "PILLOW_BLOCK_SIZE": "1024m",
    "PILLOW_BLOCKS_MAX": "0",
    "NUMBA_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def tuned_environ(base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of `base` (default os.environ) with the tuned settings applied."""
    env = dict(os.environ if base is None else base)
    env.update(TUNED_ENV)
    return env


def is_tuned(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return all(env.get(k) == v for k, v in TUNED_ENV.items())


def reexec_tuned() -> None:
    """Replace this process with itself under the tuned environment, unless it already has it."""
    if not is_tuned():
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], tuned_environ())


def install_pickle_tripwire(report_path: str) -> None:
    """Record (in `report_path`) any unpickling of a class from outside numba's kernel cache.

    Nothing mmworker receives is ever unpickled; this proves it at run time: an audit hook sees
    every `pickle.find_class`, and anything but numba loading its own cached kernels is written to
    `report_path` (tests read it) and to stderr. It never raises: the hook is a tripwire, not a fix.
    """

    def hook(event: str, args: tuple) -> None:
        if event == "pickle.find_class" and not str(args[0]).startswith(_CACHE_UNPICKLES):
            line = f"pid {os.getpid()}: unpickling {args[0]}.{args[1]}\n"
            sys.stderr.write("mmworker tripwire: " + line)
            with open(report_path, "a") as f:
                f.write(line)

    sys.addaudithook(hook)
