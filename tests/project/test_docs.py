"""The documentation: README.md and docs/ link only to files and headings that exist, every `pacore`
command they show parses, and the MkDocs site builds with warnings as errors."""
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _prose(path: Path) -> str:
    """The page without its fenced code blocks (a `# comment` there is no heading, a link no link)."""
    return FENCE.sub("", path.read_text())


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading (MkDocs' toc gives the same for the headings used here)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _prose(path), re.M):
        slug = github_anchor(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    prose = re.sub(r"`[^`\n]*`", "", _prose(path))  # code spans hold no links
    return re.findall(r"\]\(([^)\s]+)\)", prose)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_every_docs_page_is_in_the_site_and_linked_from_the_readme():
    nav = (ROOT / "mkdocs.yml").read_text()
    readme = (ROOT / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f": {page.name}" in nav, f"{page.name} is missing from mkdocs.yml's nav"
        if page.name != "index.md":
            assert f"(docs/{page.name}" in readme, f"README.md links to no docs/{page.name}"


def _pacore_commands(page: Path) -> list[str]:
    out = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith(".venv/bin/pacore "):
                out.append(line.split("pacore ", 1)[1].rstrip(" &"))
    return out


def test_every_pacore_command_shown_parses():
    from pacore.cli import build_parser
    parser = build_parser()
    commands = [c for page in PAGES for c in _pacore_commands(page)]
    assert len(commands) > 20
    for command in commands:
        argv = shlex.split(command, comments=True)
        if "--help" not in argv:
            parser.parse_args(argv)


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="MkDocs is in the dev extra: pip install -e '.[dev]'")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "guarantees" / "index.html").is_file()
