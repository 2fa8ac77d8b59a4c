"""The package's shape: layers that only look down, no import cycles of any kind, classes
composed rather than mixed, one set of error codes."""

from __future__ import annotations

import ast
from pathlib import Path

import meshant
import meshant.errors
from meshant.protocol.codes import Code

PACKAGE = Path(meshant.__file__).parent

# The layers, lowest first: a module may import from its own layer and those below,
# never from above. Adapters (discovery, CURVE keys) and what is seen from outside
# (observe) are used by the actors; applications (apps: the demo, the benchmarks;
# the conformance kit; the simulator) use the actors; the command line uses them all.
LAYERS: list[tuple[str, ...]] = [
    ("meshant._version", "meshant._extras", "meshant.errors"),
    ("meshant.protocol",),
    ("meshant.core",),
    ("meshant.storage",),
    ("meshant.adapters", "meshant.observe"),
    ("meshant.actors",),
    ("meshant.apps", "meshant.conformance", "meshant.sim", "meshant.testing",
     "meshant.gateways"),
    ("meshant.cli",),
    ("meshant", "meshant.__main__"),
]
# The core's folders, by concern, lowest first: the same rule inside the core (a module
# imports from its own folder and those below). Plain rules (backoff, rights, every
# lifecycle's table, the counters) under all;
# nodes (the registry, liveness); tasks (the model, its lifecycle, the scheduler); what
# is built on tasks (graphs, conversations, colony memory, what the core knows of its
# journal, schedules); then the two sides that use them all: the queen's router and
# services, and the peers' sessions and the link that drives them.
CORE_LAYERS: list[tuple[str, ...]] = [
    ("meshant.core.policy", "meshant.core.rights", "meshant.core.lifecycle",
     "meshant.core.counters"),
    ("meshant.core.nodes",),
    ("meshant.core.tasks",),
    ("meshant.core.graphs", "meshant.core.conversations", "meshant.core.memory",
     "meshant.core.journal", "meshant.core.schedules"),
    ("meshant.core.queen", "meshant.core.peers"),
]
# Classes whose bases of meshant's own may be more than one: none.
COMPOSED = ("meshant.core", "meshant.actors")


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every meshant module ``name`` imports, wherever the import is: at module level,
    in a class, in a function, or under ``if TYPE_CHECKING:`` (a type-only import is a
    dependency of the reader, and of mypy, all the same)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
    return {m for m in found if m in mods and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


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


def _layer(module: str, layers: list[tuple[str, ...]] = LAYERS) -> int:
    best, level = -1, -1
    for i, names in enumerate(layers):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > best:
                best, level = len(n), i
    assert level >= 0, f"{module} is in no layer: add its package to LAYERS"
    return level


def test_no_import_cycles_of_any_kind() -> None:
    graph = _graph()
    assert len(graph) > 40 and graph["meshant.core.tasks.scheduler"]  # the parse found them
    cycles = _cycles(graph)
    assert cycles == [], f"import cycles: {[sorted(c) for c in cycles]}"


def test_layers_only_look_down() -> None:
    upward = sorted(f"{m} -> {d}" for m, deps in _graph().items() for d in deps
                    if _layer(d) > _layer(m))
    assert upward == [], f"imports from a higher layer: {upward}"


def test_the_cores_folders_only_look_down() -> None:
    graph = _graph()
    core = {m for m in graph if m.startswith("meshant.core.")}
    folders = {m for m in core if _modules()[m].name == "__init__.py"}
    loose = sorted(m for m in core - folders if m.count(".") == 2 and m not in CORE_LAYERS[0])
    assert loose == [], f"core modules outside a folder of the core: {loose}"
    upward = sorted(f"{m} -> {d}" for m in core for d in graph[m] if d in core
                    and _layer(d, CORE_LAYERS) > _layer(m, CORE_LAYERS))
    assert upward == [], f"imports from a higher folder of the core: {upward}"
    sideways = sorted(f"{m} -> {d}" for m in core for d in graph[m]
                      if m.startswith("meshant.core.peers") and d.startswith("meshant.core.queen"))
    assert sideways == [], f"the peers' side imports the queen's: {sideways}"


def test_the_finders_find() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]
    tree = ast.parse("def f():\n    from meshant.core.queen import router\n")
    mods = {"meshant.core.queen.router": Path(), "meshant.x": Path()}
    path = PACKAGE / "x.py"
    assert "meshant.core.queen.router" in _imports_of(tree, mods, path)
    assert _layer("meshant.core.queen.router") < _layer("meshant.actors.queen")


def _imports_of(tree: ast.Module, mods: dict[str, Path], path: Path) -> set[str]:
    found: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module:
            for a in n.names:
                sub = f"{n.module}.{a.name}"
                found.add(sub if sub in mods else n.module)
    return found


def test_core_and_actor_classes_have_one_base_of_their_own_at_most() -> None:
    """Objects that own their state, composed: no partial classes mixed together
    (protocols, generics and the standard library's bases aside)."""
    mixed = []
    for name, path in _modules().items():
        if not name.startswith(COMPOSED):
            continue
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(n, ast.ClassDef):
                continue
            own = [ast.unparse(b) for b in n.bases
                   if ast.unparse(b) not in ("Protocol", "Exception", "Future", "StrEnum",
                                             "Generic")
                   and not ast.unparse(b).startswith(("Protocol[", "Generic[", "Future["))]
            if len(own) > 1:
                mixed.append(f"{name}.{n.name}({', '.join(own)})")
    assert mixed == []


def test_no_type_checking_stubs_of_a_hosts_state() -> None:
    """The smell the composed core removed: a class re-declaring, for the type checker,
    attributes another class gives it at run time."""
    stubs = []
    for name, path in _modules().items():
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(n, ast.ClassDef):
                for b in n.body:
                    if isinstance(b, ast.If) and "TYPE_CHECKING" in ast.unparse(b.test):
                        stubs.append(f"{name}.{n.name}")
    assert stubs == []


def test_every_error_code_is_a_code() -> None:
    classes = [c for c in vars(meshant.errors).values()
               if isinstance(c, type) and issubclass(c, meshant.errors.MeshantError)]
    assert len(classes) > 10
    for cls in classes:
        assert cls.code in set(Code), cls
    assert issubclass(meshant.ProtocolError, meshant.MeshantError)


def test_errors_are_grouped_by_remedy() -> None:
    e = meshant.errors
    groups = (e.RetryLater, e.BadInput, e.TaskOutcome, e.Timeout, e.ConfigError,
              e.JournalError)
    leaves = [c for c in vars(e).values() if isinstance(c, type)
              and issubclass(c, e.MeshantError) and c is not e.MeshantError
              and c not in groups]
    assert leaves and all(issubclass(c, groups) for c in leaves)
    assert issubclass(e.Timeout, TimeoutError) and issubclass(e.QueenUnreachable, e.Timeout)
    assert issubclass(meshant.ProtocolError, e.BadInput)
    assert e.from_error_body({"code": "queue-full"}).__class__ is e.QueueFull
    assert isinstance(e.from_error_body({"code": "unknown-task"}), e.BadInput)


def test_no_zmq_error_reaches_a_caller() -> None:
    import errno

    import pytest
    import zmq

    from meshant.actors._boundary import translated

    @translated("the thing")
    def boom(number: int) -> None:
        raise zmq.ZMQError(number)

    with pytest.raises(meshant.errors.MeshantError, match="the thing") as e:
        boom(errno.EMFILE)
    assert e.value.code == "io-failed" and e.value.detail["errno"] == errno.EMFILE
    with pytest.raises(meshant.errors.ConfigError):
        boom(zmq.EADDRINUSE)
    # Every public entry point that may touch a socket in the caller's thread is wrapped.
    from meshant import Client, Forager, Queen
    for fn in (Client.__init__, Client.submit, Client.close, Forager.start, Forager.run,
               Queen.start, Queen.run):
        assert hasattr(fn, "__wrapped__"), fn
