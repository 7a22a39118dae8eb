"""The core's rooms (docs/architecture.md): every import of ``src/distkit``, the ones inside
functions too, points down this list of rooms or stays in its own room, and no set of
modules imports each other in a circle."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from support import REPO_ROOT, subprocess_env

SRC = REPO_ROOT / "src"

# Rooms (subpackages, or the few modules flat in src/distkit), lowest first. A room of the
# kit that is in no layer fails the test: give it one.
LAYERS = (
    ("errors", "host"),
    ("config", "compat"),
    ("builtin",),
    ("tasks",),
    ("checkpoint",),
    ("observe",),
    ("train",),
    ("launch",),
    ("sharding",),
    ("lessons", "commands", "bench", "grade", "__main__", "__init__"),
)
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts)


def layer(module: str) -> int | None:
    """``distkit.train.stopping`` -> the layer of the room ``train``; ``distkit`` (the
    package's ``__init__``, which only re-exports lazily) -> the top."""
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    return LAYER_OF.get(key)


def imports_of(source: str, module: str, is_package: bool = False):
    """``(line, imported module)`` for every import of a ``distkit`` module in ``source``,
    wherever it stands (top level, function, class, ``if``, ``try``). ``from distkit import
    x`` counts as an import of ``distkit.x`` when ``x`` is a module, else of ``distkit``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "distkit":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "distkit":
                continue
            targets = [f"{target}.{a.name}" for a in node.names]
            for name in dict.fromkeys(t if _is_module(t) else target for t in targets):
                yield node.lineno, name


def _is_module(name: str) -> bool:
    path = SRC.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def import_graph():
    """{module: [(file:line, imported module), ...]} over every file of src/distkit."""
    graph = {}
    for path in sorted((SRC / "distkit").rglob("*.py")):
        name = module_name(path)
        is_package = path.name == "__init__.py"
        if is_package:
            name = name.rpartition(".")[0]
        where = path.relative_to(REPO_ROOT)
        graph[name] = [(f"{where}:{line}", target)
                       for line, target in imports_of(path.read_text(), name, is_package)
                       if target != name]
    return graph


def upward_imports(graph) -> list[str]:
    bad = []
    for module, edges in graph.items():
        for where, target in edges:
            low, high = layer(module), layer(target)
            if low is None or high is None:
                continue  # reported by test_every_module_has_a_layer
            if high > low:
                bad.append(f"{where}: {module} (layer {low + 1}) imports {target} (layer {high + 1}), "
                           "which is above it")
    return bad


def cycles(graph) -> list[list[str]]:
    """Every circle of imports between modules (a strongly connected component of more
    than one module), found with Tarjan's algorithm; each listed as modules in order."""
    edges = {m: sorted({t for _, t in e if t in graph}) for m, e in graph.items()}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def describe_cycle(graph, component) -> str:
    lines = [f"{where}: {m} imports {t}" for m in component for where, t in graph[m] if t in component]
    return "import circle between " + ", ".join(component) + ":\n  " + "\n  ".join(lines)


GRAPH = import_graph()


def test_every_module_has_a_layer():
    missing = sorted(m for m in GRAPH if layer(m) is None)
    assert not missing, f"modules in no layer of tests/package/test_layers.py's LAYERS: {missing}"


def test_no_import_points_up_a_layer():
    bad = upward_imports(GRAPH)
    assert not bad, "\n".join(bad)


def test_no_import_circle():
    found = cycles(GRAPH)
    assert not found, "\n".join(describe_cycle(GRAPH, c) for c in found)


def test_the_graph_sees_function_level_imports():
    edges = {t for _, t in GRAPH["distkit.launch.entry"]} | {t for _, t in GRAPH["distkit.launch.supervise"]}
    assert {"distkit.errors", "distkit.host.facts", "distkit.train.training"} <= edges


# --- the checks themselves can fail ----------------------------------------------------

def test_an_upward_import_inside_a_function_is_caught():
    source = "def f():\n    from distkit.train.training import training\n"
    graph = {"distkit.config": [(f"config.py:{line}", t)
                                for line, t in imports_of(source, "distkit.config")]}
    bad = upward_imports(graph)
    assert len(bad) == 1 and bad[0].startswith("config.py:2: distkit.config (layer 2) imports "
                                               "distkit.train.training (layer 7)"), bad


def test_a_circle_within_one_layer_is_caught():
    graph = {"distkit.tasks": [("tasks.py:3", "distkit.checkpoint.saver")],
             "distkit.checkpoint.saver": [("checkpoint.py:9", "distkit.tasks")],
             "distkit.errors": []}
    assert cycles(graph) == [["distkit.checkpoint.saver", "distkit.tasks"]]
    assert "checkpoint.py:9: distkit.checkpoint.saver imports distkit.tasks" in \
        describe_cycle(graph, cycles(graph)[0])


@pytest.mark.parametrize("source, module, package, expected", [
    ("from distkit.observe import profiling, Config", "distkit.train.training", False,
     ["distkit.observe.profiling", "distkit.observe"]),
    ("from . import data", "distkit.builtin.text", False, ["distkit.builtin.data"]),
    ("from ..launch import run", "distkit.commands.train", False, ["distkit.launch"]),
    ("import distkit.host.facts as m", "distkit.launch.entry", False, ["distkit.host.facts"]),
    ("from .train import main", "distkit.commands", True, ["distkit.commands.train"]),
])
def test_imports_are_resolved_to_modules(source, module, package, expected):
    assert [t for _, t in imports_of(source, module, package)] == expected


# --- the lowest layer stays light ------------------------------------------------------

def test_host_room_imports_no_torch_or_ignite():
    code = ("import sys, distkit.host.facts; "
            "print(sorted(m for m in ('torch', 'ignite') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_launch_imports_at_the_top():
    """The entry points sit above everything they use: nothing to dodge, so no import hides
    in a function."""
    path = SRC / "distkit" / "launch" / "entry.py"
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    hidden = [f"src/distkit/launch/entry.py:{node.lineno}" for node in ast.walk(tree)
              if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top]
    assert not hidden, f"imports inside functions: {hidden}"
