"""mmworker: Qwen-VL image preprocessing for SGLang, bit-exact with Hugging Face, as a worker pool."""

from mmworker.errors import MmError

__all__ = ["MmError", "PoolConfig", "Reply", "WorkerPool", "to_sglang"]


def __getattr__(name: str):
    # The pool pulls in ZeroMQ and the families; `import mmworker` for MmError alone stays light.
    if name in ("WorkerPool", "PoolConfig", "Reply", "to_sglang"):
        from mmworker import pool

        return getattr(pool, name)
    raise AttributeError(f"module 'mmworker' has no attribute {name!r}")
