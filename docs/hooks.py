"""MkDocs hooks: the site fails to build when a public name has no docstring
or no place in the API reference, page snippets resolve from the
repository's root wherever mkdocs is started, the command reference is
made from the click commands as their `--help` groups them (and fails on an
option without help), and inline code keeps its names whole."""

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


def untyped() -> list[str]:
    """Parameters of public functions, classes and their public methods
    (what users call) without a type annotation, or not described under
    Args in the docstring (a class's, for its constructor)."""
    package = griffe.load(os.path.join(REPO, "towers"), search_paths=[REPO], resolve_aliases=True,
                          resolve_external=True)
    found = []

    def check(function, label, docstring=None):
        docstring = docstring or function.docstring
        described = set()
        if docstring is not None:
            for section in docstring.parse("google", warn_missing_types=False,
                                           warnings=False):
                if section.kind.value in ("parameters", "attributes"):
                    described |= {p.name.lstrip("*") for p in section.value}
        # A dataclass's fields may be described where they are declared.
        owner = function.parent
        if owner is not None and owner.is_class:
            described |= {name for name, member in owner.members.items()
                          if member.is_attribute and member.docstring}
        for parameter in function.parameters:
            if parameter.name in ("self", "cls"):
                continue
            if parameter.annotation is None:
                found.append(f"{label}({parameter.name}: no type)")
            if docstring is not None and parameter.name not in described:
                found.append(f"{label}({parameter.name}: not under Args)")

    for dotted in PUBLIC:
        module = package if dotted == "towers" else package[dotted.split(".", 1)[1]]
        for name in sorted(module.exports or ()):
            member = module[name]
            try:
                target = member.final_target if member.is_alias else member
            except griffe.AliasResolutionError:
                continue
            if target.is_function:
                check(target, f"{dotted}.{name}")
            elif target.is_class:
                for method_name, method in target.all_members.items():
                    if method.is_alias:
                        continue
                    if method.is_function and (method_name == "__init__"
                                               or not method_name.startswith("_")):
                        label = f"{dotted}.{name}" + (
                            "" if method_name == "__init__" else f".{method_name}")
                        check(method, label, target.docstring
                              if method_name == "__init__" and not method.docstring else None)
    return found


def on_page_content(html, page, config, files):
    """Inline code keeps its names whole (`keep_names_whole`)."""
    return keep_names_whole(html)


# In reference/cli.md, a line `<!-- command: module:attribute prog -->`
# becomes that click command's reference: its help, usage, and its options
# in the groups its `--help` shows, then each subcommand the same way.
_COMMAND = re.compile(r"^<!-- command: ([\w.]+):(\w+) ([\w-]+) -->$", re.M)


def command_reference(command, prog: str, level: int = 2, parent=None) -> str:
    """One command's reference, as Markdown with HTML tables (whose cells are
    escaped, so that `[a|b]` and `<N>` show as `--help` prints them)."""
    import html
    import inspect

    import click

    from towers.cli.common import option_groups

    ctx = click.Context(command, info_name=prog.split()[-1], parent=parent)
    if ctx.help_option_names == ["--help"]:
        ctx.help_option_names = ["-h", "--help"]
    text = inspect.cleandoc(command.help or "").replace("\b\n", "")
    parts = [f"{'#' * level} {prog}", "", text, "", "```", command.get_usage(ctx), "```", ""]
    missing = [param.get_help_record(ctx)[0] for param in command.get_params(ctx)
               if isinstance(param, click.Option) and not param.hidden
               and not (param.help or "").strip()]
    if missing:
        raise PluginError(f"{prog}: {', '.join(missing)} has no help text; give the option "
                          "a help= that says what it does")
    for title, rows in option_groups(command, ctx):
        cells = "".join(f"<tr><td><code>{html.escape(flags)}</code></td>"
                        f"<td>{html.escape(help_text)}</td></tr>" for flags, help_text in rows)
        parts += [f"**{title}**", "",
                  f"<table><thead><tr><th>option</th><th>what it does</th></tr></thead>"
                  f"<tbody>{cells}</tbody></table>", ""]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        parts.append(command_reference(sub, f"{prog} {name}", level + 1, ctx))
    return "\n".join(parts).replace(os.path.expanduser("~") + "/", "~/")


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == CLI_REFERENCE:
        import importlib
        import sys

        sys.path.insert(0, REPO)
        return _COMMAND.sub(lambda m: command_reference(
            getattr(importlib.import_module(m.group(1)), m.group(2)), m.group(3)), markdown)
    if page.file.src_uri != REFERENCE:
        return markdown
    absent = [m for m in PUBLIC if f"::: {m}\n" not in markdown and m != "towers"]
    if absent:
        raise PluginError(f"{REFERENCE} does not render {', '.join(absent)}")
    missing = undocumented()
    if missing:
        raise PluginError("public names without a docstring (give each one, or drop it from "
                          f"__all__): {', '.join(missing)}")
    bare = untyped()
    if bare:
        raise PluginError(f"public parameters without a type (annotate each): {', '.join(bare)}")
    return markdown
