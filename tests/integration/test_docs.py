"""The docs a newcomer reads: README.md stays a few screens, and every link in it, in
docs/*.md and in deploy/README.md leads to a file (and heading) inside the repository."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "deploy" / "README.md"]

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
AUTOLINK = re.compile(r"<([a-z][a-z0-9+.-]*:[^>\s]+)>", re.IGNORECASE)
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return "\n".join(kept)


def links(text: str) -> list[str]:
    body = prose(text)
    return [
        *LINK.findall(body),
        *AUTOLINK.findall(body),
        *REFERENCE.findall(body),
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        heading = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not heading:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_slugs_follow_github() -> None:
    assert slug("PostgreSQL: migrations that run once") == "postgresql-migrations-that-run-once"
    assert slug("The demo: task #312, evicted after its push") == (
        "the-demo-task-312-evicted-after-its-push"
    )
    assert slug("Store and control API: `./run bench control_api` (about 30 s)") == (
        "store-and-control-api-run-bench-control_api-about-30-s"
    )


def test_the_docs_exist_and_readme_points_to_them() -> None:
    assert (REPO / "docs").is_dir()
    readme_links = {link.split("#")[0] for link in links((REPO / "README.md").read_text())}
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"docs/{page.name}" in readme_links, f"README.md does not link {page.name}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves_inside_the_repository(doc: Path) -> None:
    problems = []
    for link in links(doc.read_text(encoding="utf-8")):
        if SCHEME.match(link) or link.startswith("//"):
            problems.append(f"{link}: points outside the repository")
            continue
        target, _, anchor = link.partition("#")
        if target.startswith("/"):
            problems.append(f"{link}: absolute path (GitHub resolves it to the site root)")
            continue
        path = (doc.parent / unquote(target)).resolve() if target else doc
        if not path.is_relative_to(REPO) or "shared/" in target:
            problems.append(f"{link}: leaves the repository")
        elif not path.exists():
            problems.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and unquote(anchor) not in anchors(path):
            problems.append(f"{link}: {path.relative_to(REPO)} has no heading #{anchor}")
    assert not problems, f"{doc.relative_to(REPO)}:\n" + "\n".join(problems)


def test_no_doc_names_the_spec_outside_the_repository() -> None:
    for doc in DOCS:
        assert "../shared" not in doc.read_text(encoding="utf-8"), doc


def test_readme_stays_a_few_screens() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move detail to docs/"


def test_the_layout_names_every_part_of_the_package() -> None:
    """docs/layout.md's tree and ``ls sidecar/`` agree, both ways."""
    text = (REPO / "docs" / "layout.md").read_text()
    tree = text[text.index("```\nsidecar/") : text.index("```", text.index("```\nsidecar/") + 3)]
    listed = set(re.findall(r"^  ([a-z_]+(?:/|\.py))", tree, re.MULTILINE))
    present = {
        f"{p.name}/" if p.is_dir() else p.name
        for p in (REPO / "sidecar").iterdir()
        if not p.name.startswith("__") and (p.is_dir() or p.suffix == ".py")
    }
    assert listed == present, (
        f"only in the layout: {listed - present}; only in sidecar/: {present - listed}"
    )
