"""Output shown in the README and the guides is what the command prints
today: each shown block is produced again by its command here and compared
line by line.

A page marks a block in one of two ways:
- `<!-- shown output of: COMMAND -->` on the line before the block: the
  block is part of what COMMAND prints;
- lines that begin with `$ ` inside the block: each is a command, and the
  lines after it are part of what it prints.
The lines shown must appear in the output in that order and next to each
other; a `...` line skips any number of output lines. Numbers with a
decimal point may differ by 0.03 or 5% (a run's losses and accuracies are
not bit-exact without `--deterministic`); times and rates are not compared
(they are the machine's); every other character must be equal. Commands run
in a fresh folder, `tower-*` from this environment.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from conftest import BIN, REPO

PAGES = ["README.md", "docs/src/getting-started.md", "docs/src/guides/placement-log.md",
         "docs/src/guides/reducers.md"]
MARKER = re.compile(r"^<!-- shown output of: (.+) -->$")
# The machine's own figures: compared as the words around them only.
VOLATILE = [
    (re.compile(r"\b\d+m?s/step\b"), "<time>/step"),
    (re.compile(r"━+\s\d+s\b"), "━ <time>"),
    (re.compile(r"\b(images|sequences)/s: \d+"), r"\1/s: <rate>"),
    (re.compile(r"\b\d+(\.\d+)? (ms|s|min)\b"), r"<time> \2"),
]
NUMBER = re.compile(r"-?\d+\.\d+")


def shown_blocks(page: str) -> list[tuple[str, int, list[str]]]:
    """(command, line number, lines shown) for each marked block of `page`."""
    lines = open(os.path.join(REPO, page)).read().splitlines()
    found, k = [], 0
    while k < len(lines):
        marker = MARKER.match(lines[k])
        assert not marker or lines[k + 1] == "```", (
            f"{page}:{k + 1}: a shown-output marker must be followed by a ``` block")
        if not lines[k].startswith("```"):
            k += 1
            continue
        end = lines.index("```", k + 1)
        body = lines[k + 1:end]
        command = MARKER.match(lines[k - 1]) if k else None
        if lines[k] == "```" and command:
            found.append((command.group(1), k + 2, body))
        elif lines[k] == "```":
            starts = [n for n, line in enumerate(body) if line.startswith("$ ")]
            for n, stop in zip(starts, [*starts[1:], len(body)]):
                found.append((body[n][2:], k + 2 + n, body[n + 1:stop]))
        k = end + 1
    return found


def normal(line: str) -> str:
    line = line.rstrip().replace(os.path.expanduser("~") + "/", "~/")
    for pattern, replacement in VOLATILE:
        line = pattern.sub(replacement, line)
    return line


def same_line(shown: str, printed: str) -> bool:
    a, b = normal(shown), normal(printed)
    if NUMBER.sub("#", a) != NUMBER.sub("#", b):
        return False
    return all(abs(float(x) - float(y)) <= max(0.03, 0.05 * abs(float(x)))
               for x, y in zip(NUMBER.findall(a), NUMBER.findall(b), strict=True))


def mismatch(shown: list[str], printed: list[str]) -> str | None:
    """None when `shown` is part of `printed` as the module says; else the
    first shown line that is not, and what the command printed there."""
    if not shown:
        return "nothing shown"
    starts = [k for k, line in enumerate(printed) if same_line(shown[0], line)]
    if not starts:
        return f"not printed: {shown[0]!r}"
    at, skipping = starts[0], False
    for line in shown[1:]:
        if line.strip() == "...":
            skipping = True
            continue
        at += 1
        while skipping and at < len(printed) and not same_line(line, printed[at]):
            at += 1
        skipping = False
        if at >= len(printed):
            return f"not printed: {line!r} (the output ended)"
        if not same_line(line, printed[at]):
            return f"shown {line!r}, printed {printed[at]!r}"
    return None


def run(command: str, folder: str) -> list[str]:
    words = command.split()
    name = os.path.basename(words[0])
    assert name.startswith("tower-"), command
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CPU_ALLOCATOR_USE_BFC")}
    # Run as the README does: from the working folder, by .venv/bin/.
    os.makedirs(os.path.join(folder, ".venv"), exist_ok=True)
    link = os.path.join(folder, ".venv", "bin")
    if not os.path.exists(link):
        os.symlink(BIN, link)
    done = subprocess.run([os.path.join(".venv", "bin", name), *words[1:]], cwd=folder,
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr[-2000:]}"
    return (done.stdout + done.stderr).splitlines()


BLOCKS = [(page, *block) for page in PAGES for block in shown_blocks(page)]


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    """Each shown command's output, run once."""
    cache = {}

    def output(command):
        if command not in cache:
            cache[command] = run(command, str(tmp_path_factory.mktemp("shown")))
        return cache[command]

    return output


def test_every_page_named_shows_output():
    assert {page for page, *_ in BLOCKS} == set(PAGES)


@pytest.mark.slow  # each block's command trains
@pytest.mark.parametrize("page, command, line, shown", BLOCKS,
                         ids=[f"{page}:{line}" for page, _, line, _ in BLOCKS])
def test_shown_output_is_what_the_command_prints(page, command, line, shown, printed):
    problem = mismatch(shown, printed(command))
    assert problem is None, f"{page}:{line}: {command}: {problem}"


@pytest.mark.slow
def test_a_planted_change_of_one_line_fails(printed):
    page, command, line, shown = BLOCKS[0]
    assert page == "README.md"
    planted = list(shown)
    k = next(n for n, text in enumerate(planted) if "reduce   /cpu:0" in text)
    planted[k] = planted[k].replace("mean of 2 gradients", "mean of 3 gradients")
    problem = mismatch(planted, printed(command))
    assert problem.startswith(f"shown {planted[k]!r}, printed '  reduce   /cpu:0   "
                              "variables, mean of 2 gradients, "), problem
