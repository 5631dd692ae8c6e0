"""The executor tests share the engine tests' tiny exported IR folders (one export per session)."""

from tests.engine.conftest import tiny_ir_dir  # noqa: F401
