"""The documentation cannot drift: the site builds in strict mode (broken
links, missing references and undocumented public names fail it), every
runnable example in it is run here, and the README stays short and linked."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import docs_checks as checks
import pytest
from conftest import BIN, REPO

DOCS = os.path.join(REPO, "docs")
EXAMPLES = sorted(glob.glob(os.path.join(DOCS, "examples", "*.py")))


def build(docs: str, site: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([os.path.join(BIN, "mkdocs"), "build", "--strict", "-f",
                           os.path.join(docs, "mkdocs.yml"), "-d", site],
                          capture_output=True, text=True, env=env, timeout=300)


def pages() -> dict[str, str]:
    sources = os.path.join(DOCS, "src")
    return {os.path.relpath(path, sources): open(path).read()
            for path in glob.glob(os.path.join(sources, "**", "*.md"), recursive=True)}


def test_the_site_builds_in_strict_mode(tmp_path):
    result = build(DOCS, str(tmp_path / "site"))
    assert result.returncode == 0, result.stderr[-3000:]
    built = {os.path.relpath(p, tmp_path / "site") for p in
             glob.glob(str(tmp_path / "site" / "**" / "index.html"), recursive=True)}
    assert {"index.html", "getting-started/index.html", "reference/python/index.html",
            "reference/cli/index.html", "troubleshooting/index.html"} <= built
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in ("tower-train", "tower-compare", "tower-data", "tower-placement",
                    "tower-reduce-bench", "tower-worker"):
        assert f"<h2 id=\"{command}\"" in cli, command
    assert "--skip-nonfinite" in cli and "--reduce-device" in cli
    # No click sentinel for a missing default, no home folder of the builder.
    assert "Sentinel" not in cli and os.path.expanduser("~") + "/" not in cli
    assert "Epochs to train in all" in cli


@pytest.fixture
def docs_copy(tmp_path):
    """The docs beside links to the code they read, to break one of them."""
    root = tmp_path / "repo"
    shutil.copytree(DOCS, root / "docs", ignore=shutil.ignore_patterns("site"))
    for name in ("towers", "engine", "tests", "scripts", "pyproject.toml"):
        (root / name).symlink_to(os.path.join(REPO, name))
    return root / "docs"


def test_a_broken_link_fails_the_build(docs_copy, tmp_path):
    page = docs_copy / "src" / "concepts.md"
    page.write_text(page.read_text() + "\nSee [the flags](reference/no-such-page.md).\n")
    result = build(str(docs_copy), str(tmp_path / "site"))
    assert result.returncode == 1
    assert ("Doc file 'concepts.md' contains a link 'reference/no-such-page.md', but the "
            "target is not found among documentation files.") in result.stderr


def test_an_undocumented_public_name_fails_the_build(docs_copy, tmp_path):
    callbacks = docs_copy.parent / "towers" / "callbacks.py"
    copy_of_towers(docs_copy)
    callbacks.write_text(callbacks.read_text().replace(
        '__all__ = ["Callback", "EarlyStopping"]',
        '__all__ = ["Callback", "EarlyStopping", "helper"]') + "\n\ndef helper():\n    pass\n")
    result = build(str(docs_copy), str(tmp_path / "site"))
    assert result.returncode == 1
    assert ("public names without a docstring (give each one, or drop it from __all__): "
            "towers.callbacks.helper") in result.stderr


def copy_of_towers(docs_copy) -> str:
    """The docs copy's own towers/ to plant a fault in (not a link to ours)."""
    (docs_copy.parent / "towers").unlink()
    shutil.copytree(os.path.join(REPO, "towers"), docs_copy.parent / "towers")
    return str(docs_copy.parent / "towers")


def test_an_untyped_or_undescribed_parameter_fails_the_build(docs_copy, tmp_path):
    models = os.path.join(copy_of_towers(docs_copy), "models", "small.py")
    text = open(models).read()
    open(models, "w").write(text.replace(
        "def mlp(input_shape: Sequence[int], num_classes: int, *, dropout: float = 0.2)",
        "def mlp(input_shape: Sequence[int], num_classes: int, *, dropout=0.2, "
        "width: int = 128)"))
    result = build(str(docs_copy), str(tmp_path / "site"))
    assert result.returncode == 1
    assert ("public parameters without a type (annotate each): towers.models.mlp(dropout: no "
            "type), towers.models.mlp(width: not under Args)") in result.stderr


def test_an_option_without_help_fails_the_build(docs_copy, tmp_path):
    compare = os.path.join(copy_of_towers(docs_copy), "cli", "compare.py")
    text = open(compare).read()
    open(compare, "w").write(text.replace(
        'help="Epochs each reducer\'s run trains (every run the same)."', "help=None"))
    result = build(str(docs_copy), str(tmp_path / "site"))
    assert result.returncode == 1
    assert ("tower-compare: --epochs INTEGER has no help text; give the option a help= that "
            "says what it does") in result.stderr


def test_the_command_reference_has_every_option_in_its_help_group(tmp_path):
    import click

    from towers.cli.train import SECTIONS, tower_train

    result = build(DOCS, str(tmp_path / "site"))
    assert result.returncode == 0, result.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "N/A" not in cli
    train = cli.split('<h2 id="tower-train"')[1].split('<h2 id="tower-compare"')[0]
    titles = re.findall(r"<p><strong>(.*?)</strong></p>", train)
    assert titles == [t for t in SECTIONS if t != "Other"], titles
    cells = re.findall(r"<tr><td><code>(.*?)</code></td>", train)
    flags = {flag for cell in cells for flag in re.findall(r"(?<![\w-])--?[a-z][\w-]*", cell)}
    want = {flag for p in tower_train.params if isinstance(p, click.Option)
            for flag in (*p.opts, *p.secondary_opts)}
    assert flags == want | {"-h", "--help"}, flags ^ (want | {"-h", "--help"})
    for command in ("tower-data mnist", "tower-placement check", "tower-reduce-bench"):
        assert f'<h{2 + (" " in command)} id="{command.replace(" ", "-")}"' in cli


def test_every_example_is_shown_in_the_docs():
    included = set(re.findall(r'--8<-- "docs/examples/([\w.]+)"', "".join(pages().values())))
    assert included == {os.path.basename(path) for path in EXAMPLES}


# What each runnable example prints, checked line by line; python_api.py
# trains for two epochs and is run by tests/test_api.py.
CHECKS = {
    "quickstart.py": lambda out, cwd: (
        float(re.search(r"^held-out accuracy ([0-9.]+)$", out, re.M)[1]) >= 0.9
        and os.path.getsize(os.path.join(cwd, "lenet.keras")) > 100_000),
    "callbacks.py": lambda out, cwd: stopped_early(out),
    "save_and_load.py": lambda out, cwd: out == "(3, 10)\n",
    "ema.py": lambda out, cwd: (
        float(re.search(r"^held-out accuracy of the averaged weights ([0-9.]+)$", out, re.M)[1])
        >= 0.8 and out.splitlines()[-1] == "saved the averages: True"),
    "schedule.py": lambda out, cwd: out.splitlines()[:6] == [
        "step  5: learning rate 0.0500", "step 10: learning rate 0.1000",
        "step 15: learning rate 0.0854", "step 20: learning rate 0.0500",
        "step 25: learning rate 0.0146", "step 30: learning rate 0.0000"]
        and float(out.splitlines()[6].split()[-1]) >= 0.7,
    "compare.py": lambda out, cwd: compared(out, cwd),
    "papers.py": lambda out, cwd: papers_compared(out, cwd),
    "recipe.py": lambda out, cwd: recipe_ran(out, cwd),
    "placement_budget.py": lambda out, cwd: (
        out.startswith("placement of the train step (")
        and out.splitlines()[-1].startswith("['all devices: 814,")
        and "over the budget of 800,000" in out.splitlines()[-1]
        and os.path.exists(os.path.join(cwd, "step.json"))),
    "cost_model.py": lambda out, cwd: out.splitlines() == [
        "central      65536   0.415 ms busbw  0.28 GB/s",
        "central   16777216  12.114 ms busbw  2.42 GB/s",
        "ring         65536   1.087 ms busbw  0.11 GB/s",
        "ring      16777216   8.442 ms busbw  3.48 GB/s",
        "tree         65536   0.646 ms busbw  0.18 GB/s",
        "tree      16777216   1.719 ms busbw 17.08 GB/s",
    ],
}


def recipe_ran(out: str, cwd: str) -> bool:
    """Three epochs learning, and the saved best one's held-out accuracy is
    the best epoch's."""
    epochs = re.findall(r"^epoch (\d): eval_accuracy ([0-9.]+), eval_top5_accuracy ([0-9.]+)$",
                        out, re.M)
    best = re.search(r"^best\.keras: eval_accuracy ([0-9.]+)$", out, re.M)
    accuracies = [float(a) for _, a, _ in epochs]
    return (len(epochs) == 3 and best is not None and max(accuracies) >= 0.8
            and float(best[1]) == max(accuracies)
            and all(float(top) >= float(a) for _, a, top in epochs)
            and os.path.exists(os.path.join(cwd, "recipe", "best", "best.json")))


def compared(out: str, cwd: str) -> bool:
    central, powersgd = out.splitlines()
    ratio = float(re.search(r", ([0-9.]+)x the exact", powersgd)[1])
    return (central.startswith("central          accuracy 0.")
            and ", 1.000x the exact mean's bytes, " in central
            and powersgd.startswith("powersgd:rank=2  accuracy 0.") and 0 < ratio < 0.1
            and all(os.path.exists(os.path.join(cwd, "study", name))
                    for name in ("study.json", "table.txt", "study.png")))


def papers_compared(out: str, cwd: str) -> bool:
    """SGD, DGC and EF-signSGD in that order; a ring's bytes for SGD, top-k's
    1% and signs' 1/32 (and their indices and scales) for the others."""
    rows = out.splitlines()
    ratios = [float(re.search(r", ([0-9.]+)x SGD's$", row)[1]) for row in rows]
    return ([row[:16].strip() for row in rows] == ["SGD (exact mean)", "DGC 1%", "EF-signSGD"]
            and ratios[0] == 1.0 and 0.02 < ratios[1] < 0.15 and 0.05 < ratios[2] < 0.2
            and float(re.search(r"accuracy ([0-9.]+)", rows[0])[1]) > 0.5
            and os.path.exists(os.path.join(cwd, "papers", "pareto.png")))


def stopped_early(out: str) -> bool:
    stopped = re.search(r"^stopped after (\d+) of 20 epochs; best val_accuracy 0\.9\d\d$", out,
                        re.M)
    epochs = [line for line in out.splitlines() if line.startswith("epoch ")]
    return bool(stopped) and len(epochs) == int(stopped[1]) < 20


def test_every_example_has_a_check():
    assert set(CHECKS) | {"python_api.py"} == {os.path.basename(path) for path in EXAMPLES}


@pytest.mark.slow  # a process each, training: the full suite runs them
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_example_runs_and_prints_what_the_docs_say(name, mnist_dir, tmp_path):
    # towers.data.mnist() reads $XDG_CACHE_HOME/tower-train/mnist: point it here.
    (tmp_path / "cache" / "tower-train").mkdir(parents=True)
    (tmp_path / "cache" / "tower-train" / "mnist").symlink_to(mnist_dir)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=REPO)
    result = subprocess.run([sys.executable, os.path.join(DOCS, "examples", name)],
                            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""  # quiet: no TensorFlow logs, no warnings
    assert CHECKS[name](result.stdout, str(tmp_path)), result.stdout


README = os.path.join(REPO, "README.md")


def test_the_readme_is_short_and_its_links_resolve():
    text = open(README).read()
    assert len(text.splitlines()) <= 160
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 10
    for link in links:
        if not link.startswith(("http://", "https://")):
            assert os.path.exists(os.path.join(REPO, link)), link


def test_the_readme_links_the_code_its_linked_pages_include():
    """On GitHub a page shows an included file as its `--8<--` line: where
    the README sends a reader for code, it links the file as well."""
    text = open(README).read()
    for page, code in (("docs/src/getting-started.md#python-api", "docs/examples/python_api.py"),
                       ("docs/src/guides/reducers.md", "tests/user_reducers.py")):
        assert f"]({page})" in text and f"]({code})" in text, (page, code)
        included = open(os.path.join(REPO, page.split("#")[0])).read()
        assert f'--8<-- "{code}' in included, (page, code)
    assert "On\nGitHub a page shows each included file as a `--8<--` line" in text


def test_the_readme_example_is_the_quickstart():
    text = open(README).read()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert code == open(os.path.join(DOCS, "examples", "quickstart.py")).read()


def test_nothing_points_outside_the_repository():
    for name, text in {**pages(), "README.md": open(README).read()}.items():
        assert "../shared" not in text and "steering" not in text, name


def every_page() -> dict[str, str]:
    return {**pages(), "README.md": open(README).read()}


@pytest.mark.parametrize("check", ["bad_names", "bad_commands", "undated_rows",
                                   "diary_phrases"])
def test_every_page_passes_the_docs_checks(check):
    """Every towers.*/engine.* name resolves (and user pages name public API
    only), every command line parses, every figure row is dated and placed,
    and no page tells how it was made (tests/docs_checks.py)."""
    function = getattr(checks, check)
    found = {page: function(page, text) if check == "bad_names" else function(text)
             for page, text in every_page().items()}
    assert {page: wrong for page, wrong in found.items() if wrong} == {}


def test_the_docs_checks_look_at_enough_to_mean_something():
    texts = every_page().values()
    assert sum(len(checks.python_names(t)) for t in texts) >= 40
    assert sum(len(checks.command_lines(t)) for t in texts) >= 50
    assert sum(len(checks.figure_rows(t)) for t in texts) >= 20


def planted(page: str, old: str, new: str) -> str:
    text = pages()[page]
    assert old in text, old
    return text.replace(old, new, 1)


def test_a_planted_bad_name_fails():
    text = planted("guides/keras.md", "towers.placement.load(path)",
                   "towers.placement.read(path)")
    assert checks.bad_names("guides/keras.md", text) == ["towers.placement.read: no such name"]
    text = planted("guides/reducers.md", "`towers.reducers.check(reducer, devices)`",
                   "`engine.reducers.conformance.check(reducer, devices)`")
    assert checks.bad_names("guides/reducers.md", text) == [
        "engine.reducers.conformance.check: internal; name the public towers.* API"]


def test_a_planted_bad_flag_fails():
    text = planted("getting-started.md", "--epochs 2 --steps-per-epoch 100",
                   "--epoch 2 --steps-per-epoch 100")
    (wrong,) = checks.bad_commands(text)
    assert wrong.startswith("tower-train --devices cpu:2 --epoch 2 ")
    assert "No such option '--epoch'." in wrong and "'--epochs'" in wrong


def test_a_planted_undated_figure_row_fails():
    text = planted("benchmarks.md", "On a 2-core machine without GPUs, as of 2026-12-02",
                   "On a 2-core machine without GPUs")
    assert checks.undated_rows(text) == [
        "| mlp | 2 | 36,239 | 54,832 (1.51x) | ring 54,987 (1.52x) | 84,035 |",
        "| mlp | 4 | 38,005 | 53,939 (1.42x) | bf16 66,364 (1.75x) | 195,474 |",
        "| lenet | 2 | 14,228 | 16,491 (1.16x) | bf16 17,329 (1.22x) | 25,611 |",
        "| lenet | 4 | 17,908 | 22,292 (1.24x) | central 22,292 (1.24x) | 29,106 |"]


def test_a_planted_diary_phrase_fails():
    text = planted("concepts.md", "\n\n", "\n\nThe next cut to measure is the input.\n\n")
    assert checks.diary_phrases(text) == [
        "'next cut' in: The next cut to measure is the input."]


def test_every_included_file_is_named_where_github_shows_the_include_line():
    """GitHub shows `--8<--` lines, not the file they include: the prose
    just before each such block names the file."""
    for page, text in pages().items():
        lines = text.splitlines()
        for k, line in enumerate(lines):
            match = re.match(r'--8<-- "([^":]+)', line)
            if match:
                fence = max(i for i in range(k) if lines[i].startswith("```"))
                assert match[1] in "\n".join(lines[max(0, fence - 4):fence]), (page, line)
