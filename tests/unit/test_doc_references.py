"""Every test the docs name as the proof of a behaviour exists (``tests/...py::test_name``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def test_every_test_the_docs_name_exists():
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = 0
    missing = []
    for doc in documents:
        for path, name in REFERENCE.findall(doc.read_text()):
            named += 1
            source = ROOT / path
            text = source.read_text() if source.exists() else ""
            if not re.search(rf"^(async )?def {name}\b", text, re.MULTILINE):
                missing.append(f"{doc.name}: {path}::{name}")
    assert named > 50  # failure-modes.md alone names dozens
    assert missing == []
