"""Every test the docs name as the proof of a behaviour exists (``tests/...py::test_name``)."""

from __future__ import annotations

import json
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


DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "examples").glob("*/README.md")),
]
#: A path of the repository named in prose or a command (``examples/git_server/run.py``).
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:examples|tests|src|docs|benchmarks|\.ci|docker)/[\w./-]*\w)"
)
#: A relative link (``[app.py](app.py)``, ``[x](operations.md#lookahead)``).
LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)#\s]+)")
#: A file a command reads: ``--config FILE``, ``python FILE``.
READ_BY_COMMAND = re.compile(r"(?:--config|python3?)\s+(?!-)(\S+\.(?:toml|json|py))\b")


def fenced_blocks(text: str) -> list[tuple[str, str, str]]:
    """Each fenced block of a Markdown text: (language, body, the text before it)."""
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        blocks.append((match.group(1), match.group(2), text[: match.start()]))
    return blocks


def test_every_file_path_the_docs_name_exists():
    missing = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        for path in REPO_PATH.findall(text):
            if not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
        for path in LINK.findall(text):
            if not (doc.parent / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: link {path}")
        for lang, body, _ in fenced_blocks(text):
            if lang in ("sh", "console", "bash", ""):
                for path in READ_BY_COMMAND.findall(body):
                    if not (ROOT / path).exists():
                        missing.append(f"{doc.relative_to(ROOT)}: command reads {path}")
    assert missing == []


def _rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines() if line.strip()]


def test_the_simulator_traces_in_the_docs_run_and_give_the_rows_shown():
    from celery_fair.sim import format_table, load_bundled, parse_trace, simulate

    blocks = fenced_blocks((ROOT / "docs" / "simulator.md").read_text())
    ran = 0
    last: object = None  # the trace of the last JSON block
    for lang, body, before in blocks:
        if lang == "json" and '"jobs"' in body and '"types"' in body:
            if "..." in body:  # an excerpt: of the bundled example the text before names
                name = re.findall(r"--example (\w[\w-]*)", before)[-1]
                bundled = load_bundled(name)
                shown = json.loads(re.sub(r",?\s*\.\.\.", "", body))
                assert {k: v for k, v in shown.items() if k != "jobs"} == {
                    k: v for k, v in bundled.items() if k != "jobs"
                }, name
                assert all(job in bundled["jobs"] for job in shown["jobs"]), name
                last = bundled
            else:
                last = json.loads(body)
            trace = parse_trace(last)
            simulate(trace)  # it runs
            ran += 1
        elif lang == "console" and body.startswith("$ celery-fair simulate"):
            command = body.splitlines()[0]
            example = re.search(r"--example (\w[\w-]*)", command)
            data = load_bundled(example.group(1)) if example else last
            trace = parse_trace(data)
            got = _rows(format_table(trace, simulate(trace)))
            shown = [row for row in _rows(body)[1:] if row != ["..."]]
            assert shown, command
            assert all(row in got for row in shown), (command, shown, got)
    assert ran >= 3  # weights and pauses, allocation caps, starvation


#: A relative link to a heading: ``[x](operations.md#lookahead)``, ``[x](#lookahead)``.
ANCHORED_LINK = re.compile(r"\]\((?!https?:|mailto:)([^)#\s]*)#([^)\s]+)\)")


def heading_anchors(text: str) -> set[str]:
    """The anchors a Markdown renderer (GitHub's rule) gives the headings of ``text``: lower
    case, links reduced to their words, every character but letters, digits, ``_``, ``-`` and
    spaces dropped, spaces made ``-``; a repeated anchor gets ``-1``, ``-2``... Lines inside
    fenced blocks are not headings (a shell comment is not a title)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    seen: dict[str, int] = {}
    anchors = set()
    for title in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose, re.MULTILINE):
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).lower()
        anchor = re.sub(r"[^\w\- ]", "", words).replace(" ", "-")
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return anchors


def test_every_link_to_a_heading_finds_it():
    """A link into a page lands on its section: a heading renamed or moved to another page
    (docs/benchmarks.md's history went to docs/benchmarks-history.md) breaks no link."""
    missing = []
    for doc in DOCUMENTS:
        for path, anchor in ANCHORED_LINK.findall(doc.read_text()):
            target = doc.parent / path if path else doc
            if not target.exists() or target.suffix != ".md":
                continue  # a missing file is the test above's finding
            if anchor not in heading_anchors(target.read_text()):
                missing.append(f"{doc.relative_to(ROOT)}: {path}#{anchor}")
    assert missing == []


def test_heading_anchors_follow_the_renderers_rule():
    text = (
        "# A killed worker (`benchmarks/kill_bench.py`)\n"
        "## End to end: plain Celery against `-P fair`\n"
        "```sh\n# a shell comment\n```\n"
        "## Lookahead\n### Lookahead\n"
        "## Policies by fairness key: [`fair_keys`](x.md)\n"
    )
    assert heading_anchors(text) == {
        "a-killed-worker-benchmarkskill_benchpy",
        "end-to-end-plain-celery-against--p-fair",
        "lookahead",
        "lookahead-1",
        "policies-by-fairness-key-fair_keys",
    }
