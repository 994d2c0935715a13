"""Draw the project's imports and measure the house: rooms, floors, arrows back up, circles.

A *room* is a module of ``allocopt`` or ``objectives`` (a package's ``__init__`` is the package).
An *arrow* is ``A imports B`` anywhere in A (top level or inside a function), read with
:mod:`ast`. *Circles* are the strongly connected components of more than one room; an *arrow back
up* is an arrow inside a circle (it points at a room that, through other arrows, imports the
importer). *Floors* are the longest chain of arrows in the graph with each circle drawn as one
room, plus one. Standard library only.

Usage::

    python benchmarks/import_graph.py            # the figures as a table
    python benchmarks/import_graph.py --arrows   # and every arrow inside a circle
    python benchmarks/import_graph.py --dot imports.dot   # a Graphviz drawing
    python benchmarks/import_graph.py --rooms packages    # a room per allocopt.X, objectives one

``--rooms packages`` draws the house as a maintainer reads it: each top-level module or
subpackage of ``allocopt`` is one room (``allocopt.study``, ``allocopt.flops``, ...) and the
``objectives`` plugins are one room; arrows inside a room are not drawn.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("allocopt", "objectives")


def modules() -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file of the project's packages."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def arrows(known: dict[str, Path]) -> set[tuple[str, str]]:
    """Every (importer, imported) pair between the project's modules."""
    edges: set[tuple[str, str]] = set()
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = module if is_package else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}" if base else package
                targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
            for target in targets:
                hit = _resolve(target, known)
                if hit and hit != module:
                    edges.add((module, hit))
    return edges


def circles(nodes: list[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components (networkx's, iterative: no recursion limit to raise), each
    sorted, largest first."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    return sorted((sorted(c) for c in nx.strongly_connected_components(g)), key=len, reverse=True)


def floors(nodes: list[str], edges: set[tuple[str, str]], components: list[list[str]]) -> int:
    """Longest chain of arrows over the graph with each circle as one room, plus one."""
    room = {n: i for i, c in enumerate(components) for n in c}
    below: dict[int, set[int]] = {i: set() for i in range(len(components))}
    for a, b in edges:
        if room[a] != room[b]:
            below[room[a]].add(room[b])
    height: dict[int, int] = {}

    def h(i: int) -> int:
        if i not in height:
            height[i] = 1 + max((h(j) for j in below[i]), default=0)
        return height[i]

    return max(h(i) for i in below)


def collapse(known: dict[str, Path], edges: set[tuple[str, str]]) -> tuple[list[str], set[tuple[str, str]]]:
    """Rooms ``allocopt.X`` (a top-level module or subpackage) and ``objectives``; the arrows
    between different rooms."""
    def room(m: str) -> str:
        parts = m.split(".")
        return "objectives" if parts[0] == "objectives" else ".".join(parts[:2])

    nodes = sorted({room(m) for m in known})
    return nodes, {(room(a), room(b)) for a, b in edges if room(a) != room(b)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrows", action="store_true", help="list every arrow inside a circle")
    parser.add_argument("--rooms", choices=("modules", "packages"), default="modules",
                        help="a room per module (default) or per allocopt.X / objectives")
    parser.add_argument("--dot", help="write a Graphviz drawing to this file")
    args = parser.parse_args()
    known = modules()
    nodes = sorted(known)
    edges = arrows(known)
    if args.rooms == "packages":
        nodes, edges = collapse(known, edges)
    components = circles(nodes, edges)
    loops = [c for c in components if len(c) > 1]
    in_loop = {n: i for i, c in enumerate(loops) for n in c}
    back = sorted((a, b) for a, b in edges if a in in_loop and in_loop.get(b) == in_loop[a])
    largest = max(known.items(), key=lambda kv: len(kv[1].read_text().splitlines()))
    print(f"{'rooms (' + args.rooms + ')':<28}{len(nodes)}")
    print(f"{'arrows (imports)':<28}{len(edges)}")
    print(f"{'floors':<28}{floors(nodes, edges, components)}")
    print(f"{'circles':<28}{len(loops)}")
    print(f"{'arrows inside circles':<28}{len(back)}")
    print(f"{'largest module':<28}{largest[0]} ({len(largest[1].read_text().splitlines())} lines)")
    for loop in loops:
        print("circle: " + " <-> ".join(loop))
    if args.arrows:
        for a, b in back:
            print(f"  {a} -> {b}")
    if args.dot:
        lines = ["digraph imports {", "  rankdir=TB; node [shape=box, fontsize=10];"]
        lines += [f'  "{a}" -> "{b}"{" [color=red]" if (a, b) in back else ""};'
                  for a, b in sorted(edges)]
        Path(args.dot).write_text("\n".join(lines + ["}"]) + "\n")


if __name__ == "__main__":
    main()
