"""The documentation's references resolve (README.md and docs/, built by mkdocs.yml).

`make lint` builds docs/ with `mkdocs build --strict`, which fails on a link between pages or to
an #anchor that does not exist. What MkDocs does not see is checked here, offline:

- README.md is not part of the site: each of its relative links must name a file of the
  repository, and a link into a Markdown file with an #anchor a heading of that file.
- The pages name repository files in backquotes (`tidegraph/pipelines/chain.py`,
  `tidegraph/topics/records.py: DeadLetter`), not as links, since the site holds only docs/:
  each such path must exist (a glob must match), and a name after the colon must occur in the
  file. A moved or renamed module then fails here instead of leaving a stale reference behind.
  So must a dotted name (`tidegraph.pipelines.inprocess.ingest`,
  `tests.support.fake_llm.ScriptedLLMServer`).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.glob("*.md"))
DOCUMENTS = [README, *PAGES]
# Folders of the repository whose files the docs name; a backquoted path under any other first
# component (`.tidegraph/...`, `TIDEGRAPH_DATA_DIR/...`, `/healthz`) is not a repository file.
REPO_FOLDERS = {
    "tidegraph", "processors", "pipelines", "topics", "tests", "deploy", "grafana", "benchmarks",
    "docs", ".ci",
}  # fmt: skip
# Written by the benchmarks when they run, never committed.
GENERATED = ("benchmarks/results/",)

LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCE = re.compile(r"^\s*```")


def prose(path: Path) -> str:
    """The file's text without its fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return "\n".join(lines)


def anchors(path: Path) -> set[str]:
    """The #anchors of a Markdown file's headings, as MkDocs' toc extension makes them."""
    found: set[str] = set()
    for line in prose(path).splitlines():
        match = re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)
        if match:
            slug = slugify(match.group(1).replace("`", ""), "-")
            n, unique = 0, slug
            while unique in found:
                n += 1
                unique = f"{slug}_{n}"
            found.add(unique)
    return found


def expand_braces(path: str) -> list[str]:
    match = re.search(r"\{([^{}]*,[^{}]*)\}", path)
    if not match:
        return [path]
    head, tail = path[: match.start()], path[match.end() :]
    return [p for part in match.group(1).split(",") for p in expand_braces(head + part + tail)]


def defines(path: Path, name: str) -> bool:
    """Whether a module defines the name: a function, a class or an assignment."""
    pattern = rf"^\s*(?:(?:async\s+)?def|class)\s+{name}\b|^\s*{name}\s*[:=]"
    return re.search(pattern, path.read_text(), re.M) is not None


def repository_paths(path: Path) -> list[tuple[str, str | None]]:
    """(path, name or None) for every backquoted repository path of a document."""
    refs = []
    for span in CODE_SPAN.findall(prose(path)):
        target, _, name = span.partition(": ")
        target = target.strip().split("::")[0].rstrip(":,;.")
        if " " in target or "/" not in target or target.split("/")[0] not in REPO_FOLDERS:
            continue
        if target.startswith(GENERATED):
            continue
        symbol = name.strip() if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name.strip()) else None
        refs.extend((p, symbol) for p in expand_braces(target))
    return refs


def test_the_docs_have_pages_and_a_nav_listing_each() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    assert PAGES, "no docs/*.md"
    listed = set(re.findall(r":\s*([\w-]+\.md)\s*$", config, re.M))
    assert listed == {p.name for p in PAGES}, "mkdocs.yml's nav and docs/*.md differ"


def test_the_anchor_rule_is_mkdocs_own() -> None:
    # The check below is only as good as its slugs: these are the anchors MkDocs makes.
    assert "two-timelines" in anchors(DOCS / "architecture.md")
    assert "order-micro-batches-groups-in-parallel-each-group-in-sequence" in anchors(
        DOCS / "streaming.md"
    )


@pytest.mark.parametrize("doc", [README], ids=lambda p: p.name)
def test_every_link_of_the_readme_resolves(doc: Path) -> None:
    broken = []
    for target in LINK.findall(prose(doc)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: (not fetched)
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (doc.parent / file_part).resolve() if file_part else doc
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert broken == [], f"{doc.name}: broken links"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.name)
def test_every_repository_path_the_docs_name_exists(doc: Path) -> None:
    missing = []
    for path, symbol in repository_paths(doc):
        matches = sorted(ROOT.glob(path)) if any(c in path for c in "*?[") else [ROOT / path]
        if not any(m.exists() for m in matches):
            missing.append(path)
        elif symbol and matches[0].is_file() and not defines(matches[0], symbol.split(".")[0]):
            missing.append(f"{path}: {symbol} (not defined there)")
    assert missing == [], f"{doc.name} names repository paths that do not exist"


DOTTED = re.compile(r"(?:tidegraph|tests)(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def resolves(dotted: str) -> bool:
    """Whether a dotted name is a module, or an attribute of the longest module it starts with."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            if not hasattr(target, attr):
                return False
            target = getattr(target, attr)
        return True
    return False


def dotted_names(path: Path) -> set[str]:
    return {span for span in CODE_SPAN.findall(prose(path)) if DOTTED.fullmatch(span)}


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.name)
def test_every_dotted_name_the_docs_give_resolves(doc: Path) -> None:
    missing = sorted(name for name in dotted_names(doc) if not resolves(name))
    assert missing == [], f"{doc.name} names modules or objects that do not exist"


def test_the_path_check_finds_paths() -> None:
    # Guard against a check that passes because it reads nothing.
    named = {p for doc in DOCUMENTS for p, _ in repository_paths(doc)}
    assert {"tidegraph/pipelines/runner.py", "deploy/k8s", "tests/unit/test_ops.py"} <= named
    dotted = {n for doc in DOCUMENTS for n in dotted_names(doc)}
    assert "tests.support.fake_llm.ScriptedLLMServer" in dotted
    assert not resolves("tidegraph.no_such_module") and not resolves("tidegraph.settings.Nope")


# A dotted name of ours in double backquotes in a docstring or comment of the code.
CODE_NAME = re.compile(r"``((?:tidegraph|tests)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)``")
SOURCES = sorted(
    p for folder in ("tidegraph", "tests", "benchmarks") for p in (ROOT / folder).rglob("*.py")
)


def test_the_package_is_one_real_folder() -> None:
    """No link inside the package: grep, type checkers and a wheel built from any checkout see
    every module under one path (docs/architecture.md "Layers")."""
    links = [p.relative_to(ROOT) for p in (ROOT / "tidegraph").rglob("*") if p.is_symlink()]
    assert links == []


def test_every_dotted_name_the_code_gives_in_prose_resolves() -> None:
    missing = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in SOURCES
        for name in set(CODE_NAME.findall(path.read_text()))
        if not resolves(name)
    )
    assert missing == [], "docstrings or comments name modules or objects that do not exist"
