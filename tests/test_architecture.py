"""The package's structure: no import cycles, modules and functions of a readable size, the layers kept.

- **Cycles**: the graph is every import statement between ``xpuspec`` modules as grimp reads them:
  imports inside functions count (a lazy import is still a dependency, only a later one), and so do
  imports under ``if TYPE_CHECKING:`` (grimp reports them like any other; a type names the module it
  comes from, so a type-only import back is a cycle of design if not of execution: declare a Protocol
  of what the importer uses instead). :data:`COUNT_TYPE_CHECKING_IMPORTS` is that decision. Each
  strongly connected component of more than one module is a cycle, reported as a chain of imports
  that closes on itself.
- **Sizes**: no module under ``xpuspec/`` over :data:`MAX_MODULE_LINES` lines, no function (or
  method, nested functions included) over :data:`MAX_FUNCTION_LINES` lines from its ``def`` line to
  its last. A function may exceed it where a comment on its ``def`` line or on the line above (above
  its decorators, if any) says ``size-limit:`` and why, e.g. ``# size-limit: one table of the
  plugin's properties, read top to bottom``; a module, where such a comment stands in its first
  :data:`MODULE_EXEMPTION_LINES` lines.
- **Layers**: ``lint-imports`` passes with the repository's ``.importlinter`` (the layers of
  docs/architecture.md, no OpenVINO below the executors, torch only in ``xpuspec.prepare``, and the
  plugins package ``xpuspec_plugins`` below the apps, loaded by the registry, torch only in its runner).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "xpuspec"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MODULE_EXEMPTION_LINES = 10
EXEMPTION = "size-limit:"
COUNT_TYPE_CHECKING_IMPORTS = True  # see the module's docstring


def _import_graph() -> dict[str, set[str]]:
    """Every ``xpuspec`` module and the ``xpuspec`` modules it imports directly."""
    try:
        import grimp
    except ImportError:  # pragma: no cover - a dev dependency (import-linter's)
        pytest.fail("grimp is not installed: install import-linter (the test extra)")
    graph = grimp.build_graph(
        "xpuspec", cache_dir=None, exclude_type_checking_imports=not COUNT_TYPE_CHECKING_IMPORTS
    )
    return {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative: the graph is deeper than the recursion limit
    allows for), those of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _cycle_in(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One chain of imports within ``component`` from its first module back to it (breadth first)."""
    members = set(component)
    start = component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges.get(node, set()) & members):
                if child == start:
                    chain = [node]
                    while chain[-1] != start:
                        chain.append(came_from[chain[-1]])
                    return [start, *reversed(chain[:-1]), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return component  # unreachable for a strongly connected component


def test_no_import_cycles() -> None:
    edges = _import_graph()
    cycles = [_cycle_in(component, edges) for component in _strongly_connected(edges)]
    assert not cycles, "import cycles among xpuspec modules:\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


def test_tarjan_finds_each_cycle_once() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"g"}, "g": {"f"}}
    components = _strongly_connected(edges)
    assert components == [["a", "b", "c"], ["f", "g"]]
    assert _cycle_in(["a", "b", "c"], edges) == ["a", "b", "c", "a"]


def _exempt(lines: list[str], line_number: int) -> bool:
    """A ``size-limit:`` comment with a reason on line ``line_number`` (1-based) or the line above."""
    for number in (line_number, line_number - 1):
        if 1 <= number <= len(lines):
            _, hash_sign, comment = lines[number - 1].partition("#")
            _, marker, reason = comment.partition(EXEMPTION)
            if hash_sign and marker and reason.strip():
                return True
    return False


def _oversized(path: Path, root: Path = ROOT) -> list[str]:
    """What in ``path`` breaks the size limits without a ``size-limit:`` reason (named from ``root``)."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    name = path.relative_to(root)
    found = []
    if len(lines) > MAX_MODULE_LINES and not any(
        _exempt(lines, number) for number in range(1, MODULE_EXEMPTION_LINES + 1)
    ):
        found.append(f"{name}: {len(lines)} lines (limit {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = node.end_lineno - node.lineno + 1
        first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
        if length > MAX_FUNCTION_LINES and not (_exempt(lines, node.lineno) or _exempt(lines, first)):
            found.append(f"{name}:{node.lineno} {node.name}: {length} lines (limit {MAX_FUNCTION_LINES})")
    return found


def test_modules_and_functions_within_the_size_limits() -> None:
    oversized = [entry for path in sorted(PACKAGE.rglob("*.py")) for entry in _oversized(path)]
    assert not oversized, (
        "over the size limits (split by concept, or say why on the def line: `# size-limit: <why>`):\n"
        + "\n".join(oversized)
    )


def test_a_size_limit_comment_needs_a_reason(tmp_path: Path) -> None:
    body = "\n".join(f"    x = {index}" for index in range(MAX_FUNCTION_LINES))
    sources = {
        "plain": f"def long():\n{body}\n",
        "reasoned": f"# size-limit: one table, read top to bottom\ndef long():\n{body}\n",
        "bare": f"def long():  # size-limit:\n{body}\n",
    }
    found = {}
    for name, source in sources.items():
        path = tmp_path / f"{name}.py"
        path.write_text(source, encoding="utf-8")
        found[name] = _oversized(path, tmp_path)
    assert found["plain"] and found["bare"] and not found["reasoned"]


def test_the_layers_hold() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    if not lint_imports.is_file():  # pragma: no cover - a dev dependency
        pytest.fail(f"import-linter is not installed beside {sys.executable}: install the test extra")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [str(lint_imports), "--no-cache", "--no-logo", str(ROOT / ".importlinter")],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
