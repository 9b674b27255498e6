"""The layout's floors, checked on every import (top level and inside functions), so it cannot rot.

Floors (docs/architecture.md, "Layout and floors"): `kernels/` imports nothing of ours; the core
(`asymagent/`) never imports `integrations/` or `evals/`; `evals/` never imports
`integrations/`; no import cycle among core modules; no layer reads another module's private
attributes. Sources are read with `ast`, nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# source folder -> the package it installs as (pyproject's package-dir)
FOLDERS = {"asymagent": "asymagent", "kernels": "asymagent.kernels",
           "integrations": "asymagent.integrations", "evals": "asymagent.evals"}


def module_files() -> dict:
    """{module name: path} for every .py file of the four folders."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


MODULES = module_files()


def layer(module: str) -> str:
    for name in ("kernels", "integrations", "evals"):
        if module == f"asymagent.{name}" or module.startswith(f"asymagent.{name}."):
            return name
    return "core"


def _resolve(name: str) -> str | None:
    """The longest known module that `name` (a dotted import target) names or lies in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set:
    """Modules of ours that `module` imports anywhere in its source (incl. lazy imports)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from a.b import c` imports a.b.c when c is a module, else a name in a.b
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            if target == "asymagent" or target.startswith("asymagent."):
                resolved = _resolve(target)
                if resolved and resolved != module:
                    found.add(resolved)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def test_the_scan_sees_the_tree():
    assert "asymagent.engine" in MODULES and "asymagent.kernels.fused_gate" in MODULES
    assert "asymagent.decoding.round" in GRAPH["asymagent.engine"]
    assert "asymagent.kernels" in GRAPH["asymagent.decoding.round"]


# The one exemption, and exactly what it may import: `python -m asymagent` needs
# asymagent/__main__.py in the core package, and all it does is hand argv to the CLI face. It is
# an entry point: nothing imports it (checked below), so no core module reaches a face through it.
ENTRY_POINTS = {"asymagent.__main__": {"asymagent.integrations.cli"}}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_floors(module):
    allowed = {"kernels": {"kernels"}, "core": {"core", "kernels"},
               "evals": {"evals", "core", "kernels"},
               "integrations": {"integrations", "evals", "core", "kernels"}}[layer(module)]
    bad = sorted(m for m in GRAPH[module] if layer(m) not in allowed and m != "asymagent"
                 and m not in ENTRY_POINTS.get(module, ()))
    assert not bad, f"{module} ({layer(module)}) imports {bad}"


def test_entry_points_are_imported_by_nothing():
    assert set(ENTRY_POINTS) <= set(MODULES)
    importers = sorted(m for m, deps in GRAPH.items() if deps & set(ENTRY_POINTS))
    assert importers == [], importers


def _cycles(nodes: set) -> list:
    """Strongly connected components of more than one module (Tarjan), among `nodes`."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v] & nodes):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    # package __init__ files (the lazy public API) are left out: they import nothing at load
    nodes = {m for m in MODULES if MODULES[m].name != "__init__.py"}
    assert _cycles(nodes) == []


THIRD_PARTY_ROOTS = {"torch"}  # torch._dynamo.config is how torch documents its knobs


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def test_no_private_attribute_read_across_modules():
    """`obj._name` only on self/cls (a class reading its own state) or super(), never on another
    object or module of ours."""
    bad = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    and not (isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                             and node.value.func.id == "super")
                    and not (isinstance(_root(node.value), ast.Name)
                             and _root(node.value).id in THIRD_PARTY_ROOTS)):
                bad.append(f"{module}:{node.lineno} .{node.attr}")
    assert not bad, bad


def top_level_imports(path: Path) -> set:
    """First components of every absolute import in a source file (`import a.b` -> "a")."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.partition(".")[0])
    return found


# extra -> the modules that may import it (eval --ray; serve --ray, reached only with --ray)
OPTIONAL_DEPENDENCIES = {"ray": {"asymagent.evals.running.ray_eval"} | {
    f"asymagent.integrations.ray_serve.{m}" for m in ("ingress", "launch", "replica", "router")}}


@pytest.mark.parametrize("package", sorted(OPTIONAL_DEPENDENCIES))
def test_optional_dependencies_stay_optional(package):
    """Ray (`pip install 'asymagent[ray]'`) is imported by evals/running/ray_eval.py and
    integrations/ray_serve/ only, never by the core or anything a plain install imports."""
    users = {m for m, path in MODULES.items() if package in top_level_imports(path)}
    assert not {m for m in users if layer(m) == "core"}, f"the core imports {package}: {sorted(users)}"
    assert users <= OPTIONAL_DEPENDENCIES[package], sorted(users)


def test_core_stays_small_at_the_top():
    top = [p for p in (ROOT / "asymagent").glob("*.py")]
    assert len(top) <= 14, sorted(p.name for p in top)
