"""The placement timeline: Chrome trace, step analysis, memory, reasons, budgets.

Most tests capture a hand-built two-tower step in this process, whose work is
known: tower 1 runs a 16x larger matmul than tower 0, and its largest
activations are derived here. One end-to-end run covers what only the
command line shows (`tower-placement trace` and `check`, `--max-transfer-bytes`).
"""

import json

import pytest
import tensorflow as tf

from engine.placement import analysis, budgets, report
from engine.placement import log as placement
from engine.placement import summary as placement_text
from engine.placement import trace as placement_trace

ROWS, INNER, COLS = 256, 1024, 1024  # x is [ROWS, INNER] float32, w [INNER, COLS]
SCALE = (1, 16)  # tower k tiles x SCALE[k] times before its matmul
# Tower 1's matmul (4G multiply-adds) is 250 times the work of its tile or sum:
# on a busy 2-core machine a descheduled small op cannot outlast it.


def _info(towers=("/cpu:0", "/cpu:1")):
    return placement.RunInfo(
        towers=towers, reduce_device="/cpu:0", parameters=INNER * COLS,
        parameter_bytes=4 * INNER * COLS, batch_size=ROWS, model="test",
    )


def _two_towers(colocate: bool = False):
    """A step: tower k (on /cpu:k) tiles x SCALE[k] times, multiplies by a
    variable on /cpu:0 and sums the rows; the reduce sums the towers'."""
    with tf.device("/cpu:0"):
        w = tf.Variable(tf.random.normal([INNER, COLS], seed=1), name="w")

    @tf.function
    def step(x):
        outs = []
        for k, n in enumerate(SCALE):
            with tf.device(f"/cpu:{k}"), tf.name_scope(f"tower_{k}"):
                tiled = tf.tile(x, [n, 1])
                product = tf.matmul(tiled, w)
                total = tf.reduce_sum(product, axis=0)
                if colocate and k == 1:
                    with tf.compat.v1.colocate_with(w):
                        total = total * 2.0
                outs.append(total)
        with tf.device("/cpu:0"), tf.name_scope("reduce"):
            return tf.add_n(outs)

    return step, w


@pytest.fixture(autouse=True)
def on_the_host():
    """The steps here are called from /cpu:0: on a GPU host the default
    device would be a GPU, and the function's plumbing would go there."""
    with tf.device("/cpu:0"):
        yield


@pytest.fixture(scope="module")
def timed():
    """The log of the two-tower step: captured, then profiled."""
    with tf.device("/cpu:0"):
        step, _ = _two_towers()
        x = tf.random.normal([ROWS, INNER], seed=2)
        log = placement.PlacementLog(None, _info())
        for _ in range(3):
            log.call("train", step, x)
    return log.entries


def test_the_second_call_is_profiled_once(timed):
    assert len([e for e in timed if e["kind"] == "call"]) == 1
    names = {s["name"] for s in report.slices(timed, "train")}
    assert {"tower_0/MatMul", "tower_1/MatMul", "reduce/AddN"} <= names
    devices = {s["name"]: s["device"] for s in report.slices(timed, "train")}
    assert devices["tower_1/MatMul"] == "/cpu:1" and devices["reduce/AddN"] == "/cpu:0"


def test_trace_has_a_track_per_device_and_slices_inside_the_step(timed):
    trace = placement_trace.chrome_trace(timed, "train")
    json.dumps(trace)  # what -o writes
    events = trace["traceEvents"]
    processes = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert set(processes) == {"/cpu:0", "/cpu:1"}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert (processes["/cpu:1"], "tower 1") in threads
    assert (processes["/cpu:0"], "reduce") in threads
    wall = report.call(timed, "train")["dur_us"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(report.slices(timed, "train")) > 10
    for e in slices:
        assert 0 <= e["ts"] and e["ts"] + e["dur"] <= wall + 1e-3, e


def test_every_data_transfer_is_a_flow_pair_with_its_bytes(timed):
    events = placement_trace.chrome_trace(timed, "train")["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys()
    data = [t for t in report.transfers(timed, "train") if not t["control"]]
    # w to tower 1, x to tower 1, tower 1's sums to the reduce.
    assert len(data) == len(starts) == 3
    flows = sorted((s["args"]["tensor"], s["args"]["bytes"]) for s in starts.values())
    assert flows == sorted((t["tensor"], t["bytes"]) for t in data)
    assert sum(b for _, b in flows) == 4 * (ROWS * INNER + INNER * COLS + COLS)
    pids = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    for i, start in starts.items():
        assert (start["pid"], ends[i]["pid"]) in {
            (pids[start["args"]["src"]], pids[start["args"]["dst"]])
        }


def test_the_large_matmul_is_the_longest_op_and_on_the_critical_path(timed):
    found = analysis.analyse(timed, "train")
    by_device = {d.device: d for d in found.devices}
    assert by_device["/cpu:1"].longest[0]["name"] == "tower_1/MatMul"
    path = [link.name for link in found.critical_path]
    assert "tower_1/MatMul" in path and "tower_0/MatMul" not in path
    assert path[-1] == "reduce/AddN"
    # The path crosses devices through tower 1's send of its sums.
    sends = [link for link in found.critical_path if link.transfer]
    assert any(link.transfer == f"/cpu:1 -> /cpu:0, {4 * COLS:,} bytes" for link in sends)
    busy = by_device["/cpu:1"].busy_us
    assert 0 < busy <= found.wall_us and by_device["/cpu:1"].idle_us == pytest.approx(
        found.wall_us - busy, abs=1e-3)
    text = placement_text.summary(timed, full=True)
    # The kernel's type is oneDNN's _MklMatMul where TensorFlow uses oneDNN.
    kind = by_device["/cpu:1"].longest[0]["op"]
    assert kind in ("MatMul", "_MklMatMul")
    assert "critical path:" in text and f"tower_1/MatMul ({kind})" in text


def test_peak_memory_of_tower_1_is_its_two_largest_activations(timed):
    # Tower 1 holds its tiled x, [16*256, 1024], and the matmul's product,
    # [16*256, 1024], at once (float32); the only other tensor it makes is its
    # sum, [1024]. The CPU allocator reports every allocation (conftest).
    derived = 4 * SCALE[1] * ROWS * (INNER + COLS)
    peaks = report.memory(timed, "train")
    assert peaks["/cpu:1"]["peak_bytes"] == pytest.approx(derived, abs=4 * COLS)
    assert peaks["/cpu:1"]["phases"]["forward"] == peaks["/cpu:1"]["peak_bytes"]
    # Tower 0 tiles once (the tile is its input): its product and its sum.
    assert peaks["/cpu:0"]["peak_bytes"] == pytest.approx(4 * ROWS * COLS, abs=4 * COLS)
    counters = [e for e in placement_trace.chrome_trace(timed)["traceEvents"] if e["ph"] == "C"]
    assert max(e["args"]["bytes"] for e in counters) == peaks["/cpu:1"]["peak_bytes"]
    full = placement_text.summary(timed, full=True)
    assert f"/cpu:1: {peaks['/cpu:1']['peak_bytes']:,} bytes" in full


def test_devices_whose_allocator_reported_nothing_are_named_with_why(timed):
    # TensorFlow's default CPU allocator (a process that did not choose BFC)
    # reports no allocation: the summary names each device and the fix.
    unreported = [e for e in timed if e["kind"] != "memory"]
    lines = placement_text.memory_lines(unreported, "train")
    why = ("no allocations recorded: TensorFlow's default CPU allocator reports none "
           "to the profiler; start TensorFlow with TF_CPU_ALLOCATOR_USE_BFC=true "
           "(towers.Trainer does) to see them all")
    assert lines[1:] == [f"    /cpu:0: {why}", f"    /cpu:1: {why}"]
    # A CPU device silent in one step of a log whose other step has CPU
    # allocations made no new tensor there (found on a GPU run: eval's /cpu:0
    # only reads variables); the allocator is not blamed.
    eval_unreported = timed + [{**e, "step": "eval"} for e in timed
                               if e["kind"] in ("call", "slice")]
    assert report.memory(eval_unreported, "train")
    assert placement_text.memory_lines(eval_unreported, "eval")[1:] == [
        "    /cpu:0: no allocations recorded: its ops made no new tensor",
        "    /cpu:1: no allocations recorded: its ops made no new tensor"]
    # oneDNN's allocator reports tensors of 256 KiB or more: the header says
    # so, also of a step where it recorded none (then none was that large).
    partial = [{**e, "allocators": ["mklcpu"]} if e["kind"] == "memory" else e for e in timed]
    assert "on CPUs tensors of 256 KiB or more" in placement_text.memory_lines(partial, "train")[0]
    partial_eval = partial + [{**e, "step": "eval"} for e in timed
                              if e["kind"] in ("call", "slice")]
    lines = placement_text.memory_lines(partial_eval, "eval")
    assert "on CPUs tensors of 256 KiB or more" in lines[0]
    assert lines[1:] == ["    /cpu:0: no allocations recorded: none of 256 KiB or more",
                         "    /cpu:1: no allocations recorded: none of 256 KiB or more"]


def test_colocations_with_many_variables_are_one_line_and_few_are_named():
    def op(tower, variable, assigned="/cpu:0"):
        return {"tower": tower, "assigned": assigned, "requested": "/cpu:1",
                "reason": f"colocated with variable {variable} on /cpu:0 (a resource's ops "
                          "run where it lives)"}

    # ResNet-50's tower 1 printed a line per batch-norm statistic (213 lines).
    # Nine variables make one line (eight would be eight), the one with the
    # most ops named first.
    many = [op(1, f"bn{k}/moving_mean") for k in range(9) for _ in range(2)] + [op(1, "bn8/x")]
    assert len(placement_text.reason_lines(many[:16], ["/cpu:0", "/cpu:1"])) == 1 + 8
    few = [op(2, "w"), op(2, "b")]
    other = [{"tower": 1, "assigned": "/cpu:0", "requested": "/cpu:1",
              "reason": "no /cpu:1 kernel for StringFormat"}]
    lines = placement_text.reason_lines(many + few + other, ["/cpu:0", "/cpu:1", "/cpu:2"])
    assert lines == [
        "  ops that ran elsewhere than asked (22):",
        "    19 ops of tower 1 ran on /cpu:0, not /cpu:1: colocated with 10 variables on "
        "/cpu:0 (bn0/moving_mean, bn1/moving_mean, bn2/moving_mean and 7 more, each named "
        "in the placement log; a resource's ops run where it lives)",
        "    1 op of tower 1 ran on /cpu:0, not /cpu:1: no /cpu:1 kernel for StringFormat",
        "    1 op of tower 2 ran on /cpu:0, not /cpu:2: colocated with variable b on /cpu:0 "
        "(a resource's ops run where it lives)",
        "    1 op of tower 2 ran on /cpu:0, not /cpu:2: colocated with variable w on /cpu:0 "
        "(a resource's ops run where it lives)",
    ]


def test_reasons_name_the_variable_an_op_was_colocated_with():
    step, _ = _two_towers(colocate=True)
    log = placement.PlacementLog(None, _info())
    log.call("train", step, tf.ones([ROWS, INNER]))
    moved = {o["name"]: o for o in report.ops(log.entries, "train") if o["reason"]}
    colocated = moved["tower_1/mul"]
    assert colocated["assigned"] == "/cpu:0"
    assert colocated["reason"].startswith("colocated with variable w on /cpu:0")
    read = [o for o in moved.values() if o["op"] == "ReadVariableOp" and o["tower"] == 1]
    assert read and all("variable w on /cpu:0" in o["reason"] for o in read)
    text = placement_text.summary(log.entries, full=True)
    assert ("2 ops of tower 1 ran on /cpu:0, not /cpu:1: colocated with variable w on "
            "/cpu:0 (a colocation constraint)") in text, text


def test_an_op_asked_for_no_device_says_so():
    @tf.function
    def step(x):
        with tf.device("/cpu:1"), tf.name_scope("tower_1"):
            y = x * 2.0
        with tf.name_scope("tower_1"):
            return y + 1.0  # built outside the tower's device scope

    log = placement.PlacementLog(None, _info())
    log.call("train", step, tf.ones([4]))
    moved = [o for o in report.ops(log.entries, "train") if o["reason"]]
    assert moved, placement_text.summary(log.entries)
    assert all(o["reason"].startswith("no device requested") for o in moved)


def test_budget_fails_below_the_measured_bytes_naming_the_largest_tensor(timed):
    moved = report.matrix(timed, "train")
    into = moved[("/cpu:0", "/cpu:1")]
    assert into == 4 * (ROWS * INNER + INNER * COLS)  # x and w
    over = budgets.violations(timed, budgets.Budget(max_bytes=(("*", "/cpu:1", into - 1),)))
    assert len(over) == 1
    assert over[0].startswith(f"/cpu:0 -> /cpu:1: {into:,} bytes per train step, over")
    assert over[0].endswith(f"float32[{INNER}x{COLS}], {4 * INNER * COLS:,} bytes)")  # w
    assert budgets.violations(timed, budgets.Budget(max_bytes=(("*", "*", into),))) == []
    total = sum(moved.values())
    assert budgets.violations(timed, budgets.Budget(max_total_bytes=total)) == []
    assert len(budgets.violations(timed, budgets.Budget(max_total_bytes=total - 1))) == 1
    peak = report.memory(timed, "train")["/cpu:1"]["peak_bytes"]
    assert budgets.violations(timed, budgets.Budget(max_peak_memory=(("/cpu:1", peak),))) == []
    assert budgets.violations(
        timed, budgets.Budget(max_peak_memory=(("*", peak - 1),))
    ) == [f"/cpu:1: peak memory {peak:,} bytes in the train step, over the budget *={peak - 1:,}"]


@pytest.mark.parametrize("text", ["cpu:0", "/cpu:0->=5", "a->b=-1", "a->b=1e6"])
def test_a_malformed_byte_budget_names_the_argument(text):
    with pytest.raises(ValueError, match=rf"^max_bytes: '{text}' is not SRC->DST=BYTES"):
        budgets.parse_pair(text)


def test_a_budget_names_devices_as_the_log_does(timed):
    with pytest.raises(ValueError, match=r"^max_bytes: 'cpu:1' is not a device as the log "
                       r"names them; write /cpu:1, or \*$"):
        budgets.Budget(max_bytes=(("cpu:1", "*", 5),))
    with pytest.raises(ValueError, match=r"^max_bytes: /cpu:7 is not a device of the train "
                       r"step; it has /cpu:0, /cpu:1$"):
        budgets.violations(timed, budgets.Budget(max_bytes=(("/cpu:7", "*", 5),)))
    with pytest.raises(ValueError, match=r"^the log has no eval step; it holds: train$"):
        budgets.violations(timed, budgets.Budget(max_total_bytes=5), "eval")


def test_only_a_call_of_the_captured_function_is_timed():
    """The loop of steps and the single step are both `train` calls: timings
    join by node name, so only the function that was captured is profiled."""
    step, _ = _two_towers()
    other, _ = _two_towers()
    x = tf.ones([ROWS, INNER])
    log = placement.PlacementLog(None, _info())
    log.call("train", step, x)
    log.call("train", other, x)
    assert report.call(log.entries, "train") is None
    log.call("train", step, x)
    assert report.call(log.entries, "train")["steps"] == 1
    assert not log.notes
