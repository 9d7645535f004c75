"""The layers stay layered: the core imports only the standard library, and reads no time."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import celery_fair

PACKAGE = Path(celery_fair.__file__).parent
FORBIDDEN_EVERYWHERE_IN_CORE = {"celery", "kombu", "redis", "billiard", "socket", "threading"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_core_imports_only_the_standard_library():
    for path in sorted((PACKAGE / "core").glob("*.py")):
        for name in imports_of(path):
            assert name in sys.stdlib_module_names or name == "__future__", (path.name, name)
            assert name not in FORBIDDEN_EVERYWHERE_IN_CORE, (path.name, name)


def test_only_the_clock_module_reads_time():
    for path in sorted((PACKAGE / "core").glob("*.py")):
        if path.name != "clock.py":
            assert "time" not in imports_of(path), path.name
            assert "datetime" not in imports_of(path), path.name


def test_simulator_does_not_import_celery():
    assert not imports_of(PACKAGE / "sim.py") & {"celery", "kombu", "redis"}
