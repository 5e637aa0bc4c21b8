"""The user-facing docs stand on their own: every relative Markdown link in README.md, docs/ and eval/README.md
names a file or folder of this repository, none points outside it (the docs must not send users to a sibling
checkout), and every ``--replayssm-*`` flag the launcher accepts is in README's settings table."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "eval" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_relative_links_resolve_inside_the_repo(doc):
    bad = []
    links = LINK.findall(doc.read_text())
    if doc.name == "README.md" and doc.parent == ROOT:
        assert len(links) >= 5, links  # the README points into docs/ (method, results, supported, ...)
    for target in links:
        if re.match(r"^[a-z]+://|^mailto:|^#", target):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if ROOT not in path.parents and path != ROOT:
            bad.append(f"{target} (outside the repository)")
        elif not path.exists():
            bad.append(f"{target} (missing)")
    assert not bad, f"{doc.relative_to(ROOT)}: {bad}"


def test_every_launcher_flag_is_in_the_readme_settings_table():
    from sglang_replayssm.config import add_flags

    p = argparse.ArgumentParser()
    add_flags(p)
    flags = {s for a in p._actions for s in a.option_strings if s.startswith("--replayssm-")}
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Settings"):]
    missing = sorted(f for f in flags if f"`{f}" not in table)
    deprecated = {"--replayssm-staged"}  # named in the replay-ring row as the old spelling
    assert flags and set(missing) <= deprecated, missing
