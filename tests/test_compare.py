"""tower-compare and towers.compare: every reducer on the same workload, the
exact-mean run equal to a plain run, bytes as declared, and a killed study
that goes on without redoing what it finished."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import statistics
import subprocess
import time

import pytest
from conftest import BIN, REPO, run_cli

import towers

WORKLOAD = ("--devices", "cpu:2", "--model", "lenet", "--epochs", "3", "--steps-per-epoch", "40",
            "--eval-steps", "10")
REDUCERS = ("--reducer", "central", "--reducer", "powersgd:rank=1", "--reducer", "topk")
FIGURES = ("loss", "accuracy", "eval_loss", "eval_accuracy")


def compare_args(mnist_dir: str, out) -> list[str]:
    return ["--data", mnist_dir, *WORKLOAD, *REDUCERS, "--topology", "2x8-ethernet-100g:16",
            "--topology", "dgx1-v100:8", "--out", str(out)]


def figures(path) -> list[dict]:
    """Each epoch's figures; an epoch trained again after a kill counts once,
    as its last record (the study reads it so)."""
    with open(path) as stream:
        records = {r["epoch"]: {k: r[k] for k in FIGURES} for r in map(json.loads, stream)}
    return [records[epoch] for epoch in sorted(records)]


@pytest.fixture(scope="module")
def study(mnist_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    result = run_cli("tower-compare", *compare_args(mnist_dir, out))
    assert result.returncode == 0, result.stderr
    return out, result


def test_bad_reducers_are_refused_before_the_first_run(mnist_dir, tmp_path):
    with pytest.raises(towers.UsageError) as refused:
        towers.compare(["central", "nosuch", "topk:ratio=7", "powersgd:rank=0"],
                       out=str(tmp_path / "out"), devices=["/cpu:0", "/cpu:1"],
                       data=towers.data.directory(mnist_dir))
    assert str(refused.value) == (
        "reducer 'nosuch' is not one of central, ring, tree, hierarchical, collective, nccl, "
        "topk, powersgd, signsgd, localsgd, auto and not package.module:function; "
        "reducer topk: ratio (7.0) must be in (0, 1]; "
        "reducer powersgd: rank (0) must be at least 1")
    assert not (tmp_path / "out").exists()


def test_a_refused_workload_leaves_nothing_that_refuses_the_next(mnist_dir, tmp_path):
    out = tmp_path / "out"
    data = towers.data.directory(mnist_dir)
    with pytest.raises(towers.UsageError, match="nosuch"):
        towers.compare(["central"], out=str(out), devices=["/cpu:0", "/cpu:1"],
                       model="nosuch", data=data)
    assert not (out / "workload.json").exists()
    with pytest.raises(towers.UsageError, match=r"^eval_steps \(0\): a study compares "):
        towers.compare(["central"], out=str(out), devices=["/cpu:0", "/cpu:1"],
                       eval_steps=0, data=data)
    with pytest.raises(towers.UsageError, match=r"^devices: a study compares reductions "):
        towers.compare(["central", "topk"], out=str(out), devices=["/cpu:0"], data=data)


def test_data_without_a_held_out_split_is_refused_not_charted_at_0(tmp_path):
    with pytest.raises(towers.UsageError) as refused:
        towers.compare(["central", "ring"], out=str(tmp_path / "out"),
                       devices=["/cpu:0", "/cpu:1"], data=towers.data.synthetic())
    assert str(refused.value) == (
        "data: synthetic data has no held-out split, and a study compares held-out "
        "accuracy; give data with one (a val/ folder beside train/, or MNIST)")


class Halving:
    """A reducer object with no repr of its own."""

    def __call__(self, tower_grads, devices, destinations):
        return None


@dataclasses.dataclass
class Scaled:
    """A reducer object whose repr tells its instances apart."""

    factor: float

    def __call__(self, tower_grads, devices, destinations):
        return None


def test_two_reducer_objects_of_one_class_get_their_own_labels():
    from towers.study.study import _check_reducers

    labels = [o.label for o in _check_reducers([Halving(), Halving()])[0]]
    assert labels == ["central", "test_compare:Halving #1", "test_compare:Halving #2"]
    labels = [o.label for o in _check_reducers(["ring", Scaled(1.0), Scaled(2.0)])[0]]
    assert labels == ["ring", "Scaled(factor=1.0)", "Scaled(factor=2.0)"]
    with pytest.raises(towers.UsageError, match="lists 'ring' more than once"):
        _check_reducers(["ring", "ring"])


def test_a_workload_with_a_function_has_the_same_signature_in_every_process():
    from towers.study.study import _signature

    def build(input_shape, num_classes):
        return None

    signature = _signature({"model": build, "devices": "cpu:2"}, 3, None, None)
    assert signature["trainer"]["model"] == (
        "test_compare:test_a_workload_with_a_function_has_the_same_signature_in_every_"
        "process.<locals>.build")
    assert "0x" not in json.dumps(signature)


def test_the_command_line_names_the_flag(tmp_path):
    result = run_cli("tower-compare", "--devices", "cpu:2", "--reducer", "central", "--reducer",
                     "nosuch", "--topology", "dgx1-v100:4", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.startswith("tower-compare: error: --reducer 'nosuch' is not one of ")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_exact_mean_run_is_the_plain_run_bit_for_bit(study, mnist_dir, tmp_path):
    out, _ = study
    plain = run_cli("tower-train", "--data", mnist_dir, *WORKLOAD, "--seed", "0",
                    "--deterministic", "--variables", "replicated",
                    "--metrics", str(tmp_path / "plain.jsonl"))
    assert plain.returncode == 0, plain.stderr
    assert figures(out / "runs" / "central" / "seed0" / "metrics.jsonl") == \
        figures(tmp_path / "plain.jsonl")


@pytest.mark.slow
def test_the_study_writes_its_table_json_and_chart(study):
    out, result = study
    data = json.loads((out / "study.json").read_text())
    assert data["reducers"] == ["central", "powersgd:rank=1", "topk"]
    assert [s["label"] for s in data["scales"]] == ["2x8-ethernet-100g:16", "dgx1-v100:8"]
    rows = {r["reducer"]: r for r in data["summary"]}
    assert rows["central"]["bytes_vs_exact"] == 1.0
    assert rows["powersgd:rank=1"]["bytes_vs_exact"] < 0.1
    assert rows["topk"]["bytes_vs_exact"] < 0.1
    central = rows["central"]
    assert data["target_accuracy"] == round(0.99 * central["final_accuracy"], 4)
    for row in rows.values():
        assert 0.1 < row["final_accuracy"] <= 1
        for scale in ("2x8-ethernet-100g:16", "dgx1-v100:8"):
            p = row["predicted"][scale]
            assert p["step_ms"] > p["reduction_ms"] > 0
    # Time to target is the epoch the mean curve reaches it, times the epoch.
    p = central["predicted"]["dgx1-v100:8"]
    assert p["seconds_to_target"] == pytest.approx(p["epochs_to_target"] * p["epoch_seconds"])
    table = (out / "table.txt").read_text()
    assert table.splitlines()[0].split() == ["reducer", "final", "accuracy", "best",
                                             "bytes/step", "vs", "exact", "MB/worker/ep",
                                             "state", "bytes", "step", "here"]
    # What one worker sends per epoch: the step's bytes over 2 workers, 40 steps.
    for row in rows.values():
        assert row["workers"] == 2
        assert row["bytes_per_worker_per_epoch"] == pytest.approx(
            row["mean_bytes_per_step"] / 2 * 40)
        assert row["final_perplexity"] == pytest.approx(statistics.fmean(
            math.exp(r["epochs"][-1]["eval_loss"]) for r in data["runs"]
            if r["reducer"] == row["reducer"]))
    assert (out / "pareto.png").stat().st_size > 20_000
    # Two logical CPUs ran in turn on one processor: a worker computes half the step.
    first = data["runs"][0]
    assert first["predictions"]["dgx1-v100:8"]["compute_ms"] == pytest.approx(
        1e3 * first["step_seconds"] / 2)
    assert "predicted on 2x8-ethernet-100g:16" in table and table in result.stdout
    assert (out / "study.png").stat().st_size > 20_000
    # Every step's loss; an epoch's loss is their mean.
    for run in data["runs"]:
        assert len(run["step_losses"]) == 3 * 40
        for k, epoch in enumerate(run["epochs"]):
            steps = run["step_losses"][40 * k:40 * (k + 1)]
            assert sum(steps) / 40 == pytest.approx(epoch["loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("reducer", ["powersgd:rank=1", "topk"])
def test_the_bytes_per_step_are_the_reducers_declared_traffic(study, reducer):
    out, _ = study
    [run] = [r for r in json.loads((out / "study.json").read_text())["runs"]
             if r["reducer"] == reducer]
    assert run["declared_bytes"] > 0
    assert run["bytes_per_step"] == pytest.approx(run["declared_bytes"], rel=0.01)
    assert run["state_bytes"] > 0  # residuals (and PowerSGD's factors)


@pytest.mark.slow
def test_a_killed_study_resumes_without_redoing_finished_runs(study, mnist_dir, tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    first = subprocess.Popen([os.path.join(BIN, "tower-compare"), *compare_args(mnist_dir, out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=REPO, env=env)
    finished = out / "runs" / "central" / "seed0" / "run.json"
    unfinished = out / "runs" / "powersgd_rank=1" / "seed0"
    deadline = time.monotonic() + 300
    while not (unfinished / "checkpoints" / "checkpoint").exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    assert finished.exists() and not (unfinished / "run.json").exists()
    kept = finished.stat().st_mtime_ns

    # Started again, with one more machine to predict for.
    again = run_cli("tower-compare", *compare_args(mnist_dir, out), "--topology", "pcie-4gpu:4")
    assert again.returncode == 0, again.stderr
    assert "run 1/3: central, seed 0: finished before, kept" in again.stdout
    assert "run 2/3: powersgd:rank=1, seed 0: resumed from its checkpoint" in again.stdout
    assert "run 3/3: topk, seed 0: training" in again.stdout
    assert finished.stat().st_mtime_ns == kept
    data = json.loads((out / "study.json").read_text())
    assert [s["label"] for s in data["scales"]][-1] == "pcie-4gpu:4"
    assert all("pcie-4gpu:4" in r["predictions"] for r in data["runs"])
    # Every step's loss, those of the epochs before the kill too.
    assert [len(r["step_losses"]) for r in data["runs"]] == [3 * 40] * 3
    # The interrupted study ends as the uninterrupted one did, run for run.
    whole, _ = study
    for name in ("central", "powersgd_rank=1", "topk"):
        assert figures(out / "runs" / name / "seed0" / "metrics.jsonl") == \
            figures(whole / "runs" / name / "seed0" / "metrics.jsonl"), name


def test_the_pareto_front_keeps_what_nothing_beats_on_both():
    from towers.study.report import front

    points = [(10.0, 0.95), (1.0, 0.94), (0.1, 0.80), (5.0, 0.93), (1.0, 0.90)]
    assert front(points) == [2, 1, 0]  # (5, 0.93) and (1, 0.90) are beaten by (1, 0.94)
    perplexities = [(10.0, 3.0), (1.0, 3.1), (2.0, 3.5)]
    assert front(perplexities, higher_is_better=False) == [1, 0]


def test_a_method_trains_with_its_own_arguments_and_label():
    from towers.study.study import Method, _check_reducers

    options, overrides = _check_reducers([
        "ring", Method("topk:ratio=0.01,momentum=0.9", label="DGC 1%",
                       trainer={"optimizer": "sgd"})])
    assert [o.label for o in options] == ["ring", "DGC 1%"]
    assert overrides == {"ring": {}, "DGC 1%": {"optimizer": "sgd"}}
    with pytest.raises(towers.UsageError) as refused:
        Method("topk", label="mine", trainer={"seed": 3, "devices": "cpu:2"})
    assert str(refused.value) == ("reducers 'mine': devices, seed are the study's to set, "
                                  "the same for every method")


def test_the_named_studies_are_the_ones_the_flag_offers():
    from towers.cli.compare import STUDY_NAMES
    from towers.study import papers

    assert STUDY_NAMES == tuple(sorted(papers.STUDIES))
    arguments = papers.STUDIES["papers-lenet"].arguments(gpu=False)
    assert arguments["devices"] == "cpu:16" and arguments["seeds"] == 3
    labels = [m.label for m in arguments["reducers"]]
    assert labels[0] == "SGD (exact mean)" and len(labels) == 12
    assert arguments["topologies"] == ["2x8-ethernet-10g:16", "2x8-infiniband-100g:16"]
    resnet = papers.STUDIES["papers-resnet20"].arguments(gpu=True)
    assert resnet["devices"] == "gpu:16"
    assert resnet["topologies"] == ["2x8-ethernet-10g:16:3.8", "2x8-infiniband-100g:16:3.8"]


def test_neither_reducers_nor_a_study_is_one_line(tmp_path):
    result = run_cli("tower-compare", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr == ("tower-compare: error: give --reducer once per reducer to "
                             "compare, or --study with one of papers-lenet, papers-resnet20, "
                             "papers-transformer\n")
