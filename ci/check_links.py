#!/usr/bin/env python3
"""Every relative link of the project's Markdown resolves: the file (or
folder) exists, and an #anchor names a heading of the target as GitHub slugs
it. Checks README.md, docs/*.md, tests/README.md, launch/README.md and
tests/data/README.md (or the files given); web links are not followed.
Prints each broken link with its file and line; exits 1 if there is one.
"""
import functools
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT = ["README.md", "docs/*.md", "tests/README.md", "launch/README.md", "tests/data/README.md"]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(heading):
    """GitHub's anchor for a heading: the text without markup, lower case,
    punctuation dropped except '-' and '_', each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def lines_outside_fences(text):
    """(line number, line) for each line not inside a fenced code block."""
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield number, line


@functools.cache
def anchors(path):
    """The anchors of a page's headings; a repeated heading gets -1, -2, ..."""
    seen, found = {}, set()
    for _, line in lines_outside_fences(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def check(path, problems):
    """Appends each broken link of `path`; returns how many links it checked."""
    checked = 0
    for number, line in lines_outside_fences(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # code spans hold no links
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            checked += 1
            file_part, _, anchor = target.partition("#")
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading '#{anchor}' in {dest.relative_to(ROOT)}")
    return checked


def main():
    names = sys.argv[1:] or DEFAULT
    files = sorted({p for name in names for p in ROOT.glob(name)})
    problems = []
    checked = sum(check(path, problems) for path in files)
    print("\n".join(problems) if problems else f"ok: {checked} relative links in {len(files)} files resolve")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
