"""The cost model: schedules read off reducers, their predicted times, topology
files, the fit of this machine's costs, and `auto`'s choices."""

import io
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_cli

import towers
from engine import reducers
from engine.cost import check, model, schedule
from engine.cost.schedule import Schedule, Task
from engine.cost.topology import Device, Host, Link, Topology, TopologyError, loads
from engine.reducers.auto import size_text
from engine.topology.devices import DeviceRequest, resolve
from towers import cost

DEVICES = [f"/cpu:{k}" for k in range(4)]
MB = 1 << 20


def placement_of(devices, reduce_device="/cpu:0"):
    return resolve(DeviceRequest(tuple(devices), reduce_device=reduce_device),
                   [f"/cpu:{k}" for k in range(8)])


def hand_topology(cores=1.0, alpha=1e-5, beta=0.0, gamma=3e-10, call=1e-4,
                  per_device=1e-5, devices=DEVICES, shared=(), op=0.0):
    """CPU devices of one host; every link alike."""
    return Topology(
        "hand",
        (Host("h", cores, call, per_device,
              tuple(Device(d, gamma, op) for d in devices)),),
        {(a, b): Link(a, b, alpha, beta, tuple(shared))
         for a in devices for b in devices if a != b},
    )


@pytest.mark.parametrize("name", ["central", "ring", "tree"])
def test_a_schedule_sends_the_bytes_of_the_reducers_traffic_figure(name):
    devices = DEVICES[:3]
    reducer = reducers.build(reducers.ReducerOptions(name=name), placement_of(devices))
    elements = 12 * 1024
    traced = schedule.trace_reduction(reducer, devices, devices, [elements])
    assert traced.sent_per_device() == reducer.traffic(devices, devices, 4 * elements)
    # Each hop waits for the tensor it carries: no transfer starts from nothing.
    assert all(t.after for t in traced.transfers)


def test_a_schedule_counts_what_each_op_reads_and_writes():
    @tf.function(autograph=False)
    def add(x, y):
        with tf.device("/cpu:1"):
            return tf.reshape(x + y, [2, 8])

    graph = add.get_concrete_function(tf.TensorSpec([16]), tf.TensorSpec([16])).graph
    traced = schedule.from_graph(graph)
    by_op = {t.op: t for t in traced.tasks}
    assert (by_op["AddV2"].bytes, by_op["AddV2"].writes) == (3 * 64, 64)
    assert by_op["Reshape"].bytes == 0  # a view of its input's buffer
    assert by_op["Reshape"].after == (traced.tasks.index(by_op["AddV2"]),)


def _chain(*tasks):
    return Schedule(tuple(tasks))


def test_concurrent_transfers_on_one_link_share_it_and_ops_share_the_cores():
    t = hand_topology(cores=2.0, alpha=0.0, beta=1e-9, gamma=0.0, call=0.0, per_device=0.0)
    one = Task("a", "transfer", "/cpu:0", "/cpu:1", 1000)
    two = Task("b", "transfer", "/cpu:0", "/cpu:1", 1000)
    other = Task("c", "transfer", "/cpu:2", "/cpu:1", 1000)
    # Alone: 1 us. Two on one link: each at half speed, 2 us. On two links: 1 us.
    assert model.predict(_chain(one), t).seconds == pytest.approx(1e-6)
    assert model.predict(_chain(one, two), t).seconds == pytest.approx(2e-6)
    assert model.predict(_chain(one, other), t).seconds == pytest.approx(1e-6)
    # Links that name one shared resource divide it too.
    nic = hand_topology(cores=2.0, alpha=0.0, beta=1e-9, gamma=0.0, call=0.0,
                        per_device=0.0, shared=("nic",))
    assert model.predict(_chain(one, other), nic).seconds == pytest.approx(2e-6)

    ops = hand_topology(cores=2.0, gamma=1e-9, call=0.0, per_device=0.0)
    adds = [Task(f"add{k}", "AddV2", f"/cpu:{k}", f"/cpu:{k}", 3000, (), 1000) for k in range(4)]
    # An add of 1000 bytes alone: gamma x 1000 = 1 us; four on two cores: 2 us.
    assert model.predict(_chain(adds[0]), ops).seconds == pytest.approx(1e-6)
    assert model.predict(_chain(*adds), ops).seconds == pytest.approx(2e-6)


def test_a_prediction_is_the_fixed_cost_plus_the_critical_path():
    t = hand_topology(cores=4.0, alpha=2e-6, beta=1e-9, gamma=1e-9, call=5e-6, per_device=1e-6)
    tasks = (
        Task("x", "AddV2", "/cpu:0", "/cpu:0", 3000, (), 1000),        # 1 us
        Task("x->1", "transfer", "/cpu:0", "/cpu:1", 1000, (0,)),       # 2 + 1 us
        Task("y", "AddV2", "/cpu:1", "/cpu:1", 3000, (1,), 1000),      # 1 us
        Task("side", "AddV2", "/cpu:2", "/cpu:2", 300, (), 100),      # 0.1 us, off the path
    )
    predicted = model.predict(Schedule(tasks), t)
    assert predicted.fixed_seconds == pytest.approx(5e-6 + 3e-6)  # call, three devices
    assert predicted.seconds == pytest.approx(8e-6 + 5e-6)
    assert predicted.critical_path == ("x", "x->1", "y")


@pytest.mark.parametrize("name", cost.builtin_topologies())
def test_every_builtin_topology_links_its_devices_and_names_its_sources(name):
    t = cost.load(name)
    names = list(t.devices)
    assert len(t.sources) >= 2
    assert {(a, b) for a in names for b in names if a != b} <= set(t.links)
    assert all(d.gamma > 0 and link.beta > 0 for d in t.devices.values()
               for link in t.links.values())


def test_on_a_dgx1_ring_overtakes_central_for_large_tensors():
    dgx1 = cost.load("dgx1-v100")
    rows = cost.compare(dgx1, ["central", "ring"], [64 << 10, 16 * MB])
    seconds = {(r.reducer, r.tensor_bytes): r.seconds for r in rows}
    assert seconds[("central", 64 << 10)] < seconds[("ring", 64 << 10)]
    assert seconds[("ring", 16 * MB)] < seconds[("central", 16 * MB)]
    built = cost.reducers_for(["central", "ring"], cost.towers_of(dgx1), "/cpu:0")
    towers_ = cost.towers_of(dgx1)
    size = cost.crossover(built["central"], built["ring"], dgx1, towers_, towers_,
                          64 << 10, 16 * MB)
    assert 64 << 10 < size < 16 * MB
    # Either side of the crossover, the order is the one it says.
    before = cost.compare(dgx1, ["central", "ring"], [int(size * 0.8) // 4 * 4])
    assert before[0].seconds < before[1].seconds
    # busbw is algbw x 2(n-1)/n for an all-reduce.
    assert rows[0].busbw == pytest.approx(rows[0].algbw * 2 * 7 / 8)


def test_the_model_cannot_see_inside_collective_and_says_so():
    with pytest.raises(reducers.ReducerError, match="'collective' cannot be predicted"):
        cost.compare(cost.load("pcie-4gpu"), ["collective"])


GOOD = {
    "name": "two",
    "hosts": [{"name": "h", "cores": 2, "devices": [
        {"name": "/cpu:0", "gamma": 1e-10, "op_seconds": 1e-6},
        {"name": "/cpu:1", "gamma": 1e-10, "op_seconds": 1e-6}]}],
    "links": [{"src": ["/cpu:0", "/cpu:1"], "dst": ["/cpu:0", "/cpu:1"],
               "alpha": 1e-5, "beta": 0}],
}


def _broken(change):
    data = json.loads(json.dumps(GOOD))
    change(data)
    return json.dumps(data)


@pytest.mark.parametrize("text, message", [
    ("{", "t.json: not JSON (Expecting property name enclosed in double quotes at line 1)"),
    (_broken(lambda d: d.pop("links")), "t.json: missing field 'links'"),
    (_broken(lambda d: d["hosts"][0]["devices"][1].pop("gamma")),
     "t.json: hosts[0].devices[1]: missing field 'gamma'"),
    (_broken(lambda d: d["hosts"][0].update(cores="two")),
     "t.json: hosts[0].cores: 'two' is not a number"),
    (_broken(lambda d: d["links"][0].update(beta=-1)),
     "t.json: links[0].beta: -1 must be at least 0.0"),
    (_broken(lambda d: d["links"][0].update(dst="/gpu:9")),
     "t.json: links[0]: /gpu:9 is no device of the hosts"),
    (_broken(lambda d: d["links"][0].update(dst="gpu nine")),
     ("t.json: links[0].dst: 'gpu nine' is not a device name like /gpu:0 or "
     "/job:worker/task:1/cpu:0")),
    (_broken(lambda d: d["hosts"][0]["devices"][0].update(gama=1)),
     ("t.json: hosts[0].devices[0]: unknown field 'gama'; a device has comment, gamma, "
     "gamma_read, name, op_seconds")),
])
def test_a_malformed_topology_is_one_line_naming_the_field(text, message):
    with pytest.raises(TopologyError) as caught:
        loads(text, "t.json")
    assert str(caught.value) == message


def test_a_malformed_topology_file_stops_the_bench_before_tensorflow(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(_broken(lambda d: d["hosts"][0]["devices"][0].pop("op_seconds")))
    result = run_cli("tower-reduce-bench", "--topology", str(path), "--predict")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "tower-reduce-bench: error: --topology bad.json: hosts[0].devices[0]: missing "
        "field 'op_seconds'")


def test_the_bench_predicts_a_topology_with_a_users_reducer_and_the_crossovers(tmp_path):
    # --predict configures no device: it runs in this process as on the command line.
    from click.testing import CliRunner

    from towers.cli.reduce_bench import reduce_bench

    rows_path = tmp_path / "rows.json"
    result = CliRunner().invoke(reduce_bench, [
        "--topology", "pcie-4gpu", "--predict", "--sizes", "64K,16M", "--reducers",
        "central,ring", "--reducer", "tests.user_reducers:gather_on_first", "--json",
        str(rows_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == ("predicted on topology 'pcie-4gpu': 4 towers (/gpu:0, /gpu:1, "
                        "/gpu:2, /gpu:3), reduce device /cpu:0, replicated variables")
    rows = json.loads(rows_path.read_text())
    assert [(r["reducer"], r["tensor_bytes"]) for r in rows] == [
        ("central", 65536), ("central", 16777216), ("ring", 65536), ("ring", 16777216),
        ("tests.user_reducers:gather_on_first", 65536),
        ("tests.user_reducers:gather_on_first", 16777216)]
    fastest = {r["tensor_bytes"]: min((x for x in rows if x["tensor_bytes"] ==
                                       r["tensor_bytes"]), key=lambda x: x["seconds"])["reducer"]
               for r in rows}
    assert f"fastest: 64 KB {fastest[65536]}, 16 MB {fastest[16777216]}" in lines
    assert any(line.startswith("crossover: ring is faster than central from ") for line in lines)


def test_a_fit_of_two_devices_round_trips_through_its_file():
    fitted = cost.fit(["/cpu:0", "/cpu:1"], cost.FitOptions(sizes=(1024, 4 * MB),
                                                            repeats=3, warmup=1))
    t = fitted.topology
    assert set(t.devices) == {"/cpu:0", "/cpu:1"}
    assert set(t.links) == {("/cpu:0", "/cpu:1"), ("/cpu:1", "/cpu:0")}
    # Logical CPU devices are one processor: one figure for both, and a copy
    # between them uses the host's cores.
    assert t.devices["/cpu:0"].gamma == t.devices["/cpu:1"].gamma
    assert t.devices["/cpu:0"].gamma_read == t.devices["/cpu:1"].gamma_read
    assert t.links[("/cpu:0", "/cpu:1")].shared == ("host:localhost",)
    assert 1.0 <= t.hosts[0].cores <= (os.cpu_count() or 1)
    assert t.devices["/cpu:0"].gamma > 0
    assert loads(cost.dump(t), "again") == t
    assert set(fitted.errors) >= {"call localhost", "add /cpu:0", "link /cpu:0->/cpu:1"}


def test_order_agreement_counts_only_pairs_measured_apart():
    rows = [
        {"reducer": "a", "towers": 2, "tensor_bytes": 1, "best_seconds": 1.0,
         "predicted_seconds": 1.0},
        {"reducer": "b", "towers": 2, "tensor_bytes": 1, "best_seconds": 2.0,
         "predicted_seconds": 3.0},
        {"reducer": "c", "towers": 2, "tensor_bytes": 1, "best_seconds": 1.1,
         "predicted_seconds": 0.5},
    ]
    # a-b and c-b differ by more than 20% and are ordered as measured; a-c do not count.
    assert check.order_agreement(rows) == (2, 2, 0)
    assert check.relative_errors(rows) == pytest.approx([0.0, 0.5, -0.5454545])
    rows[1]["predicted_seconds"] = 1.01  # a-b: the model ties them
    assert check.order_agreement(rows) == (1, 1, 1)


def auto_topology(devices):
    """Central's few ops win while op times rule (one core); ring's smaller
    hops win once bytes do (1 GB/s links)."""
    return hand_topology(cores=1.0, alpha=1e-5, beta=1e-9, gamma=1e-12, devices=devices,
                         op=2e-5)


def test_auto_chooses_by_size_and_returns_the_mean():
    devices = DEVICES[:4]
    auto = reducers.build(reducers.ReducerOptions(name="auto", topology=auto_topology(devices)),
                          placement_of(devices))
    context = reducers.ReducerContext(shapes=((10,), (4 * MB,)),
                                      dtypes=(tf.float32, tf.float32),
                                      devices=tuple(devices), destinations=tuple(devices))
    reducers.build_state(auto, context)
    large = auto.predictions(4 * MB, tf.float32, devices, devices)
    # Tree and ring halve central's bytes per link; on four alike links tree's
    # two steps each way beat ring's three.
    assert large["tree"] < large["ring"] < large["central"]
    assert auto.plan == ("central", "tree")
    assert auto.describe() == "central for 40 B, tree for 16 MB (predicted on topology 'hand')"
    grads = [[tf.fill([10], float(k)), tf.fill([4 * MB], float(k))] for k in range(4)]
    placed = []
    for device, tower in zip(devices, grads):
        with tf.device(device):
            placed.append([tf.identity(g) for g in tower])
    out = auto(placed, devices, devices)
    for result in out:
        np.testing.assert_allclose(result[0].numpy(), 1.5)
        np.testing.assert_allclose(result[1].numpy()[:3], 1.5)
    # The step's bytes: central's for the small one, tree's for the large one.
    assert auto.step_bytes() == 2 * 3 * 40 + 2 * 3 * 4 * MB * 4


def test_size_text():
    assert [size_text(n) for n in (40, 1024, 1536, 16 * MB, 5 << 30)] == [
        "40 B", "1 KB", "1.5 KB", "16 MB", "5 GB"]


def test_auto_trains_mnist_as_central_does_and_says_what_it_chose(tmp_path):
    results, headers = {}, {}
    for reducer in ("central", "auto"):
        stream = io.StringIO()
        trainer = towers.Trainer(
            ["/cpu:0", "/cpu:1"], reducer=reducer, seed=1, stream=stream,
            variables="replicated",
            topology=auto_topology(["/cpu:0", "/cpu:1"]) if reducer == "auto" else None)
        (record,) = trainer.fit(epochs=1, steps_per_epoch=150,
                                placement_log=str(tmp_path / f"{reducer}.jsonl"))
        results[reducer], headers[reducer] = record, stream.getvalue()
    assert abs(results["auto"]["eval_accuracy"] - results["central"]["eval_accuracy"]) < 0.02
    assert results["auto"]["eval_accuracy"] > 0.88
    assert ("  auto     central for 40 B to 5 KB, ring for 392 KB (predicted on topology "
            "'hand')") in headers["auto"].splitlines()
    with open(tmp_path / "auto.jsonl") as stream:
        run = json.loads(stream.readline())
    assert run["reducer_choices"] == [[40, 5120, "central"], [401408, 401408, "ring"]]


def test_a_topology_is_only_for_auto():
    with pytest.raises(towers.UsageError, match=r"^topology is for reducer='auto', which "
                       r"chooses by it; reducer='ring' "
                       r"does not use one$"):
        towers.Trainer(["/cpu:0"], reducer="ring", topology="dgx1-v100")


@pytest.mark.slow
def test_the_measured_bench_moves_each_reducers_ideal_bytes_and_auto_its_choices(tmp_path):
    # Measured tables only come from the CLI: it configures the devices.
    rows_path = tmp_path / "rows.json"
    result = run_cli("tower-reduce-bench", "--devices", "cpu:4", "--sizes", "64K,4M",
                     "--reducers", "central,ring,auto", "--repeats", "2", "--warmup", "1",
                     "--json", str(rows_path))
    assert result.returncode == 0, result.stderr
    rows = {(r["reducer"], r["tensor_bytes"]): r for r in json.loads(rows_path.read_text())}
    for size in (65536, 4 * MB):
        # Replicated variables: central's three remote towers send and get
        # back; a ring all-reduce moves 2(N-1) x S however it is routed.
        assert rows[("central", size)]["ideal_bytes"] == 2 * 3 * size
        assert rows[("ring", size)]["ideal_bytes"] == 2 * 3 * size
        for name in ("central", "ring"):
            row = rows[(name, size)]
            assert row["bytes_moved"] == row["ideal_bytes"], row
            assert row["algbw"] == pytest.approx(size / row["seconds"])
            assert row["busbw"] == pytest.approx(row["algbw"] * 2 * 3 / 4)
        auto = rows[("auto", size)]
        # Any of auto's candidates moves 6 x S here: the check is that auto
        # has its choice's figure at all (it had none).
        assert auto["chose"] in ("central", "ring", "tree", "hierarchical")
        assert auto["bytes_moved"] == auto["ideal_bytes"] == 2 * 3 * size, auto
    assert "moved/ideal" in result.stdout
