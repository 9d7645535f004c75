"""The layers stay layered: every first-party import, function-local ones included, runs down
the table below (docs/design.md, section 7), no import circle is left, and the pure parts
import with Celery and Kombu unimportable."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "celery_fair"
ROOT = "celery_fair"

#: The layer table: (layer, side) of each module; a name ending in ``.*`` covers a package
#: and everything in it. Each module imports only modules of lower layers, or of its own layer
#: and side (the producer and the worker side of layer 5 never import each other).
TABLE: dict[str, tuple[int, str]] = {
    # 0: the wire protocol, errors, version: standard library only
    "celery_fair._version": (0, ""),
    "celery_fair.errors": (0, ""),
    "celery_fair.protocol": (0, ""),
    # 1: the rules, pure
    "celery_fair.core.*": (1, ""),
    # 2: the shared truth; no Celery, no Kombu
    "celery_fair.store.*": (2, ""),
    # 3: the engine and the observer (and what reads their numbers, or words the core's values
    # for people); no Celery, Kombu, redis-py
    "celery_fair.engine.*": (3, ""),
    "celery_fair.runtime_policies": (3, ""),
    "celery_fair.observe": (3, ""),
    "celery_fair.metrics": (3, ""),
    "celery_fair.fleet": (3, ""),
    "celery_fair.words": (3, ""),
    # 4: app glue: settings, the store an app opens, an app's shard queues, a Redis broker's lists
    "celery_fair.settings": (4, ""),
    "celery_fair.connect": (4, ""),
    "celery_fair.routing": (4, ""),
    "celery_fair.redis_broker": (4, ""),
    # 5: the producer side ...
    "celery_fair.api": (5, "producer"),
    "celery_fair.submissions": (5, "producer"),
    "celery_fair.control": (5, "producer"),
    "celery_fair.policies": (5, "producer"),
    "celery_fair.slots": (5, "producer"),
    # ... and the worker side
    "celery_fair.worker.*": (5, "worker"),
    # 6: tools
    "celery_fair.cli": (6, ""),
    "celery_fair.__main__": (6, ""),
    "celery_fair.commands": (6, ""),
    "celery_fair.overview": (6, ""),
    "celery_fair.flower": (6, ""),
    "celery_fair.sim": (6, ""),
    "celery_fair.plot": (6, ""),
    "celery_fair.record": (6, ""),
    "celery_fair.queues": (6, ""),
    # the public face: at import time only layer 0; everything else lazily (module __getattr__)
    "celery_fair": (7, ""),
}

#: Third-party packages a layer may not import, even lazily: layers 0 and 1 take the standard
#: library alone (checked apart).
BANNED = {
    2: {"celery", "kombu", "billiard"},
    3: {"celery", "kombu", "billiard", "redis"},
}
STDLIB_ONLY = (0, 1)


@dataclass(frozen=True)
class Import:
    importer: str
    path: Path
    line: int
    target: str  # a module name, first-party or not
    at_import_time: bool  # run when the importer is imported (not in a function or TYPE_CHECKING)
    type_only: bool = False  # under ``if TYPE_CHECKING``: never run


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


MODULES = module_names()


def place(module: str) -> tuple[int, str]:
    if module in TABLE:
        return TABLE[module]
    for name, where in TABLE.items():
        if name.endswith(".*") and (module == name[:-2] or module.startswith(name[:-1])):
            return where
    raise AssertionError(f"{module} is in no layer: add it to TABLE in {Path(__file__).name}")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, at_import_time: bool, type_only: bool = False):
    """Every import under ``node``, with whether it runs when the module is imported and
    whether it is for type checking only."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, at_import_time, type_only
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk(child, False, type_only)
        elif isinstance(child, ast.If) and _is_type_checking(child):
            for stmt in child.body:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), False, True)
            for stmt in child.orelse:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), at_import_time)
        else:
            yield from _walk(child, at_import_time, type_only)


def imports_of(module: str) -> list[Import]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node, at_import_time, type_only in _walk(ast.parse(path.read_text()), True):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            # ``from package import module`` imports the module
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                for alias in node.names
            ]
        for target in dict.fromkeys(targets):
            found.append(Import(module, path, node.lineno, target, at_import_time, type_only))
    return found


ALL_IMPORTS = [found for module in MODULES for found in imports_of(module)]
FIRST_PARTY = [i for i in ALL_IMPORTS if i.target.split(".")[0] == ROOT]


def _where(i: Import) -> str:
    return f"{i.path.relative_to(PACKAGE.parent)}:{i.line}: {i.importer} imports {i.target}"


def _named(where: tuple[int, str]) -> str:
    layer, side = where
    return f"layer {layer}" + (f" ({side} side)" if side else "")


def test_every_module_has_a_layer():
    for module in MODULES:
        place(module)


def test_every_first_party_import_runs_down_the_table():
    wrong = []
    for i in FIRST_PARTY:
        if i.target not in MODULES:
            wrong.append(f"{_where(i)}, which does not exist")
            continue
        mine, theirs = place(i.importer), place(i.target)
        if i.importer == ROOT:
            if i.at_import_time and theirs[0] != 0:
                wrong.append(
                    f"{_where(i)} ({_named(theirs)}) when it is imported: the public face "
                    "loads only layer 0 eagerly, the rest through __getattr__"
                )
            continue
        upward = theirs[0] > mine[0]
        across = theirs[0] == mine[0] and theirs[1] != mine[1]
        if upward or across:
            wrong.append(f"{_where(i)}: {_named(mine)} may not import {_named(theirs)}")
    assert not wrong, "imports against the layer table:\n" + "\n".join(wrong)


def test_the_lower_layers_import_no_forbidden_package():
    wrong = []
    for i in ALL_IMPORTS:
        top = i.target.split(".")[0]
        if top == ROOT or not top:
            continue
        layer = place(i.importer)[0]
        if layer in STDLIB_ONLY and top not in sys.stdlib_module_names and top != "__future__":
            wrong.append(f"{_where(i)}: layer {layer} takes the standard library alone")
        elif top in BANNED.get(layer, ()):
            wrong.append(f"{_where(i)}: layer {layer} may not import {top}")
    assert not wrong, "\n".join(wrong)


def test_no_import_circle_is_left():
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    # An import for type checking only is held to the layers like any other, but runs never, so
    # it makes no circle (core/policy.py names the records of core/jobs.py in its signatures).
    for i in FIRST_PARTY:
        if i.target in MODULES and i.target != i.importer and not i.type_only:
            graph[i.importer].add(i.target)
    circles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not circles, "import circles (function-local imports counted): " + "; ".join(
        " <-> ".join(sorted(c)) for c in circles
    )


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(component)
    return out


def test_the_table_catches_an_import_that_runs_back_up():
    """The check above can fail: a function-local import of the worker from the engine is
    found and named."""
    tree = ast.parse("def f():\n    from .worker.gate import Gate\n")
    [(node, at_import_time, _)] = list(_walk(tree, True))
    assert isinstance(node, ast.ImportFrom)
    assert not at_import_time
    assert place("celery_fair.worker.gate")[0] > place("celery_fair.engine")[0]
    assert _strongly_connected({"a": {"b"}, "b": {"a"}, "c": set()})[0] in (["b", "a"], ["a", "b"])


def test_only_the_clock_module_reads_time():
    for path in sorted((PACKAGE / "core").glob("*.py")):
        if path.name == "clock.py":
            continue
        names = {i.target.split(".")[0] for i in imports_of(_module_of(path))}
        assert not names & {"time", "datetime"}, path.name


def _module_of(path: Path) -> str:
    [name] = [name for name, p in MODULES.items() if p == path]
    return name


PURE = [*sorted(m for m in MODULES if place(m)[0] <= 3), "celery_fair.sim"]


@pytest.mark.parametrize("blocked", [("celery", "kombu", "billiard", "redis")])
def test_the_pure_parts_import_with_celery_kombu_and_redis_unimportable(blocked):
    """Layers 0 to 3 and the simulator, each in a fresh interpreter that refuses ``blocked``:
    none is needed, and none is loaded."""
    script = textwrap.dedent(
        f"""
        import importlib, sys
        from importlib.abc import MetaPathFinder

        BLOCKED = {blocked!r}

        class Refuse(MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is refused in this test")
                return None

        sys.meta_path.insert(0, Refuse())
        for name in {PURE!r}:
            importlib.import_module(name)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not loaded, loaded
        assert "celery_fair.worker" not in sys.modules
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_importing_the_package_registers_the_pool_once_celery_is_loaded():
    """With Celery loaded (as under ``celery worker``), ``import celery_fair`` makes ``-P fair``
    a pool name, and loads no part of the worker but the alias."""
    script = textwrap.dedent(
        """
        import sys
        import celery.concurrency
        import celery_fair
        assert celery.concurrency.ALIASES["fair"] == "celery_fair.worker.pool:FairPool"
        assert "celery_fair.worker.gate" not in sys.modules
        assert "celery_fair.worker.pool" not in sys.modules
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_first_name_that_needs_celery_registers_the_pool():
    """A process that imports celery-fair before Celery gets ``-P fair`` from its first use of
    a Celery-facing name (``fair_task``), as an app module that defines fair tasks does."""
    script = textwrap.dedent(
        """
        import sys
        import celery_fair
        assert "celery" not in sys.modules
        celery_fair.fair_task
        import celery.concurrency
        assert celery.concurrency.ALIASES["fair"] == "celery_fair.worker.pool:FairPool"
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
