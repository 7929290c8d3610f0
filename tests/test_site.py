"""The site as a reader's browser shows it: every page of the built site,
opened in headless Chromium at 1280 and 800 pixels, fits its column (a wide
table or code block scrolls inside itself), breaks no word or flag across
lines in a table, loads every image, and shows no raw include line; and
each of those faults, planted, fails the check."""

from __future__ import annotations

import os

import browser_checks as browser
import pytest
from test_docs import DOCS, build, docs_copy  # noqa: F401 (a fixture)

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


PLANTED = {
    "an over-wide table": ('<table class="planted" style="width:1700px"><tr><td>a table wider '
                           'than any column</td></tr></table>',
                           "wider than the column"),
    "a missing image": ('<img src="../images/no-such-picture.png" alt="planted">',
                        "an image that did not load: ../images/no-such-picture.png"),
    "a raw include line": ("--8<-- docs/examples/first_run.py",
                           'a raw include or reference line: "--8<-- docs/examples/first_run.py"'),
}


@pytest.mark.parametrize("fault", sorted(PLANTED))
def test_a_planted_fault_fails_the_browser_check(fault, docs_copy, tmp_path):  # noqa: F811
    text, said = PLANTED[fault]
    page = docs_copy / "src" / "concepts.md"
    page.write_text(page.read_text() + f"\n\n{text}\n")
    result = build(str(docs_copy), str(tmp_path / "site"))
    assert result.returncode == 0, result.stderr[-3000:]
    found = browser.faults(str(tmp_path / "site"), widths=(1280,),
                           only=["concepts/index.html"])
    assert any(f.startswith("concepts/index.html @ 1280px: " + said) for f in found), found
