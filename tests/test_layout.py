"""The package's shape: small modules, no import cycles, one set of error codes."""

from __future__ import annotations

import ast
from pathlib import Path

import meshant
import meshant.errors
from meshant.protocol.codes import Code

PACKAGE = Path(meshant.__file__).parent
MAX_LINES = 600
# Known exceptions, each to be removed by the work that fixes it.
TOO_LONG: set[str] = set()  # none: keep it so


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The meshant modules ``name`` imports when it is imported: module-level and
    class-level imports, not those in functions or under ``if TYPE_CHECKING:``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def walk(nodes: list[ast.stmt]) -> None:
        for n in nodes:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(n, ast.If) and _type_checking(n):
                walk(n.orelse)
                continue
            if isinstance(n, ast.Import):
                found.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    up = package.split(".")[: len(package.split(".")) - (n.level - 1)]
                    base = ".".join([*up, base] if base else up)
                for a in n.names:
                    sub = f"{base}.{a.name}"
                    found.add(sub if sub in mods else base)
            walk([c for c in ast.iter_child_nodes(n) if isinstance(c, ast.stmt)])

    walk(ast.parse(path.read_text(encoding="utf-8")).body)
    return {m for m in found if m in mods and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_is_over_600_lines() -> None:
    lines = {name: len(path.read_text(encoding="utf-8").splitlines())
             for name, path in _modules().items()}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert set(long) - TOO_LONG == set(), f"over {MAX_LINES} lines: {long}"
    fixed = {name for name in TOO_LONG if lines.get(name, 0) <= MAX_LINES}
    assert not fixed, f"no longer over {MAX_LINES} lines: drop {fixed} from TOO_LONG"


def test_no_import_cycles_among_meshant_modules() -> None:
    mods = _modules()
    graph = {name: _imports(name, path, mods) for name, path in mods.items()}
    assert len(graph) > 40 and graph["meshant.core.scheduler"]  # the parse found them
    cycles = _cycles(graph)
    assert cycles == [], f"import cycles: {[sorted(c) for c in cycles]}"


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]


def test_every_error_code_is_a_code() -> None:
    classes = [c for c in vars(meshant.errors).values()
               if isinstance(c, type) and issubclass(c, meshant.errors.MeshantError)]
    assert len(classes) > 10
    for cls in classes:
        assert cls.code in set(Code), cls
    assert issubclass(meshant.ProtocolError, meshant.MeshantError)
