"""The GPU tier: mixed decoding, GPU towers and reduce devices, float16 and XLA on
GPUs, every reducer between logical GPUs, and the placement log of GPU towers.

Skipped, with the reason, on hosts without a GPU. In this process GPU 0 is four
logical GPUs (conftest); the tower-train runs get the rest of its memory.
"""

import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import GPUS, LOGICAL_GPUS, needs_gpu, run_cli
from test_faults import read_scalars
from test_reducers import ALL

from engine import data, reducers
from engine.core import loop
from engine.core.options import LoopOptions, ModelOptions
from engine.core.progress import EpochProgress
from engine.placement import report as placement_report
from engine.reducers import conformance
from engine.run import build as train
from engine.topology.devices import parse_request, resolve
from engine.topology.splits import logical_gpu_map
from towers import models

pytestmark = needs_gpu

LOGICAL = [f"/gpu:{k}" for k in range(LOGICAL_GPUS)]


def logical_placement(reduce_device="/cpu:0"):
    """The conftest's logical GPUs as towers, read through GPU 0."""
    request = parse_request(f"gpu:{LOGICAL_GPUS}", reduce_device)
    return resolve(request, ["/cpu:0", *LOGICAL], logical_gpu_map(LOGICAL_GPUS, GPUS))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("reduce_device", ["/cpu:0", "/gpu:0"])
def test_every_reducer_gives_the_mean_between_logical_gpus(name, reduce_device):
    placement_ = logical_placement(reduce_device)
    rng = np.random.default_rng(7)
    arrays = [[rng.normal(size=(33, 5)), rng.normal(size=(7,))] for _ in LOGICAL]
    reducer = reducers.build(reducers.ReducerOptions(name=name, group_size=2), placement_)
    for destinations in (LOGICAL, [reduce_device]):
        rows = conformance.check_call(reducer, arrays, LOGICAL, destinations, tf.float32)
        conformance.assert_all_passed(rows)
        assert {row.name for row in rows} >= {"mean", "shape", "placement"}


def train_100_steps(mnist_dir, reducer, variables):
    """The built towers, and the record of 100 steps of the mlp on the four
    logical GPUs, with DALI decoding on each, and of the whole held-out set."""
    info = data.inspect(mnist_dir)
    data_options = data.DataOptions(format=info.format, train_path=info.train_path,
                                    val_path=info.val_path, batch_size=64)
    towers = train.build(logical_placement(), data_options,
                         ModelOptions(model=models.builder("mlp"), learning_rate=2e-3,
                                            variables=variables),
                         reducers.ReducerOptions(name=reducer), info.val_size)
    options = LoopOptions(epochs=1, steps_per_epoch=100, steps_per_loop=10,
                               eval_steps=data.eval_batches(info.val_size, 64, LOGICAL_GPUS))
    with open("/dev/null", "w") as quiet:
        (record,) = loop.run(towers.step, towers.train_iterators, options, EpochProgress(quiet),
                             watchers=[loop.Evaluation(towers.step, towers.held_out,
                                                       options.eval_steps)])
    return towers, record


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("variables", ["reduce-device", "replicated"])
def test_four_logical_gpus_train_real_mnist_with_each_reducer(mnist_dir, name, variables):
    """What `tower-train --devices gpu:4 --reducer NAME --variables MODE` runs:
    DALI decoding on the GPU for every tower, 100 steps, the whole held-out set."""
    towers, record = train_100_steps(mnist_dir, name, variables)
    print(f"gpu:{LOGICAL_GPUS} {name} {variables}: loss {record['loss']:.4f}, "
          f"eval_accuracy {record['eval_accuracy']:.4f} on {record['eval_samples']} digits")
    assert record["steps"] == 100 and record["eval_samples"] == 10_000
    assert record["eval_accuracy"] >= 0.9, record
    if variables == "replicated":
        assert towers.step.variables.check(1e-6, 100) == 0.0


STATEFUL = ["topk", "powersgd", "signsgd", "localsgd"]


@pytest.mark.parametrize("name", STATEFUL)
def test_every_stateful_reducer_passes_the_kit_between_logical_gpus(name):
    """int32 top-k indices, uint8 signs and QR on GPUs; local SGD replicated only."""
    kinds = ("replicated",) if name == "localsgd" else ("replicated", "reduce-device")
    # PowerSGD's matmuls run in TF32 on a GPU by default; the result made on
    # the CPU reduce device would then differ from what the towers keep as
    # sent by TF32's precision (docs: Reducers with state).
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(tf32 and name != "powersgd")
    try:
        rows = conformance.check(
            conformance.PerPlacement(
                lambda p: reducers.build(reducers.ReducerOptions(name=name), p)),
            LOGICAL, reduce_device="/cpu:0", dtypes=(tf.float32,),
            shapes=((33, 5), (7,), ()), kinds=kinds)
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
    if name == "topk":
        # TensorFlow keeps int32 tensors in host memory on a GPU: each
        # destination's copy of a tower's top-k indices costs one more
        # transfer than the figure, which counts the algorithm's bytes
        # (docs: Reducers with state). Everything else holds.
        extra = [r for r in rows if not r.passed]
        assert all(r.name == "traffic" and r.destinations == "replicated" for r in extra), extra
        rows = [r for r in rows if r.passed]
    conformance.assert_all_passed(rows)
    assert ("feedback" in {r.name for r in rows}) == (name != "localsgd")


@pytest.mark.parametrize("name", ["topk", "powersgd", "signsgd", "localsgd:every=4"])
def test_four_logical_gpus_train_real_mnist_with_each_stateful_reducer(mnist_dir, name):
    towers, record = train_100_steps(mnist_dir, name, "replicated")
    print(f"gpu:{LOGICAL_GPUS} {name} replicated: eval_accuracy {record['eval_accuracy']:.4f}")
    assert record["eval_accuracy"] >= 0.85, record
    # Equal bit for bit (local SGD: averaged at step 100), but for topk on
    # GPUs, whose replicas measured 1.5e-8 apart after 100 steps (open).
    worst = towers.step.variables.check(1e-6, 100)
    assert worst == 0.0 or (name == "topk" and worst <= 1e-7), worst
    state = towers.step.trackables()["reducer"]
    assert all(v.device.endswith(("GPU:0", "GPU:1", "GPU:2", "GPU:3")) for v in state.variables)


def test_a_gpu_tower_decodes_on_the_gpu_and_learns_the_digits(mnist_dir, tmp_path):
    metrics = tmp_path / "m.jsonl"
    result = run_cli("tower-train", "--devices", "0", "--data", mnist_dir, "--epochs", "1",
                     "--steps-per-epoch", "300", "--metrics", str(metrics))
    assert result.returncode == 0, result.stderr
    assert "  tower 0  /gpu:0   shard 0/1 of caffe2" in result.stdout
    assert "decode on GPU (mixed)" in result.stdout
    # The fastest setting for one GPU tower, each named with the flag that undoes it.
    assert ("  chosen   variables on /gpu:0, the tower's own GPU: weights and gradients "
            "never cross the host (--reduce-device /cpu:0 keeps them in host memory)"
            in result.stdout)
    assert "(--no-xla turns it off)" in result.stdout
    (record,) = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert record["eval_samples"] == 10_000 and record["eval_accuracy"] >= 0.93


@pytest.mark.parametrize(
    "flags, compute",
    [
        (["--mixed-precision"], "  compute  mixed float16 (variables and loss in float32), "
         "dynamic loss scaling from 32768"),
        (["--xla", "--variables", "replicated"], "  compute  float32, XLA: each tower's "
         "forward and backward, and each replica's update, compiled on its device"),
    ],
)
def test_float16_and_xla_on_gpu_towers(mnist_dir, tmp_path, flags, compute):
    metrics = tmp_path / "m.jsonl"
    result = run_cli("tower-train", "--devices", "gpu:2", "--data", mnist_dir, "--epochs",
                     "1", "--steps-per-epoch", "200", "--reduce-device", "/gpu:0",
                     "--metrics", str(metrics), *flags)
    assert result.returncode == 0, result.stderr
    assert compute in result.stdout.splitlines()
    (record,) = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert record["eval_accuracy"] >= 0.9, record
    if "--mixed-precision" in flags:
        assert record["loss_scale"] >= 1.0 and record["skipped"] == 0


# The copies between the host and a GPU tower's memory that each setting's
# step may make, by the tensor they carry, and why they remain. Seen on an
# H100 (2026-12-05) without XLA: the labels, int32, which TensorFlow's GPU
# kernels take in host memory, their reshape, and the non-finite skip's
# predicate. Nothing float may cross: no weight, gradient, metric sum, loss
# or loss scale.
LABELS = ("input_0/IteratorGetNext:1", "int32")
HOST_COPIES = {
    # The whole step is one XLA program on the tower's GPU: at most the labels
    # on their way into it.
    "default": {LABELS, ("tower_0/Reshape:0", "int32")},
    # Without XLA, the tf.cond of the non-finite skip becomes a Switch whose
    # predicate a GPU kernel takes in host memory.
    "xla=False": {LABELS, ("tower_0/Reshape:0", "int32"), ("update/All:0", "bool")},
}


def host_copies(entries) -> list[dict]:
    """The train step's transfers that touch host memory: to or from a CPU,
    or between a GPU kernel and host memory on the GPU's own device."""
    return [t for t in placement_report.transfers(entries, "train")
            if not t["control"] and ("/cpu:" in t["src"] + t["dst"] or t["via"] == "_HostSend"
                                     or t["src"] == t["dst"])]


@pytest.mark.parametrize("setting", list(HOST_COPIES))
def test_a_gpu_towers_step_makes_no_host_copies_beyond_those_listed(tmp_path, setting):
    """One GPU tower with float16 and loss scaling: the step's transfers that
    touch host memory, counted from its partitioned graphs, are among those
    listed for its setting (HOST_COPIES) and carry no float tensor: metric
    sums, loop counters, the loss scale and the non-finite flags stay on the
    GPU; without XLA the skip's predicate is the one scalar that crosses."""
    import io

    import towers

    stream = io.StringIO()
    trainer = towers.Trainer(["/gpu:0"], model="lenet", data=towers.data.synthetic(),
                             mixed_precision=True, stream=stream,
                             **({"xla": False} if setting == "xla=False" else {}))
    log = tmp_path / "p.jsonl"
    trainer.fit(epochs=1, steps_per_epoch=3, eval_steps=0, placement_log=str(log))
    header = stream.getvalue()
    assert "  chosen   variables on /gpu:0, the tower's own GPU" in header
    if setting == "default":
        assert "  chosen   XLA: the whole step (forward, backward, loss scale" in header
    copies = host_copies(placement_report.load(str(log)))
    seen = {(t["tensor"], t["dtype"]) for t in copies}
    assert seen <= HOST_COPIES[setting], [
        (t["tensor"], t["src"], t["dst"], t["dtype"], t["shape"], t["reason"]) for t in copies]
    assert not [t for t in copies if t["dtype"].startswith(("float", "bfloat"))]
    if setting == "default":
        assert ("update/All:0", "bool") not in seen


def test_placement_log_of_gpu_towers(mnist_dir, tmp_path):
    """Each tower's forward and backward on its logical GPU, the variables on
    the host (asked for), the bytes of the central reduction, and nothing stray."""
    log = tmp_path / "p.jsonl"
    result = run_cli("tower-train", "--devices", "gpu:2", "--data", mnist_dir, "--epochs",
                     "1", "--steps-per-epoch", "3", "--eval-steps", "2",
                     "--reduce-device", "/cpu:0", "--placement-log", str(log))
    assert result.returncode == 0, result.stderr
    entries = placement_report.load(str(log))
    ops = placement_report.ops(entries, "train")
    for k in range(2):
        backward = {o["assigned"] for o in ops if o["name"].startswith(f"gradient_tape/tower_{k}/")}
        assert backward == {f"/gpu:{k}"}
    assert {o["assigned"] for o in ops if o["tower"] == "reduce"} == {"/cpu:0"}
    assert placement_report.strays(entries) == []
    transfers = [t for t in entries if t["kind"] == "transfer" and t["step"] == "train"]
    assert all(t["bytes"] is not None for t in transfers)
    info = placement_report.run_info(entries)
    moved = sum(placement_report.matrix(entries, "train").values())
    assert moved == pytest.approx(placement_report.expected_bytes(info, "train"), rel=0.01)
    # The second step was profiled: each GPU tower's ops have timings, and its
    # device allocated (the GPU allocator records every allocation).
    slices = placement_report.slices(entries, "train")
    for k in range(2):
        assert any(s["device"] == f"/gpu:{k}" and s["name"].startswith(f"tower_{k}/")
                   for s in slices)
        assert placement_report.memory(entries, "train")[f"/gpu:{k}"]["peak_bytes"] > 0
    trace = tmp_path / "step.json"
    made = run_cli("tower-placement", "trace", str(log), "-o", str(trace))
    assert made.returncode == 0, made.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    assert {"/gpu:0", "/gpu:1", "/cpu:0"} <= {e["args"]["name"] for e in events
                                               if e["name"] == "process_name"}


def test_gpu_step_memory_and_an_int32_kept_in_host_memory():
    """On a GPU tower: its peak memory is its two largest activations (within
    25%: GPU allocators record every allocation), and an int32 it sends to the
    host goes through host memory, which the log says."""
    from engine.placement import log as placement

    with tf.device("/cpu:0"):
        w = tf.Variable(tf.random.normal([256, 256], seed=1), name="w")

    # Rows unknown until run time, so the int32 shape is computed on the GPU
    # (not folded into a constant), and its kernel keeps it in host memory.
    @tf.function(input_signature=[tf.TensorSpec([None, 256], tf.float32)])
    def step(x):
        with tf.device("/gpu:1"), tf.name_scope("tower_1"):
            tiled = tf.tile(x, [16, 1])
            product = tf.matmul(tiled, w)
            total = tf.reduce_sum(product, axis=0)
            rows = tf.shape(product)[0]
        with tf.device("/cpu:0"), tf.name_scope("reduce"):
            return total * tf.cast(rows, tf.float32)

    log = placement.PlacementLog(None, placement.RunInfo(
        towers=("/cpu:0", "/gpu:1"), reduce_device="/cpu:0", parameters=256 * 256,
        parameter_bytes=4 * 256 * 256, batch_size=256, model="test"))
    x = tf.random.normal([256, 256], seed=2)
    for _ in range(2):
        log.call("train", step, x)
    derived = 2 * 16 * 256 * 256 * 4  # the tiled x and the product, at once
    peak = placement_report.memory(log.entries, "train")["/gpu:1"]["peak_bytes"]
    assert peak == pytest.approx(derived, rel=0.25)
    host = [t for t in placement_report.transfers(log.entries, "train") if t["via"] == "_HostSend"]
    assert host and all(t["dtype"] == "int32" and t["src"] == "/gpu:1" for t in host)
    assert host[0]["reason"] == ("int32 tensor kept in host memory by a /gpu:1 kernel "
                                 "(GPU kernels take and give int32 in host memory)")
    slices = {s["name"]: s["device"] for s in placement_report.slices(log.entries, "train")}
    assert slices["tower_1/MatMul"] == "/gpu:1"


def test_nccl_on_logical_gpus_of_one_gpu_is_refused_in_one_line():
    result = run_cli("tower-train", "--devices", "gpu:2", "--reducer", "nccl",
                     "--data-format", "synthetic")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "tower-train: error: --reducer nccl: towers /gpu:0, /gpu:1 share physical GPU 0, "
        "and NCCL needs one GPU per tower (it would wait forever); use --reducer ring, "
        "tree or collective"
    )


def test_a_gpu_towers_block_copies_to_the_host_only_what_the_loop_reads():
    """One GPU tower with its variables there, compiled whole (the default):
    a block of K steps copies to the host only the four per-step stacks the
    loop reads (loss, accuracy, finite, overflow), at any K. One copy more
    (a flag read per step, an XLA conditional) fails it."""
    from engine.placement import profile

    request = parse_request("gpu:1", "/gpu:0")
    placement_ = resolve(request, ["/cpu:0", *LOGICAL], logical_gpu_map(LOGICAL_GPUS, GPUS))
    data_options = data.DataOptions(format="synthetic", train_path=None, val_path=None,
                                    batch_size=64, image_shape=(28, 28, 1), num_classes=10)
    built = train.build(placement_, data_options,
                        ModelOptions(model=models.builder("mlp"), xla=True,
                                     compute_dtype="float16"),
                        reducers.ReducerOptions(name="central"), None)
    step, iterators = built.step, built.train_iterators
    assert step.whole_step

    def block(k):
        return loop.per_step(step.train_loop(iterators, tf.constant(k, tf.int32), True))

    copies = {}
    for k in (5, 20):
        block(k)  # traced and compiled, DALI's queue full
        steps, prof = profile.profile(block, k)
        assert len(steps) == k and all(s["finite"].all() for s in steps)
        copies[k] = prof.copies
    print(f"copies per block: {copies}")
    assert copies[20].get("MemcpyD2H", 0) == copies[5].get("MemcpyD2H", 0)  # none per step
    assert copies[20].get("MemcpyD2H", 0) <= 4


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_the_transformer_trains_in_each_mixed_precision_with_the_defaults(tmp_path, precision):
    """One GPU tower with the defaults (variables on the GPU, the whole step
    compiled by XLA, 25 steps a call): 30 steps of batch 64 on the text
    corpus, each step's loss finite and the last ones well below the first
    (on an H100 on 2026-12-07, bfloat16 stopped at step 3, not finite)."""
    metrics = tmp_path / "m.jsonl"
    result = run_cli("tower-train", "--devices", "0", "--model", "transformer",
                     "--data-format", "text", "--batch-size", "64", "--epochs", "1",
                     "--steps-per-epoch", "30", "--eval-steps", "0",
                     "--mixed-precision", precision, "--metrics", str(metrics),
                     "--logdir", str(tmp_path / "tb"))
    assert result.returncode == 0, result.stderr[-2000:]
    steps = [loss for _, loss in sorted(read_scalars(tmp_path / "tb")["train/loss"])]
    assert len(steps) == 30 and all(np.isfinite(steps)), steps
    assert np.mean(steps[-5:]) < np.mean(steps[:5]) - 0.5, steps

