"""Checks that keep the documentation true to the code, one function each,
every one taking a page's text and returning what is wrong in it (empty
when nothing is): names of the Python API that do not exist or are not
public, command lines the commands would refuse, figures without a date and
a machine, and sentences about how the project was made rather than about
the product. tests/test_docs.py runs them over every page and the README."""

from __future__ import annotations

import importlib
import re
import shlex

# Where `engine.*` may be named: the contributors' layout page, and the
# directives that render a module's docstring as a reference page.
INTERNAL_PAGES = ("layout.md",)

COMMANDS = {
    "tower-train": ("towers.cli.train", "tower_train"),
    "tower-compare": ("towers.cli.compare", "tower_compare"),
    "tower-data": ("towers.cli.data", "tower_data"),
    "tower-placement": ("towers.cli.placement", "tower_placement"),
    "tower-reduce-bench": ("towers.cli.reduce_bench", "reduce_bench"),
    "tower-worker": ("towers.cli.worker", "tower_worker"),
}

# Words that say how the project was made, not what the product does.
DIARY = (
    "those days", "next cut", "is missed", "are missed", "the new tests", "before it did",
    "this 2-core machine", "ci machine", "two runs of it", "minutes apart", "/root/",
    "this session", "we measured", "was measured today", "as of now", "for now",
    "today's default", "the default then", "now run", "reason not found", "does not explain",
    "of that day",
)

MONTHS = r"(?:20\d\d-\d\d-\d\d)"
MACHINES = r"(?i:H100|H200|P100|V100|A100|DGX|CPU|cores?|GPU|nvswitch|ethernet|infiniband)"


def python_names(text: str) -> list[str]:
    """Every `towers.x.y` and `engine.x.y` written in `text`."""
    return re.findall(r"(?<![\w./-])((?:towers|engine)(?:\.[A-Za-z_]\w*)+)", text)


def resolves(name: str) -> bool:
    """True when `name` is a module, or an attribute reached from one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                value = getattr(value, part)
        except AttributeError:
            return False
        return True
    return False


def bad_names(page: str, text: str) -> list[str]:
    """Names that do not resolve, and `engine.*` names on a user's page
    (outside a `:::` reference directive)."""
    wrong = []
    for line in text.splitlines():
        for name in python_names(line):
            if not resolves(name):
                wrong.append(f"{name}: no such name")
            elif (name.startswith("engine.") and not page.endswith(INTERNAL_PAGES)
                  and not line.lstrip().startswith(":::")):
                wrong.append(f"{name}: internal; name the public towers.* API")
    return wrong


def command_lines(text: str) -> list[str]:
    """The command lines in `text` that run one of COMMANDS: in code blocks
    (continuation lines joined, prompts and comments dropped) and in inline
    code."""
    lines, out, inside = text.splitlines(), [], False
    joined = ""
    for line in lines:
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        joined += line.rstrip()[:-1] + " " if line.rstrip().endswith("\\") else line
        if line.rstrip().endswith("\\"):
            continue
        # A command sent to the background (`... &`) is checked as itself.
        command, joined = joined.strip().removeprefix("$ ").removesuffix(" &"), ""
        first = command.split(" ", 1)[0]
        if first.rsplit("/", 1)[-1] in COMMANDS:
            out.append(command)
    names = "|".join(COMMANDS)
    # Inline: a command with arguments (a bare command name is only named).
    out += re.findall(rf"(?<!`)`((?:\.venv/bin/)?(?:{names}) [^`]+)`", text)
    return out


def bad_commands(text: str) -> list[str]:
    """Command lines that the command's own parser (click) refuses; the
    command is not run."""
    import click

    wrong = []
    for line in command_lines(text):
        words = shlex.split(line, comments=True)
        name = words[0].rsplit("/", 1)[-1]
        module, attribute = COMMANDS[name]
        command = getattr(importlib.import_module(module), attribute)
        # Eager flags (--help, --version, --list-devices) would act on being
        # parsed; they are flags that exist, so the rest is what is checked.
        eager = {"-h", "--help", *(opt for param in command.params if param.is_eager
                                    for opt in param.opts)}
        words = [word for word in words if word not in eager]
        try:
            command.make_context(name, words[1:], resilient_parsing=False)
        except click.ClickException as err:
            wrong.append(f"{line}: {err.format_message()}")
    return wrong


def figure_rows(text: str) -> list[str]:
    """Table rows that hold a measured figure (a rate or a time)."""
    unit = r"\d[\d,.]*\s*(?:images/s|img/s|seq/s|sequences/s|tokens/s|ms|GB/s|MB/s|x\b)"
    return [line for line in text.splitlines()
            if line.startswith("|") and not re.match(r"^\|[\s:|-]+\|$", line)
            and re.search(unit, line)]


def undated_rows(text: str) -> list[str]:
    """Figure rows whose table names no date and machine, in the row, the
    table's header or the last paragraph of prose before the table."""
    wrong = []
    blocks = re.split(r"\n\s*\n", text)
    for k, block in enumerate(blocks):
        rows = figure_rows(block)
        if not rows:
            continue
        prose = [b for b in blocks[:k] if not b.lstrip().startswith(("```", "|", "!["))]
        context = prose[-1] if prose else ""
        header = block.splitlines()[0]
        for row in rows:
            where = " ".join((row, header, context))
            if not (re.search(MONTHS, where) and re.search(MACHINES, where)):
                wrong.append(row)
    return wrong


def diary_phrases(text: str) -> list[str]:
    """Phrases about the making of the project, with their line."""
    lowered = text.lower()
    return [f"{phrase!r} in: {line.strip()}" for phrase in DIARY if phrase in lowered
            for line in text.splitlines() if phrase in line.lower()]
