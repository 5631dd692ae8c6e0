"""What ships: the runtime imports no conversion stack outside xpuspec.prepare, and the wheel holds the
package, its plugins as `xpuspec_plugins` and its model data, and none of the lab (research/) or tests."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# torch and what loads it; the runtime (engine, server, Python API) must run on an edge device without them.
CONVERSION_STACK = ("torch", "transformers", "optimum", "safetensors.torch")
# Where the conversion stack may be imported: `xpuspec prepare` and what it alone runs.
CONVERSION_PACKAGE = ROOT / "xpuspec" / "prepare"
# The built-in plugins (installed as xpuspec_plugins). The PyTorch plugin is opt-in, present only where
# torch imports: its runner alone may import torch (and IPEX), inside its functions, so that loading the
# plugins never loads torch.
PLUGINS = ROOT / "plugins"
TORCH_PLUGIN_RUNNER = PLUGINS / "torch_runner.py"
TORCH_PLUGIN_STACK = (*CONVERSION_STACK, "intel_extension_for_pytorch")
# Not copied to build the wheel: version control, environments and what tools leave behind.
_NOT_SOURCE = (".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", ".*_cache", ".hypothesis")
_NOT_SOURCE += ("runs", "bench-report")


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every module an ``import`` names anywhere in the tree (function bodies too), with its line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from safetensors import torch` loads safetensors.torch as surely as its dotted form.
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _is_conversion_stack(module: str, stack: tuple[str, ...] = CONVERSION_STACK) -> bool:
    return any(module == name or module.startswith(name + ".") for name in stack)


def _lines_in_functions(tree: ast.AST) -> set[int]:
    """The lines of the imports inside function bodies: run when called, not when the module loads."""
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return {
        node.lineno
        for function in functions
        for node in ast.walk(function)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    }


def test_only_prepare_imports_torch() -> None:
    offenders = []
    for path in sorted((ROOT / "xpuspec").rglob("*.py")):
        if path.is_relative_to(CONVERSION_PACKAGE):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, module in _imported_modules(tree):
            if _is_conversion_stack(module):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not offenders, "only xpuspec/prepare/ may import torch, transformers or optimum:\n" + "\n".join(
        offenders
    )


def test_plugins_import_torch_only_lazily_in_the_torch_runner() -> None:
    offenders = []
    for path in sorted(PLUGINS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        lazy = _lines_in_functions(tree) if path == TORCH_PLUGIN_RUNNER else set()
        for line, module in _imported_modules(tree):
            if _is_conversion_stack(module, TORCH_PLUGIN_STACK) and line not in lazy:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not offenders, (
        "among the plugins only plugins/torch_runner.py may import torch, inside its functions:\n"
        + "\n".join(offenders)
    )


def _build_wheel(tmp_path: Path) -> zipfile.ZipFile:
    """The wheel as pip builds it, from a copy of the repository (the build writes into its source)."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*command, "-w", str(tmp_path / "wheel"), str(source)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "wheel").glob("xpuspec-*.whl")
    return zipfile.ZipFile(wheel)


def test_wheel_contents(tmp_path: Path) -> None:
    with _build_wheel(tmp_path) as wheel:
        names = wheel.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        plugin_entries = wheel.read(entry_points).decode().split("[xpuspec.plugins]")[1]
    tops = {name.split("/")[0] for name in names}
    assert {"xpuspec", "xpuspec_plugins"} <= tops
    assert not tops & {"plugins", "research", "tests"}, tops
    assert "xpuspec_plugins/cpu.py" in names and "xpuspec_plugins/pytorch.py" in names

    # Every package under xpuspec/ ships (pyproject.toml lists them by hand).
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "xpuspec").rglob("__init__.py")}
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"

    # The shipped models: the default draft and EAGLE-3 head with their training metrics, the demo pair.
    for folder in ("xpuspec/models/default_draft", "xpuspec/models/default_eagle3"):
        assert f"{folder}/training_metrics.json" in names and f"{folder}/draft_stamp.json" in names
    assert any(n.startswith("xpuspec/models/demo/bundle/target/") for n in names)
    assert "xpuspec/models/demo/smollm2_heldout.jsonl" in names
    assert "xpuspec/bench/categories.jsonl" in names  # bench --mode categories' prompts
    assert "xpuspec/bench/heldout_text.jsonl" in names  # the quality measure's text
    # The chat page served at / (and so the edge bundle, which installs this wheel).
    static = {p.relative_to(ROOT).as_posix() for p in (ROOT / "xpuspec/server/static").iterdir()}
    assert static and static <= set(names), sorted(static - set(names))

    # The lab stays in research/: none of its modules where they used to ship.
    lab = {p.stem for p in (ROOT / "research").rglob("*.py") if p.stem not in ("__init__", "conftest")}
    former = ("xpuspec/bench", "xpuspec/models/demo", "xpuspec/structured")
    shipped_lab = sorted(f"{f}/{m}.py" for f in former for m in lab if f"{f}/{m}.py" in names)
    assert not shipped_lab, shipped_lab
    assert not any(n.startswith("xpuspec/bench/traces/") for n in names)

    targets = [line.split("=", 1)[1].strip() for line in plugin_entries.splitlines() if "=" in line]
    assert targets and all(t.startswith("xpuspec_plugins.") for t in targets), targets
