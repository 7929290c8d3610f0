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


def bench_module():
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import bench

    return bench


def docs_runs(name):
    return json.load(open(os.path.join(REPO, "docs", "src", "benchmarks", name)))["runs"]


@pytest.mark.parametrize("name, reference, title, axis", [
    # Keras' fit(jit_compile=True) on one H100: images and sequences mix, so
    # the bars are ratios and the axis says to what.
    ("gpu-h100-2026-12-05.json", "keras-jit",
     "tower-train against Keras fit(jit_compile=True) (one H100)",
     "samples/s relative to Keras fit(jit_compile=True) (1.0)"),
    # The Transformer alone counts sequences.
    ("gpu-h100-2026-12-07-transformer.json", "keras-jit",
     "tower-train against Keras fit(jit_compile=True) (one H100)", "sequences/s"),
    # The H200's table is against the recipe, whatever flag made it.
    ("gpu-h200-mlp-lenet.json", "mirrored",
     "tower-train against the DALI + MirroredStrategy recipe (one H200)", "images/s"),
])
def test_the_chart_says_what_it_shows(name, reference, title, axis, tmp_path):
    bench = bench_module()
    runs = docs_runs(name)
    assert bench.reference_of(runs, dali_sweep=False) == reference
    assert bench.chart_title(runs, reference, dali_sweep=False) == title
    assert bench.chart(runs, str(tmp_path / "chart.png"), title, reference) == axis


def test_a_gpu_run_without_its_card_named_is_still_on_a_gpu():
    bench = bench_module()
    runs = [{**r, "device_name": None} for r in docs_runs("gpu-h100-2026-12-05.json")]
    assert bench.chart_title(runs, "keras-jit", False).endswith("(one GPU)")
    assert [bench.unit_of(r) for r in runs] == ["images/s", "images/s", "sequences/s",
                                                "sequences/s"]
