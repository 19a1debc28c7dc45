"""No import cycle among addnorm's modules, of any kind: module-level imports, imports inside
functions and imports under ``if TYPE_CHECKING:`` all count (a cycle through type-only imports
is still two modules that each need the other to be understood).

Provenance: the graph is read from the source with ``ast`` (every ``import`` and ``from ...
import`` statement anywhere in a module, relative ones resolved), and its cycles are the
strongly connected components of more than one module (networkx, a dependency of torch). As in
``../shared/tools/import-graph.py``, an edge between a package and one of its own modules is
not a dependency between concerns (``training/__init__.py`` re-exports its modules, and they
import from the package's namespace) and is left out. The detector itself is checked on a
small package written for the test, with a cycle through a TYPE_CHECKING import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

SRC = Path(__file__).resolve().parent.parent / "src" / "addnorm"


def module_name(path: Path, root: Path) -> str:
    """``addnorm.training.trainer`` for ``<root>/training/trainer.py`` (a package by its
    ``__init__``)."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, package: str) -> set[str]:
    """Every name an import statement of ``tree`` may load: ``from a.b import c`` loads
    ``a.b`` and, when it is a module, ``a.b.c``; relative imports resolved against
    ``package`` (the package the module lives in)."""
    names: set[str] = set()
    for node in ast.walk(tree):  # every statement: module level, in functions, TYPE_CHECKING
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path) -> nx.DiGraph:
    """The modules of the package at ``root`` and which imports which (edges between a
    package and its own modules left out)."""
    paths = {module_name(p, root): p for p in root.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(paths)
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target in imported(tree, package) & paths.keys():
            if target != name and not (target.startswith(name + ".")
                                       or name.startswith(target + ".")):
                graph.add_edge(name, target)
    return graph


def import_cycles(root: Path) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a loop, sorted."""
    return sorted(sorted(group) for group in nx.strongly_connected_components(import_graph(root))
                  if len(group) > 1)


def test_no_module_of_addnorm_is_in_an_import_cycle():
    graph = import_graph(SRC)
    assert graph.has_edge("addnorm.training.trainer", "addnorm.training.callbacks")  # read
    cycles = import_cycles(SRC)
    assert cycles == [], "import cycles (TYPE_CHECKING and deferred imports counted): " + "; ".join(
        " <-> ".join(group) for group in cycles)


def test_the_detector_sees_cycles_through_type_checking_and_deferred_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("from pkg.sub import b\nA = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import A\n")
    (pkg / "c.py").write_text("def f():\n    import pkg.d\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    (pkg / "e.py").write_text("import pkg.a\n")  # imports into a cycle: not part of one
    assert import_cycles(pkg) == [["pkg.a", "pkg.sub.b"], ["pkg.c", "pkg.d"]]
