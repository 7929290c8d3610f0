"""scripts/bench.py, the figures the docs quote: a small run of the recipe
and the engine ends with both measured, the table, the JSON and the chart."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow
def test_a_small_bench_measures_the_recipe_and_the_engine(tmp_path):
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "bench.py"), "--models", "mlp",
         "--towers", "2", "--kinds", "mirrored,engine-reduce-device-central", "--steps", "5",
         "--warmup", "2", "--repeats", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "failed" not in result.stdout, result.stdout
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert [(r["kind"], r["n"]) for r in runs] == [
        ("mirrored", 2), ("engine-reduce-device-central", 2)]
    assert all(r["images_per_sec"] > 100 for r in runs)
    assert (tmp_path / "bench.png").stat().st_size > 10_000
