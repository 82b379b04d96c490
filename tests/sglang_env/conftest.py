"""pytest's view of tests/sglang_env: the shared builders live in plugin_env (imported first: it stubs sgl_kernel)."""

import plugin_env  # noqa: F401
