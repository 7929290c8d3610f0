"""The built site as a reader sees it: every page opened in headless
Chromium (Debian's package, driven by Playwright) at a given width, and what
would trouble a reader found on it.

What counts as a fault on a page:
- an element reaching past the content column (or the page scrolling
  sideways), unless it sits inside something that scrolls by itself (a code
  block's or a wide table's own scroll bar);
- a word broken across two lines inside a table cell ("hierarchic / al"),
  and inline code broken across lines in a table (`--` / `optimizer`);
- an image that did not load;
- a page with no text;
- a raw include or reference line (`--8<--`, `::: name`) left in the text.

`faults(site, width)` returns them as lines, `screenshot()` writes a page's
picture; tests/test_site.py runs them on the built site.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import http.server
import os
import shutil
import threading

# Everything the page is asked, in one script: a list of fault strings.
MEASURE = r"""
() => {
  const faults = [];
  const column = document.querySelector('.md-content__inner');
  if (!column) return ['no content column (.md-content__inner)'];
  // The content area: the column and its margins, which Material's own
  // scroll wrappers of tables and code reach into by design.
  const right = document.querySelector('.md-content').getBoundingClientRect().right + 1;
  const name = (el) => {
    const text = (el.innerText || el.textContent || '').trim().replace(/\s+/g, ' ');
    return `<${el.tagName.toLowerCase()}${el.className && typeof el.className === 'string'
      ? ' class="' + el.className + '"' : ''}> "${text.slice(0, 50)}"`;
  };
  const scrollsItself = (el) => {
    for (let up = el.parentElement; up && up !== column; up = up.parentElement) {
      const style = getComputedStyle(up);
      if (['auto', 'scroll'].includes(style.overflowX)) return true;
    }
    return false;
  };
  if (document.documentElement.scrollWidth > window.innerWidth + 1) {
    faults.push(`the page scrolls sideways: ${document.documentElement.scrollWidth} px ` +
                `wide in a ${window.innerWidth} px window`);
  }
  const seen = new Set();
  for (const el of column.querySelectorAll('*')) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.right <= right || scrollsItself(el)) continue;
    if ([...seen].some((outer) => outer.contains(el))) continue;
    seen.add(el);
    faults.push(`wider than the column (${Math.round(box.right - right)} px past it): ` +
                name(el));
  }
  // A name of inline code broken across lines anywhere, a word in a table.
  const inline = [...column.querySelectorAll('code')].filter((c) => !c.closest('pre, td, th'));
  for (const cell of [...column.querySelectorAll('td, th'), ...inline]) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      // In code a name is all but spaces (`--optimizer`); in prose, letters.
      const re = node.parentElement.closest('code') ? /\S{2,}/g : /[A-Za-z0-9_]{2,}/g;
      for (let m = re.exec(node.data); m; m = re.exec(node.data)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
        if (lines.size > 1) faults.push(`a word broken across lines in a table: "${m[0]}"`);
      }
    }
  }
  for (const img of column.querySelectorAll('img')) {
    if (!img.complete || img.naturalWidth === 0) {
      faults.push(`an image that did not load: ${img.getAttribute('src')}`);
    }
  }
  const text = column.innerText || '';
  if (text.replace(/\s+/g, '').length < 200) faults.push('an empty page');
  for (const line of text.split('\n')) {
    if (/^\s*(--8<--|:::\s*\S)/.test(line)) {
      faults.push(`a raw include or reference line: "${line.trim().slice(0, 60)}"`);
    }
  }
  return faults;
}
"""


def chromium() -> str | None:
    """Debian's Chromium, if installed (scripts/setup installs it)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def pages(site: str) -> list[str]:
    """Every page of the built site, as its path from the site's root."""
    found = glob.glob(os.path.join(site, "**", "index.html"), recursive=True)
    return sorted(os.path.relpath(p, site) for p in found)


@contextlib.contextmanager
def served(site: str):
    """The site on a local HTTP server (as a reader's browser gets it): its
    address."""
    handler = functools.partial(_Quiet, directory=site)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def browser():
    """Headless Chromium through Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as play:
        launched = play.chromium.launch(executable_path=chromium(), headless=True,
                                        args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def faults(site: str, widths=(1280, 800), only=None) -> list[str]:
    """Each fault of each page (`only`: these pages), as
    `page @ width: fault`."""
    found = []
    with served(site) as root, browser() as chrome:
        for width in widths:
            page = chrome.new_page(viewport={"width": width, "height": 900})
            for path in only or pages(site):
                page.goto(root + path.removesuffix("index.html"), wait_until="load")
                found += [f"{path} @ {width}px: {f}" for f in page.evaluate(MEASURE)]
            page.close()
    return found


def screenshot(site: str, paths, out: str, width: int = 1280) -> list[str]:
    """Full-page pictures of `paths` at `width`, written to `out`."""
    os.makedirs(out, exist_ok=True)
    written = []
    with served(site) as root, browser() as chrome:
        page = chrome.new_page(viewport={"width": width, "height": 900})
        for path in paths:
            page.goto(root + path.removesuffix("index.html"), wait_until="load")
            name = os.path.join(out, (os.path.dirname(path) or "home").replace("/", "-")
                                + f"-{width}.png")
            page.screenshot(path=name, full_page=True)
            written.append(name)
    return written
