"""The package's imports run one way: no cycle, each layer imports only the layers below it, and
code outside `machine_nb/engines/` reaches the engines through `machine_nb.engines` alone.

The graph is read from the source with `ast` (nothing is imported): module-level and
function-level imports, relative and absolute, with `from . import x` resolved to the submodule x
where there is one. Imports under `if TYPE_CHECKING:` never run and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "machine_nb"
ROOT = Path(__file__).resolve().parent.parent

# Layer of each module, subpackage or package of modules (the longest dotted prefix that is listed
# decides; higher = nearer the user); imports point down or stay within a layer. The folders group
# the modules by the loop's stages; the layers run across them. `errors` is a leaf (it imports only
# `os` and `sys`): every layer may raise its exceptions, the engines included, so it sits with them at the bottom.
LAYERS: dict[str, int] = {}
for _names, _layer in [
    ("__init__ cli widgets reports", 5),  # what users touch (`__init__`: the package's lazy public API)
    ("training.train training.preference training.sweeps training.pairs training.runner training.loop "
     "evaluation.evaluate evaluation.candidate evaluation.cases evaluation.compare evaluation.heldout "
     "evaluation.inspect_bridge tools training evaluation", 4),  # the loop's steps
    ("checks data.corpus evaluation.stats evaluation.sampling evaluation.results training.runlog", 3),  # checks and numbers
    ("data data.select data.export data.frames evaluation.inspect_logs", 2),  # Machine's data as frames and lines
    ("store core evaluation.scoring", 1),  # files on disk, and pure helpers under everything
    ("engines errors core.jsonl core.tasks core.process", 0),  # the local server and the Tinker glue; the errors every layer raises, JSONL reading (bounded) and writing, ending an asyncio task, a process's start-up and end
]:
    for _name in _names.split():
        LAYERS[_name] = _layer

# Cycles other changes are still removing: each entry is the set of modules of one cycle.
ALLOWED_CYCLES: set[frozenset[str]] = set()

# Upward imports that stay, each with its reason: (importer, imported).
ALLOWED_UPWARD = {
    # the offline build script (`python -m machine_nb.engines.local.build`, never imported by the
    # package) pretrains the shipped model on the corpus module's own question phrasings
    ("engines.local.build", "data.corpus"),
}

# Engine internals reached from outside engines/ (not through machine_nb.engines): (importer, imported).
ALLOWED_ENGINE_INTERNALS: set[tuple[str, str]] = set()


# --------------------------------------------------------------------------- the graph

def modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Dotted module name (without the package prefix; "" is the package) -> (file, is a package)."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root / PACKAGE).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


class _Imports(ast.NodeVisitor):
    """The machine_nb imports of one module: (target module, line, "module" | "function")."""

    def __init__(self, name: str, is_package: bool, known: dict):
        self.name, self.is_package, self.known = name, is_package, known
        self.depth = 0
        self.found: list[tuple[str, int, str]] = []
        #: names another machine_nb module keeps to itself (a leading underscore) used here: (module, name, line)
        self.private: list[tuple[str, str, int]] = []
        self._modules: dict[str, str] = {}  # local name -> the machine_nb module it is bound to

    def _resolve(self, dotted: str) -> str | None:
        """The longest known module that `dotted` (full name, "machine_nb.x.y") names or lies in."""
        parts = dotted.split(".")
        if parts[0] != PACKAGE:
            return None
        parts = parts[1:]
        while parts and ".".join(parts) not in self.known:
            parts.pop()
        return ".".join(parts)

    def _add(self, dotted: str, line: int) -> None:
        target = self._resolve(dotted)
        if target is not None and target != self.name:
            self.found.append((target, line, "function" if self.depth else "module"))

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
                (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            for stmt in node.orelse:  # the body never runs
                self.visit(stmt)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)
            target = self._resolve(alias.name)
            if alias.asname and target is not None and alias.name == ".".join([PACKAGE, target]).rstrip("."):
                self._modules[alias.asname] = target

    def visit_Attribute(self, node: ast.Attribute) -> None:
        value = node.value
        if isinstance(value, ast.Name) and value.id in self._modules and _private(node.attr) \
                and self._modules[value.id] != self.name:
            self.private.append((self._modules[value.id], node.attr, node.lineno))
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = [PACKAGE, *self.name.split(".")] if self.name else [PACKAGE]
            if not self.is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            full = ".".join(base + ([node.module] if node.module else []))
        else:
            full = node.module or ""
        for alias in node.names:
            sub = f"{full}.{alias.name}"
            is_module = self._resolve(sub) == sub[len(PACKAGE) + 1:]
            self._add(sub if is_module else full, node.lineno)
            target = self._resolve(full)
            if is_module:
                self._modules[alias.asname or alias.name] = sub[len(PACKAGE) + 1:]
            elif target is not None and target != self.name and _private(alias.name):
                self.private.append((target, alias.name, node.lineno))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def read_imports(root: Path = ROOT) -> dict[str, _Imports]:
    """module -> what its source imports and uses of other machine_nb modules."""
    known = modules(root)
    out = {}
    for name, (path, is_package) in known.items():
        visitor = _Imports(name, is_package, known)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        out[name] = visitor
    return out


def import_graph(root: Path = ROOT) -> dict[str, list[tuple[str, int, str]]]:
    """module -> [(imported module, line, "module" | "function")], TYPE_CHECKING-only imports left out."""
    return {name: visitor.found for name, visitor in read_imports(root).items()}


def cycles(graph: dict[str, list[tuple[str, int, str]]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _, _ in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int | None:
    parts = module.split(".") if module else ["__init__"]
    while parts and ".".join(parts) not in LAYERS:
        parts.pop()
    return LAYERS.get(".".join(parts)) if parts else None


def _where(graph: dict, a: str, b: str) -> str:
    lines = sorted({line for target, line, _ in graph[a] if target == b})
    path = MODULES[a][0].relative_to(ROOT).as_posix()
    return f"{path}:{','.join(map(str, lines))} imports {PACKAGE}{'.' + b if b else ''}"


MODULES = modules()
GRAPH = import_graph()


# --------------------------------------------------------------------------- the reader itself

def test_the_reader_finds_every_kind_of_import(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .. import leaf\n")
    for name in ("leaf", "a", "b", "c", "d", "typed"):
        (pkg / f"{name}.py").write_text("")
    (pkg / "sub" / "inner.py").write_text(
        "from ..a import x\n"                 # relative, two levels
        "import machine_nb.b as bee\n"        # absolute
        "from machine_nb import c\n"          # a submodule named in a from-import
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .. import typed\n"
        "def f():\n    from .. import d\n"     # function-level
        "from . import nothing_here\n")      # not a module: the package itself, which is sub
    graph = import_graph(tmp_path)
    assert sorted(graph["sub.inner"]) == [("a", 1, "module"), ("b", 2, "module"), ("c", 3, "module"),
                                          ("d", 8, "function"), ("sub", 9, "module")]
    assert graph["sub"] == [("leaf", 1, "module")]
    assert cycles({"a": [("b", 1, "module")], "b": [("a", 2, "function")], "c": [("a", 1, "module")]}) \
        == [frozenset({"a", "b"})]


# --------------------------------------------------------------------------- the rules

def test_no_import_cycle():
    found = set(cycles(GRAPH))
    new = [c for c in found if c not in ALLOWED_CYCLES]
    described = []
    for component in new:
        described.append(", ".join(sorted(component)) + ": " + "; ".join(
            _where(GRAPH, a, b) for a in sorted(component) for b in sorted({t for t, _, _ in GRAPH[a]} & component)))
    assert not new, "import cycles:\n" + "\n".join(described)
    stale = ALLOWED_CYCLES - found
    assert not stale, f"allowed cycles that no longer exist (remove them from ALLOWED_CYCLES): {stale}"


def test_every_module_has_a_layer():
    assert [m for m in GRAPH if layer(m) is None] == []


def test_imports_point_down_the_layers():
    upward = {(a, b) for a, edges in GRAPH.items() for b, _, _ in edges
              if layer(b) > layer(a)}
    new = sorted(upward - ALLOWED_UPWARD)
    assert not new, "imports up the layers:\n" + "\n".join(
        f"{_where(GRAPH, a, b)} (layer {layer(a)} -> {layer(b)})" for a, b in new)
    stale = ALLOWED_UPWARD - upward
    assert not stale, f"allowed upward imports that no longer exist (remove them from ALLOWED_UPWARD): {stale}"


def test_engines_are_reached_through_machine_nb_engines():
    reached = {(a, b) for a, edges in GRAPH.items() for b, _, _ in edges
               if b.startswith("engines.") and not (a == "engines" or a.startswith("engines."))}
    new = sorted(reached - ALLOWED_ENGINE_INTERNALS)
    assert not new, "engine internals imported from outside engines/ (use machine_nb.engines):\n" + "\n".join(
        _where(GRAPH, a, b) for a, b in new)
    stale = ALLOWED_ENGINE_INTERNALS - reached
    assert not stale, ("allowed engine-internal imports that no longer exist (remove them from "
                       f"ALLOWED_ENGINE_INTERNALS): {stale}")


def test_no_module_uses_another_modules_private_names():
    """A name with a leading underscore is its module's own: another module that needs it gets a
    public name for it (a private module, such as cli/_flags.py, may be imported by its siblings)."""
    used = [(name, target, attr, line) for name, visitor in read_imports().items()
            for target, attr, line in visitor.private]
    assert not used, "private names of other modules:\n" + "\n".join(
        f"{MODULES[name][0].relative_to(ROOT).as_posix()}:{line} uses {PACKAGE}.{target}.{attr}"
        for name, target, attr, line in sorted(used))


def test_the_private_name_reader_sees_both_forms(tmp_path):
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_helpers.py").write_text("")
    (pkg / "a.py").write_text("_x = 1\ndef _f(): pass\n")
    (pkg / "b.py").write_text("from .a import _f, _x as y\nfrom . import a, _helpers\n"
                              "a._x\na.public\n_helpers.thing\nself_only = a.__name__\n")
    seen = read_imports(tmp_path)["b"].private
    assert sorted(seen) == [("a", "_f", 1), ("a", "_x", 1), ("a", "_x", 3)]


def test_the_graph_sees_the_package():
    """A reader that found nothing would pass every rule: the known edges must be there."""
    assert any(target == "core.jsonl" and kind == "module" for target, _, kind in GRAPH["checks.validate"])
    assert any(target == "evaluation.stats" and kind == "module" for target, _, kind in GRAPH["evaluation.compare"])
    assert any(target == "checks.render" and kind == "module" for target, _, kind in GRAPH["training.train"])
    assert len(GRAPH) > 50
