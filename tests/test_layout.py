"""The house rules a newcomer can rely on: imports flow one way, no module imports itself back, no reach-ins."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("inlet", "flows", "tasks", "query", "providers", "store", "runtime", "schemas")
# Who may import whom: flows -> tasks -> {providers, store, runtime} -> schemas; query -> {providers, store}.
ALLOWED = {
    "schemas": {"schemas"},
    "providers": {"providers", "schemas"},
    "runtime": {"runtime", "providers", "schemas"},
    "store": {"store", "runtime", "schemas"},
    "tasks": {"tasks", "providers", "store", "runtime", "schemas"},
    "query": {"query", "providers", "store", "schemas"},
    "flows": {"flows", "tasks", "providers", "store", "runtime", "schemas", "query"},
    "inlet": set(PACKAGES),
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of an Inlet package in a file, inside functions too."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        out += [(node.lineno, name) for name in names if name.split(".")[0] in PACKAGES]
    return out


def test_imports_go_one_way_between_the_packages():
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for module, path in _modules().items() for line, name in _imports(path)
             if name.split(".")[0] not in ALLOWED[module.split(".")[0]]]
    assert wrong == []


def test_no_module_imports_itself_back_through_others():
    modules = _modules()
    graph = {m: {n for _, n in _imports(p) if n in modules and n != m} for m, p in modules.items()}
    cycles: set[tuple[str, ...]] = set()

    def visit(module: str, path: list[str]) -> None:
        for nxt in graph[module]:
            if nxt in path:
                cycles.add(tuple(sorted(path[path.index(nxt):])))
            elif nxt not in done:
                visit(nxt, [*path, nxt])
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert cycles == set()


def test_other_libraries_are_used_through_their_public_names_only():
    """No private attribute of another object, no sys.modules or meta_path, no replacing a library's functions."""
    private = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.\w+)*|\))\._(?!_)[A-Za-z]\w*")
    tricks = re.compile(r"\bsys\.modules\b|\bsys\.meta_path\b|\bgc\.freeze\b|\bmallopt\b|\bset_memory_pool\b")
    found = []
    for path in _modules().values():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            code = line.split("#", 1)[0]
            if tricks.search(code) or any(m.group(1) not in ("os", "self", "cls") for m in private.finditer(code)):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
