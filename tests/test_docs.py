"""The documentation stands alone: its examples run, its links resolve inside the repository, and
nothing in the project points at files that a clone does not have."""
import doctest
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", *DOCS, REPO / "tests" / "data" / "tensor_core_dumps" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: pathlib.Path) -> set:
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", page.read_text(), flags=re.M)}


def test_every_doc_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    assert DOCS and all(f"docs/{page.name}" in readme for page in DOCS)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve_inside_the_repository(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.is_relative_to(REPO) and file.exists(), f"{page.name}: broken link {target}"
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file), f"{page.name}: no heading #{anchor} in {file.name}"


@pytest.mark.parametrize("page", [p for p in DOCS if "```pycon" in p.read_text()],
                         ids=lambda p: p.name)
def test_examples_run_and_print_what_the_page_says(page):
    examples = "".join(re.findall(r"```pycon\n(.*?)```", page.read_text(), re.S))
    test = doctest.DocTestParser().get_doctest(examples, {}, page.name, str(page), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert attempted > 0 and failed == 0


def test_nothing_refers_to_files_outside_the_clone():
    """No path into the development machine's shared folder or work tree (spelled in pieces so
    that this file does not match itself)."""
    outside = re.compile("|".join(re.escape(s) for s in ("../" + "shared", "/work" + "/")))
    roots = ["README.md", "setup.cfg", "pyproject.toml", "constraints", "docs", "mpt", "tests",
             "notebooks", "benchmarks", ".ci"]
    found = []
    for root in roots:
        for path in [REPO / root] if (REPO / root).is_file() else (REPO / root).rglob("*"):
            if path.is_file() and path.suffix not in (".npz", ".pyc", ".nbi", ".nbc"):
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if outside.search(line):
                        found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
