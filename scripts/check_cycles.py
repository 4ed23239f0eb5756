"""Fail when modules of `agent` or `tracker` import each other in a cycle, type-only imports included.

import-linter's layers contract forbids imports between layers in the wrong direction; this catches
what it cannot see, a cycle inside one layer (e.g. two modules of `agent.daemon`). The import graph
is grimp's (the one import-linter builds), which counts imports under `if TYPE_CHECKING:` too.

Usage: .venv/bin/python scripts/check_cycles.py     (part of `./dev test`)
"""

from __future__ import annotations

import sys

import grimp


def cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    inside = set(modules)
    edges = {m: sorted(set(graph.find_modules_directly_imported_by(m)) & inside) for m in modules}
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in edges[m]:
            if state.get(n) == 1:
                found.append([*path[path.index(n) :], n])
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in modules:
        if m not in state:
            visit(m)
    return found


def main() -> int:
    graph = grimp.build_graph("agent", "tracker")
    problems = cycles(graph, "agent") + cycles(graph, "tracker")
    for cycle in problems:
        print("import cycle: " + " -> ".join(cycle), file=sys.stderr)
    if not problems:
        print("no import cycles in agent or tracker")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
