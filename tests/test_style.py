"""The code's own rules, checked as tests so that CI holds them: the layers
of import-linter's contracts (pyproject.toml) and ruff's lint."""

import os
import shutil
import subprocess

from conftest import BIN, REPO


def lint_imports(root: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(BIN, "lint-imports")], cwd=root, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": root})


def test_the_layers_contract_holds():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout


def test_the_layers_contract_fails_on_an_upward_import(tmp_path):
    """The step (engine.core) importing the run around it (engine.run) breaks it."""
    for folder in ("engine", "towers"):
        shutil.copytree(os.path.join(REPO, folder), tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "pyproject.toml"), tmp_path)
    step = tmp_path / "engine" / "core" / "step.py"
    step.write_text(step.read_text() + "\nfrom engine.run import describe  # noqa: E402\n")
    result = lint_imports(str(tmp_path))
    assert result.returncode == 1
    assert "Layers: the API over the run over the step over its parts over the devices BROKEN" \
        in result.stdout
    assert "engine.core.step -> engine.run.describe" in result.stdout


def test_ruff_finds_nothing():
    result = subprocess.run([os.path.join(BIN, "ruff"), "check", "."], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout
