"""The placement log: runtime devices, bytes moved, strays, diff and picture."""

import json
import math
import xml.etree.ElementTree as ElementTree

import keras
import pytest
import tensorflow as tf
from conftest import run_cli

from engine.core.losses import sparse_cross_entropy
from engine.core.step import TowerStep
from engine.core.variables import ReduceDeviceVariables, ReplicatedVariables
from engine.placement import log as placement
from engine.placement import render as placement_render
from engine.placement import report as placement_report
from engine.reducers.central import Central

# The real logs below are made once, on one worker.
pytestmark = pytest.mark.xdist_group("placement_logs")


def train_with_log(mnist_dir, tmp_path, devices, *extra, name="log.jsonl"):
    log = tmp_path / name
    result = run_cli(
        "tower-train", "--devices", devices, "--data", mnist_dir, "--epochs", "1",
        "--steps-per-epoch", "3", "--eval-steps", "2", "--placement-log", str(log), *extra,
    )
    return result, log


@pytest.fixture(scope="module")
def logs(mnist_dir, tmp_path_factory):
    """Real logs of two configurations: 2 and 4 CPU towers."""
    tmp = tmp_path_factory.mktemp("placement")
    out = {"tmp": tmp}
    for n in (2, 4):
        result, log = train_with_log(mnist_dir, tmp, f"cpu:{n}", "--logdir", str(tmp / f"tb{n}"),
                                     name=f"cpu{n}.jsonl")
        assert result.returncode == 0, result.stderr
        out[n] = (result, placement_report.load(str(log)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_towers_run_on_their_devices_and_the_update_on_the_reduce_device(logs, n):
    _, entries = logs[n]
    train_ops = placement_report.ops(entries, "train")
    for k in range(n):
        forward = {o["assigned"] for o in train_ops
                   if o["tower"] == k and o["name"].startswith("tower_")
                   and not o["op"].endswith("VariableOp")}
        backward = {o["assigned"] for o in train_ops
                    if o["tower"] == k and o["name"].startswith("gradient_tape/")}
        assert forward == backward == {f"/cpu:{k}"}
        fetch = {o["assigned"] for o in train_ops if o["input_tower"] == k}
        assert fetch == {f"/cpu:{k}"}
    update = {o["assigned"] for o in train_ops if o["tower"] == "reduce"}
    assert update == {"/cpu:0"}
    # Keras' Adam updates with plain ops and assignments to the variables.
    assert any(o["op"] == "AssignSubVariableOp" for o in train_ops if o["tower"] == "reduce")
    assert placement_report.strays(entries) == []


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_transfer_matrix_matches_the_parameter_count(logs, n):
    _, entries = logs[n]
    info = placement_report.run_info(entries)
    assert info["parameters"] == 101_770  # 784*128 + 128 + 128*10 + 10
    assert info["parameter_bytes"] == 4 * 101_770
    params = info["parameter_bytes"]
    train = placement_report.matrix(entries, "train")
    # Each tower off /cpu:0 gets the variables and sends its gradients back;
    # the rest is a few scalars (loss, correct count): within 1%.
    assert set(train) == {(s, d) for k in range(1, n)
                          for s, d in (("/cpu:0", f"/cpu:{k}"), (f"/cpu:{k}", "/cpu:0"))}
    for pair, size in train.items():
        assert params <= size <= 1.01 * params, (pair, size)
    total = sum(train.values())
    assert total == pytest.approx(placement_report.expected_bytes(info, "train"), rel=0.01)
    evaluation = placement_report.matrix(entries, "eval")
    assert sum(evaluation.values()) == pytest.approx((n - 1) * params, rel=0.01)
    assert all(t["bytes"] is not None for t in entries if t["kind"] == "transfer")


def test_summary_is_printed_at_the_end_of_the_run(logs):
    result, _ = logs[2]
    out = result.stdout
    assert "placement of the train step" in out and "placement of the eval step" in out
    assert "    /cpu:1     407,1" in out  # gradients, row from /cpu:1
    assert ("bytes per step (100.0%); the central reduction, reduce-device variables should "
            "move 814,160") in out
    assert out.count("stray ops: none") == 2


def test_shapes_of_sent_tensors_are_resolved(logs):
    _, entries = logs[2]
    gradients = [t for t in placement_report.transfers(entries, "train")
                 if t["src"] == "/cpu:1" and t["tensor"].startswith("gradient_tape/")]
    assert sorted(tuple(t["shape"]) for t in gradients) == [(10,), (128,), (128, 10), (784, 128)]
    assert sum(t["bytes"] for t in gradients) == 407_080


@pytest.mark.slow
def test_a_tower_op_outside_its_device_is_stray(mnist_dir, tmp_path):
    result, log = train_with_log(mnist_dir, tmp_path, "cpu:2", "--model",
                                 "tests.user_models:misplaced")
    assert result.returncode == 0, result.stderr
    strays = placement_report.strays(placement_report.load(str(log)))
    assert {(s["tower"], s["op"], s["assigned"]) for s in strays} == {(1, "Square", "/cpu:0")}
    assert all("on_host" in s["name"] for s in strays)
    assert "tower 1 op ran on /cpu:0, not on /cpu:1" in result.stdout


@pytest.mark.slow
def test_strict_placement_stops_on_the_first_step_naming_the_op(mnist_dir, tmp_path):
    result, log = train_with_log(mnist_dir, tmp_path, "cpu:2", "--model",
                                 "tests.user_models:misplaced", "--strict-placement")
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        "tower-train: error: --strict-placement: 1 stray op(s) in the train step: tower_1/")
    assert "on_host" in line and "(Square): tower 1 op ran on /cpu:0, not on /cpu:1" in line
    assert "Epoch 1/1" in result.stdout and "1/3" not in result.stdout
    assert placement_report.strays(placement_report.load(str(log)))  # the log is kept


class GradientOffTower(TowerStep):
    """The classic trap: forward on the tower, tape.gradient outside its scope.

    Outside it, TensorFlow picks the device: GPU 0 on a GPU host, the CPU
    elsewhere. The trap is set under the reduce device here, so that the test
    knows where the backward pass lands on any host.
    """

    def gradients(self, batches):
        tower_grads, losses = [], []
        for tower, (images, labels) in zip(self.placement.towers, batches):
            with tf.GradientTape() as tape:
                with tf.device(tower.device), tf.name_scope(f"tower_{tower.index}"):
                    probs = self.model(images, training=True)
                    loss = tf.reduce_mean(sparse_cross_entropy(tf.reshape(labels, [-1]), probs))
            with tf.device(self.placement.reduce_device):
                tower_grads.append(tape.gradient(loss, self.model.trainable_variables))
            losses.append(loss)
        return self.reducer(tower_grads, self.placement.devices, ["/cpu:0"])


def test_gradient_computed_outside_the_tower_scope_is_flagged():
    from engine.topology.devices import DeviceRequest, resolve

    placement_ = resolve(DeviceRequest(("/cpu:1", "/cpu:2"), reduce_device="/cpu:0"),
                         [f"/cpu:{k}" for k in range(4)])
    variables = ReduceDeviceVariables(
        lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")]),
        lambda: keras.optimizers.SGD(0.1),
        placement_,
    )
    step = GradientOffTower(variables=variables, placement=placement_,
                            reducer=Central("/cpu:0"))
    batches = []
    for tower in placement_.towers:
        with tf.device(tower.device):
            batches.append((tf.ones([8, 4]), tf.zeros([8, 1], tf.int32)))
    function = tf.function(step.gradients)
    _, metadata = placement.collect(function, batches)
    entries = placement.records(metadata, "train", placement_.devices,
                                function.get_concrete_function(batches).graph)
    strays = [e for e in entries if e["kind"] == "op" and e["stray"]]
    assert {e["tower"] for e in strays} == {0, 1}
    assert all(e["name"].startswith("gradient_tape/tower_") for e in strays)
    assert {e["assigned"] for e in strays} == {"/cpu:0"}
    assert "BiasAddGrad" in {e["op"] for e in strays}  # a backward-only op


def test_diff_of_two_configurations(logs, tmp_path):
    paths = []
    for n in (2, 4):
        path = tmp_path / f"{n}.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in logs[n][1]))
        paths.append(str(path))
    result = run_cli("tower-placement", "diff", *paths)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ops that changed device (0):" in out
    only_b = [l for l in out.splitlines() if l.strip().startswith(("tower_2/", "tower_3/"))]
    assert only_b and all(l.rstrip().endswith(("(/cpu:2)", "(/cpu:3)", "(/cpu:0)")) for l in only_b)
    four = placement_report.matrix(logs[4][1], "train")
    for pair in (("/cpu:0", "/cpu:2"), ("/cpu:3", "/cpu:0")):
        size = four[pair]
        assert 407_080 <= size <= 407_200  # the parameters, and a few scalars
        assert f"    {pair[0]} -> {pair[1]}: 0 -> {size:,} (+{size:,})" in out
    two_total = sum(placement_report.matrix(logs[2][1], "train").values())
    four_total = sum(four.values())
    assert (f"  total: {two_total:,} -> {four_total:,} (+{four_total - two_total:,}) "
            "bytes per step") in out


def test_diff_sees_an_op_change_device(logs, tmp_path):
    entries = [dict(e) for e in logs[2][1]]
    moved = next(e for e in entries if e["kind"] == "op" and e["step"] == "train"
                 and e["name"].startswith("tower_1/") and e["assigned"] == "/cpu:1")
    moved["assigned"] = "/cpu:0"
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(e) + "\n" for e in logs[2][1]))
    b.write_text("".join(json.dumps(e) + "\n" for e in entries))
    out = run_cli("tower-placement", "diff", str(a), str(b)).stdout
    assert f"ops that changed device (1):\n    {moved['name']}: /cpu:1 -> /cpu:0" in out


@pytest.mark.parametrize("n", [2, 4])
def test_rendered_picture_has_every_device_and_edge(logs, tmp_path, n):
    entries = logs[n][1]
    svg = tmp_path / "p.svg"
    placement_render.render(entries, str(svg))
    root = ElementTree.parse(svg).getroot()
    ids = {el.get("id") for el in root.iter() if el.get("id")}
    texts = " ".join("".join(el.itertext()) for el in root.iter("{http://www.w3.org/2000/svg}text"))
    devices = placement_report.devices(e for e in entries if e.get("step") == "train")
    assert devices == [f"/cpu:{k}" for k in range(n)]
    for device in devices:
        assert placement_render.element_id("device", device) in ids
        assert device in texts
    edges = placement_report.matrix(entries, "train")
    assert len(edges) == 2 * (n - 1)
    for (src, dst), size in edges.items():
        assert placement_render.element_id("edge", src, dst) in ids
        assert f"{size:,} B/step" in texts
    drawn = {i for i in ids if i.startswith("edge_")}
    assert len(drawn) == len(edges)


def test_render_command_writes_png_and_dot(logs, tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in logs[2][1]))
    png, dot = tmp_path / "p.png", tmp_path / "p.dot"
    assert run_cli("tower-placement", "render", str(path), "-o", str(png)).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rendered = run_cli("tower-placement", "render", str(path), "-o", str(dot), "--step", "eval")
    assert rendered.returncode == 0
    text = dot.read_text()
    sent = placement_report.matrix(logs[2][1], "eval")
    assert set(sent) == {("/cpu:0", "/cpu:1"), ("/cpu:1", "/cpu:0")}
    assert sent[("/cpu:1", "/cpu:0")] == 12  # loss sum, correct and count: 3 floats
    for (src, dst), size in sent.items():
        assert f'"{src}" -> "{dst}" [label="{size:,} B/step"];' in text
    bad = run_cli("tower-placement", "render", str(path), "-o", str(tmp_path / "p.gif"))
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        f"tower-placement: error: -o '{tmp_path / 'p.gif'}': the picture is written as "
        ".svg, .png, .dot; end the name with one of them"
    )


def test_summary_command_refuses_a_file_that_is_not_a_log(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"epoch": 1}\n')
    result = run_cli("tower-placement", "summary", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"tower-placement: error: '{path}' is not a placement log: no 'run' record; "
        "write one with tower-train --placement-log FILE"
    )


@pytest.mark.slow
def test_log_device_placement_passes_through_to_tensorflow():
    args = ["--devices", "cpu:2", "--data-format", "synthetic", "--epochs", "1",
            "--steps-per-epoch", "2"]
    plain = run_cli("tower-train", *args)
    printed = run_cli("tower-train", *args, "--log-device-placement")
    assert plain.returncode == printed.returncode == 0
    placer = "(DALIDataset): /job:localhost/replica:0/task:0/device:CPU:1"
    assert placer not in plain.stderr
    assert placer in printed.stderr


def tiny_step(towers, reduce_device, optimizer, reducer="central"):
    """A softmax regression step on `towers`, each fed ones from its own
    device, on CPU devices 0-3: (step, iterators, placement). A reducer other
    than central runs with replicated variables."""
    from engine import reducers
    from engine.topology.devices import DeviceRequest, resolve

    placement_ = resolve(DeviceRequest(towers, reduce_device=reduce_device),
                         [f"/cpu:{k}" for k in range(4)])
    mode = ReduceDeviceVariables if reducer == "central" else ReplicatedVariables
    variables = mode(
        lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")]),
        optimizer, placement_)
    step = TowerStep(variables=variables, placement=placement_,
                     reducer=reducers.build(reducers.ReducerOptions(name=reducer), placement_))
    iterators = []
    for tower in placement_.towers:
        with tf.device(tower.device):
            data = tf.data.Dataset.from_tensors((tf.ones([8, 4]), tf.zeros([8, 1], tf.int32)))
            iterators.append(iter(data.repeat()))
    return step, iterators, placement_


def test_gradients_sent_into_the_update_have_their_size():
    """One tower off the reduce device: its mean is the gradient itself, so the
    gradients cross devices inside the non-finite skip's cond, behind the
    Switch that lowering the cond adds (seen on a GPU tower): their size is
    still known, and the step moves the parameters both ways."""
    step, iterators, placement_ = tiny_step(("/cpu:1",), "/cpu:0",
                                            lambda: keras.optimizers.SGD(0.1))
    _, metadata = placement.collect(step.train, iterators)
    entries = placement.records(metadata, "train", placement_.devices,
                                step.train.get_concrete_function(iterators).graph)
    transfers = [e for e in entries if e["kind"] == "transfer" and not e["control"]]
    assert [t for t in transfers if t["bytes"] is None] == []
    sent = {}
    for t in transfers:
        sent[t["src"], t["dst"]] = sent.get((t["src"], t["dst"]), 0) + t["bytes"]
    parameters = 4 * (4 * 3 + 3)
    assert parameters <= sent["/cpu:0", "/cpu:1"] <= parameters + 64
    assert parameters <= sent["/cpu:1", "/cpu:0"] <= parameters + 64


def test_nothing_runs_on_the_default_device_unless_asked():
    """TensorFlow runs a function's ops that have no device (its outputs, the
    plumbing of partitioning) on the device of the call, by default the first
    one: /gpu:0 on a GPU host, where CPU towers then sent tensors to the GPU
    (seen on an H200). Here the first device is /cpu:0, and neither tower nor
    the reduce device is on it: no op runs there, and nothing crosses to it,
    but for the int32 arguments (the held-out step's count of real samples,
    the loop's count of steps), which TensorFlow keeps in host memory, /cpu:0."""
    step, iterators, placement_ = tiny_step(("/cpu:1", "/cpu:2"), "/cpu:3",
                                            lambda: keras.optimizers.Adam(0.1))
    valid = tf.constant([8, 8])
    for function, args in ((step.train, (iterators,)), (step.evaluate, (iterators, valid)),
                           (step.train_loop, (iterators, tf.constant(3)))):
        _, metadata = placement.collect(function, *args)
        entries = placement.records(metadata, "step", placement_.devices,
                                    function.get_concrete_function(*args).graph)
        arguments = ("valid", "count")
        used = {e["assigned"] for e in entries
                if e["kind"] == "op" and e["name"] not in arguments}
        used |= {d for e in entries if e["kind"] == "transfer"
                 and e["tensor"].split(":")[0] not in arguments for d in (e["src"], e["dst"])}
        assert used == {"/cpu:1", "/cpu:2", "/cpu:3"}


def test_trace_command_writes_a_chrome_trace_of_the_real_step(logs):
    tmp = logs["tmp"]
    entries = logs[4][1]
    out = tmp / "step.json"
    result = run_cli("tower-placement", "trace", str(tmp / "cpu4.jsonl"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    events = json.loads(out.read_text())["traceEvents"]
    processes = sorted(e["args"]["name"] for e in events if e["name"] == "process_name")
    assert processes == [f"/cpu:{k}" for k in range(4)]
    data = [t for t in placement_report.transfers(entries, "train") if not t["control"]]
    flows = sorted((e["args"]["tensor"], e["args"]["bytes"]) for e in events if e["ph"] == "s")
    assert flows == sorted((t["tensor"], t["bytes"]) for t in data)
    assert len([e for e in events if e["ph"] == "f"]) == len(flows)
    assert result.stdout.startswith(f"wrote {out}: ")
    # Tower 3's ops are on its track of the device each ran on: its own for
    # its passes, /cpu:0 for its reads of the variables there.
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name"}
    pids = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    ran = {s["name"]: s["device"] for s in placement_report.slices(entries, "train")}
    tower = [e for e in events if e["ph"] == "X"
             and e["name"].startswith(("tower_3/", "gradient_tape/tower_3/"))]
    assert {ran[e["name"]] for e in tower} == {"/cpu:3", "/cpu:0"}
    for e in tower:
        assert e["pid"] == pids[ran[e["name"]]] and threads[(e["pid"], e["tid"])] == "tower 3"


def test_summary_has_the_step_analysis_memory_and_reasons(logs):
    # The run prints the short summary and how to print the rest.
    short = logs[2][0].stdout
    path = str(logs["tmp"] / "cpu2.jsonl")
    assert "  ops that ran elsewhere than asked: 7\n" in short
    assert "step analysis (one profiled" not in short
    assert "peak memory per device" not in short
    assert ("placement log: why ops moved, peak memory and the step's critical path: "
            f".venv/bin/tower-placement summary {path} --full\n") in short
    full = run_cli("tower-placement", "summary", path, "--full")
    assert full.returncode == 0, full.stderr
    out = full.stdout
    assert out.startswith(run_cli("tower-placement", "summary", path).stdout.split(
        "  ops that ran elsewhere")[0])
    assert "step analysis (one profiled train call, step, " in out
    assert "critical path:" in out and "longest ops per device:" in out
    assert "peak memory per device" in out
    # Tower 1 reads the variables on /cpu:0: its reads run there.
    assert ("1 op of tower 1 ran on /cpu:0, not /cpu:1: colocated with variable "
            "mlp/dense/kernel on /cpu:0 (a resource's ops run where it lives)") in out
    peaks = placement_report.memory(logs[2][1], "train")
    # tower-train chose a CPU allocator that reports every allocation. Tower 1's
    # largest tensor is the gradient of the first layer's kernel, 784 x 128
    # float32, made in backward; the rest of its step (64 samples' activations,
    # their gradients, the finiteness checks) is a fraction of it, and how much
    # of it is alive at the peak depends on the executor's order.
    kernel = 784 * 128 * 4
    assert kernel < peaks["/cpu:1"]["peak_bytes"] < 2 * kernel
    assert kernel < peaks["/cpu:1"]["phases"]["backward"] <= peaks["/cpu:1"]["peak_bytes"]
    assert peaks["/cpu:1"]["allocators"] == ["bfc_cpu_allocator_for_gpu"]
    assert "peak memory per device (tensors allocated during one train step):" in out


def test_check_command_fails_over_a_budget_and_passes_under_it(logs):
    path = str(logs["tmp"] / "cpu2.jsonl")
    moved = placement_report.matrix(logs[2][1], "train")
    up = moved[("/cpu:1", "/cpu:0")]
    over = run_cli("tower-placement", "check", path, "--max-bytes", f"*->/cpu:0={up - 1}")
    assert over.returncode == 1, over.stderr
    [line] = over.stdout.splitlines()
    assert line.startswith(
        f"/cpu:1 -> /cpu:0: {up:,} bytes per train step, over the budget *->/cpu:0={up - 1:,}; "
        "largest tensor gradient_tape/tower_1/")
    assert line.endswith(" (float32[784x128], 401,408 bytes)")  # the first layer's kernel
    under = run_cli("tower-placement", "check", path, "--max-bytes", f"*->/cpu:0={up}",
                    "--max-total-bytes", str(sum(moved.values())), "--no-strays")
    assert under.returncode == 0, under.stdout + under.stderr
    assert under.stdout.strip() == f"{path}: the train step keeps to every budget"
    bad = run_cli("tower-placement", "check", path, "--max-bytes", "cpu:1=5")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "tower-placement: error: --max-bytes: 'cpu:1=5' is not SRC->DST=BYTES; for example "
        "'/cpu:1->/cpu:0=500000' or '*->/cpu:0=1000000'"
    )


@pytest.mark.slow
def test_max_transfer_bytes_stops_the_run_after_the_first_step(mnist_dir, tmp_path):
    metrics = tmp_path / "m.jsonl"
    result = run_cli(
        "tower-train", "--devices", "cpu:2", "--data", mnist_dir, "--epochs", "1",
        "--steps-per-epoch", "3", "--max-transfer-bytes", "100000", "--metrics", str(metrics),
    )
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("tower-train: error: --max-transfer-bytes: all devices: 814,")
    assert "over the budget of 100,000; largest tensor " in line
    assert not metrics.exists()  # no epoch finished


def test_tensorboard_gets_the_step_coloured_by_device(logs):
    from tensorflow.core.protobuf import config_pb2

    directory = logs["tmp"] / "tb2" / "placement"
    found = {}
    for path in directory.iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                data = config_pb2.RunMetadata()
                data.ParseFromString(tf.make_ndarray(value.tensor).item())
                found[(value.tag, value.metadata.plugin_data.plugin_name)] = data
    assert set(found) == {(f"placement/{step}", plugin) for step in ("train", "eval")
                          for plugin in ("graph_run_metadata", "graph_run_metadata_graph")}
    data = found[("placement/train", "graph_run_metadata")]
    devices = {n.name: n.device for g in data.function_graphs
               for n in g.pre_optimization_graph.node}
    ran = {o["name"]: o["assigned"] for o in placement_report.ops(logs[2][1], "train")}
    kept = [name for name in devices if name in ran]
    assert len(kept) > 100
    for name in kept:  # the device it ran on, not the one it asked for
        assert placement.short_device(devices[name]) == ran[name], name
    timed = {n.node_name: n.all_end_rel_micros for d in data.step_stats.dev_stats
             for n in d.node_stats}
    slices = {s["name"] for s in placement_report.slices(logs[2][1], "train")}
    assert set(timed) == slices and all(t >= 1 for t in timed.values())


def _no_label_covers_a_box(picture):
    boxes = list(picture.boxes.values())
    spots = list(picture.labels.values())
    for i, label in enumerate(spots):
        for other in boxes + spots[:i]:
            w = min(label[2], other[2]) - max(label[0], other[0])
            h = min(label[3], other[3]) - max(label[1], other[1])
            assert w <= 0 or h <= 0, (label, other)


def test_a_ring_is_drawn_as_a_ring_with_labels_clear_of_the_boxes():
    step, iterators, placement_ = tiny_step(tuple(f"/cpu:{k}" for k in range(4)), "/cpu:0",
                                            lambda: keras.optimizers.SGD(0.1), "ring")
    log = placement.PlacementLog(None, placement.RunInfo(
        towers=placement_.devices, reduce_device="/cpu:0", parameters=15,
        parameter_bytes=60, batch_size=8, model="tiny", reducer="ring",
        variables="replicated"), timings=False)
    log.call("train", step.train, iterators)
    picture = placement_render.draw(log.entries)
    import matplotlib.pyplot as plt

    plt.close(picture.figure)
    # Neighbours on the ring stand next to each other on the circle: the
    # reduce device is one of them, not in the middle that hops would cross.
    angles = {d: math.atan2(y, x) for d, (x, y) in picture.positions.items()}
    assert all(math.hypot(*p) > 1 for p in picture.positions.values())
    order = sorted(angles, key=lambda d: -angles[d])
    start = order.index("/cpu:0")
    assert order[start:] + order[:start] == ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"]
    assert len(picture.labels) == len(placement_report.matrix(log.entries, "train"))
    _no_label_covers_a_box(picture)


def test_central_reduction_puts_the_reduce_device_in_the_middle(logs):
    picture = placement_render.draw(logs[4][1])
    import matplotlib.pyplot as plt

    plt.close(picture.figure)
    assert picture.positions["/cpu:0"] == (0.0, 0.0)
    _no_label_covers_a_box(picture)


def test_the_python_api_reads_the_log_as_the_command_does(logs, tmp_path):
    import towers

    path = str(logs["tmp"] / "cpu2.jsonl")
    log = towers.placement.load(path)
    printed = run_cli("tower-placement", "summary", path)
    assert printed.stdout.rstrip("\n") == towers.placement.summary(log)
    trace = towers.placement.write_trace(log, str(tmp_path / "step.json"))
    assert json.loads((tmp_path / "step.json").read_text()) == trace
    found = towers.placement.analyse(log)
    assert found.wall_us == placement_report.call(log, "train")["dur_us"] > 0
    assert [d.device for d in found.devices] == ["/cpu:0", "/cpu:1"]
    total = sum(placement_report.matrix(log, "train").values())
    assert towers.placement.check(log, towers.placement.Budget(max_total_bytes=total)) == []
    [over] = towers.placement.check(log, towers.placement.Budget(max_total_bytes=total - 1))
    assert over.startswith(f"all devices: {total:,} bytes per train step, over the budget of ")


def test_trace_of_a_log_without_timings_is_one_line(logs, tmp_path):
    untimed = [e for e in logs[2][1] if e["kind"] not in ("call", "slice", "memory")]
    path = tmp_path / "untimed.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in untimed))
    result = run_cli("tower-placement", "trace", str(path), "-o", str(tmp_path / "t.json"))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"tower-placement: error: '{path}': the log has no timings for the train step; they "
        "come from its second call: write the log with a run that calls it at least twice"
    )
    assert not (tmp_path / "t.json").exists()


def test_a_function_that_already_ran_is_refused_with_the_reason():
    step, iterators, placement_ = tiny_step(("/cpu:0", "/cpu:1"), "/cpu:0",
                                            lambda: keras.optimizers.SGD(0.1), "central")
    step.train(iterators)  # TensorFlow reports placement on this call only
    log = placement.PlacementLog(None, placement.RunInfo(
        towers=placement_.devices, reduce_device="/cpu:0", parameters=15,
        parameter_bytes=60, batch_size=8, model="tiny"), timings=False)
    with pytest.raises(ValueError, match="train step's function ran before this log saw it"):
        log.call("train", step.train, iterators)
    assert [e["kind"] for e in log.entries] == ["run"]  # nothing half-recorded
