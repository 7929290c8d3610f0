"""The site as a reader's browser shows it: every page of the built site,
opened in headless Chromium at 1280 and 800 pixels, fits its column (a wide
table or code block scrolls inside itself), breaks no word or flag across
lines in a table, loads every image, and shows no raw include line; and
each of those faults, planted, fails the check."""

from __future__ import annotations

import os
import shutil

import browser_checks as browser
import pytest
from test_docs import DOCS, REPO, build

pytestmark = pytest.mark.slow  # a site build and a browser: the full suite runs them


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    assert browser.chromium(), ("no Chromium here: scripts/setup installs Debian's (apt-get "
                                "install chromium) for this test")
    out = tmp_path_factory.mktemp("site")
    result = build(DOCS, str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    return str(out)


def test_every_page_reads_in_a_browser_at_1280_and_800_pixels(site, tmp_path):
    pages = browser.pages(site)
    assert len(pages) >= 25 and "reference/python/index.html" in pages
    assert browser.faults(site) == []
    shots = browser.screenshot(site, ["index.html", "getting-started/index.html",
                                      "guides/reducers/index.html", "benchmarks/index.html",
                                      "reference/python/index.html"],
                               os.environ.get("TOWER_SCREENSHOTS", str(tmp_path)))
    assert all(os.path.getsize(shot) > 20_000 for shot in shots), shots


# Each fault planted in a page of its own, so that one build holds all three.
PLANTED = {
    "an over-wide table": ("concepts", '<table class="planted" style="width:1700px"><tr><td>a '
                           'table wider than any column</td></tr></table>',
                           "wider than the column"),
    "a missing image": ("troubleshooting", '<img src="../images/no-such-picture.png" '
                        'alt="planted">',
                        "an image that did not load: ../images/no-such-picture.png"),
    "a raw include line": ("tf-distribute", "--8<-- docs/examples/first_run.py",
                           'a raw include or reference line: "--8<-- docs/examples/first_run.py"'),
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The site built with every fault of PLANTED in its page."""
    root = tmp_path_factory.mktemp("planted")
    copy = root / "repo" / "docs"  # as test_docs.docs_copy, once for the module
    shutil.copytree(DOCS, copy, ignore=shutil.ignore_patterns("site"))
    for name in ("towers", "engine", "tests", "scripts", "pyproject.toml"):
        (root / "repo" / name).symlink_to(os.path.join(REPO, name))
    for name, text, _ in PLANTED.values():
        page = copy / "src" / f"{name}.md"
        page.write_text(page.read_text() + f"\n\n{text}\n")
    result = build(str(copy), str(root / "site"))
    assert result.returncode == 0, result.stderr[-3000:]
    return str(root / "site")


@pytest.mark.parametrize("fault", sorted(PLANTED))
def test_a_planted_fault_fails_the_browser_check(fault, planted):
    name, _, said = PLANTED[fault]
    found = browser.faults(planted, widths=(1280,), only=[f"{name}/index.html"])
    assert any(f.startswith(f"{name}/index.html @ 1280px: " + said) for f in found), found
