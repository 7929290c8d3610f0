"""MkDocs hooks: the site fails to build when a public name has no docstring
or no place in the API reference, page snippets resolve from the
repository's root wherever mkdocs is started, and the command reference
shows no sentinel or home folder of the machine that built it."""

from __future__ import annotations

import os
import re

import griffe
from mkdocs.exceptions import PluginError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The public modules: each one's __all__ is what users may call.
PUBLIC = ("towers", "towers.callbacks", "towers.data", "towers.models", "towers.placement",
          "towers.reducers", "towers.cost", "towers.study")
REFERENCE = "reference/python.md"
CLI_REFERENCE = "reference/cli.md"


def on_config(config):
    snippets = config["mdx_configs"].setdefault("pymdownx.snippets", {})
    snippets["base_path"] = [REPO]
    return config


def undocumented() -> list[str]:
    """Public names (in an __all__ of PUBLIC) without a docstring."""
    package = griffe.load(os.path.join(REPO, "towers"), search_paths=[REPO], resolve_aliases=True,
                          resolve_external=True)
    missing = []
    for dotted in PUBLIC:
        module = package if dotted == "towers" else package[dotted.split(".", 1)[1]]
        for name in sorted(module.exports or ()):
            if name == "__version__":
                continue
            member = module[name]
            try:
                target = member.final_target if member.is_alias else member
            except griffe.AliasResolutionError:
                target = None
            if target is None or not (target.docstring and target.docstring.value.strip()):
                missing.append(f"{dotted}.{name}")
    return missing


_PRE = re.compile(r"(<pre.*?</pre>)", re.S)
_CODE = re.compile(r"(<code[^>]*>)(.*?)(</code>)", re.S)
_PUNCTUATED = re.compile(r"(\S*[^\w\s]\S*)")


def keep_names_whole(html: str) -> str:
    """Each token of inline code with a dash or other mark (not of code blocks) wrapped in
    `<span class="nobr">`, so that the browser does not break `--optimizer`
    after its dashes (only the text between tags is touched)."""

    def code(match):
        inner = re.sub(r"(^|>)([^<]+)", lambda t: t.group(1) + _PUNCTUATED.sub(
            r'<span class="nobr">\1</span>', t.group(2)), match.group(2))
        return match.group(1) + inner + match.group(3)

    return "".join(part if part.startswith("<pre") else _CODE.sub(code, part)
                   for part in _PRE.split(html))


def on_page_content(html, page, config, files):
    """Inline code keeps its names whole (`keep_names_whole`). The command reference as a reader anywhere would see it: click 8.3 and
    later give options without a default `Sentinel.UNSET`, which
    mkdocs-click 0.9 prints (mkdocs/mkdocs-click#95), and the MNIST default
    names the building user's home folder."""
    html = keep_names_whole(html)
    if page.file.src_uri != CLI_REFERENCE:
        return html
    html = html.replace("<code>Sentinel.UNSET</code>", "-")
    return html.replace(os.path.expanduser("~") + "/", "~/")


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != REFERENCE:
        return markdown
    absent = [m for m in PUBLIC if f"::: {m}\n" not in markdown and m != "towers"]
    if absent:
        raise PluginError(f"{REFERENCE} does not render {', '.join(absent)}")
    missing = undocumented()
    if missing:
        raise PluginError("public names without a docstring (give each one, or drop it from "
                          f"__all__): {', '.join(missing)}")
    return markdown
