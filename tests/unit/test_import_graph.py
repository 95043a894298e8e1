"""No import circle in the package, imports inside functions included (import-linter's
layers say which way imports go between layers; this says no two modules need each
other, within a layer too)."""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "operator"


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for p in (SOURCE / "numalign").rglob("*.py"):
        if "_pb2" in p.name:
            continue
        parts = p.relative_to(SOURCE).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports, anywhere in it (``from pkg import mod``
    counts as importing ``pkg.mod``, not ``pkg``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        pkg = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level \
                    else []
                name = ".".join([*base, *([node.module] if node.module else [])])
                subs = [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in mods]
                targets = subs if len(subs) == len(node.names) else [name, *subs]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[m].update(t for t in targets if t in mods and t != m)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_finder_sees_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_needs_another_that_needs_it() -> None:
    graph = import_graph()
    assert "numalign.topology.admit" in graph
    assert cycles(graph) == []
