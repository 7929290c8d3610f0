"""The conformance kit passes the built-ins and says what a broken reducer does wrong."""

import conformance_reducers as broken
import numpy as np
import pytest
import tensorflow as tf
from conftest import LOGICAL_CPUS, run_cli
from user_reducers import gather_on_first

from engine import reducers
from engine.reducers import ReducerOptions, conformance
from engine.reducers.conformance import PerPlacement, exact_mean_factor

DEVICES = [f"/cpu:{k}" for k in range(LOGICAL_CPUS)]
CALL_CHECKS = ["runs", "structure", "shape", "dtype", "placement", "mean"]


def by_case(rows, name):
    """{(towers, destinations): row} of the rows of one check (float32 only)."""
    return {(r.towers, r.destinations): r for r in rows if r.name == name}


def test_a_summing_reducer_fails_the_mean_check_naming_the_factor():
    rows = conformance.check(broken.summed, DEVICES[:4], tower_counts=[1, 2, 4],
                             dtypes=[tf.float32])
    mean = by_case(rows, "mean")
    assert mean[1, "replicated"].passed and mean[1, "reduce-device"].passed  # sum = mean
    for n in (2, 4):
        for kind in ("replicated", "reduce-device"):
            assert not mean[n, kind].passed
            assert mean[n, kind].detail == (
                f"returned {n}.00 x the mean (the sum over {n} towers?); divide by len(devices)"
            )
    assert [r.name for r in rows if (r.towers, r.destinations) == (2, "replicated")] == CALL_CHECKS
    assert all(r.passed for r in rows if r.name != "mean")
    assert len(rows) == 3 * 2 * 6  # tower counts x destinations x checks


def test_exact_mean_factor_is_the_least_squares_ratio():
    assert exact_mean_factor([np.array([2.0, 4.0]), np.array(6.0)],
                             [np.array([1.0, 2.0]), np.array(3.0)]) == 2.0
    assert exact_mean_factor([tf.constant([1.0, 2.0])], [np.array([1.0, 2.0])]) == 1.0
    # (1 x 1 + 3 x 2) / (1 x 1 + 2 x 2)
    assert exact_mean_factor([np.array([1.0, 3.0])], [np.array([1.0, 2.0])]) == pytest.approx(1.4)
    with pytest.raises(ValueError) as err:
        exact_mean_factor([np.zeros(2)], [np.zeros(3)])
    assert str(err.value) == (
        "results[0] has shape (2,), means[0] (3,); pass means of the results' shapes"
    )


def test_a_reshaping_reducer_fails_the_shape_check_naming_both_shapes():
    rows = conformance.check(broken.flattened, DEVICES[:2], tower_counts=[2],
                             dtypes=[tf.float32])
    shape = by_case(rows, "shape")
    assert shape[2, "replicated"].detail == (
        "variable 0 for /cpu:0 has shape (15,), its gradient (5, 3) (and 3 more)"
    )  # the matrix and the scalar, on both towers
    assert shape[2, "reduce-device"].detail == (
        "variable 0 for /cpu:1 has shape (15,), its gradient (5, 3) (and 1 more)"
    )
    assert not any(r.name == "mean" for r in rows)  # no mean of the wrong shape
    assert all(r.passed for r in rows if r.name != "shape")


def test_an_exception_is_a_failed_row_with_its_first_line():
    rows = conformance.check(broken.powers_of_two, DEVICES[:3], tower_counts=[2, 3],
                             dtypes=[tf.float32, tf.float16])
    assert all(r.passed for r in rows if r.towers == 2)
    three = [(r.name, r.dtype, r.destinations, r.passed, r.detail) for r in rows
             if r.towers == 3]
    detail = "raised ValueError: 3 towers: this reducer needs a power of two of them"
    assert three == [
        ("runs", "float32", "replicated", False, detail),
        ("runs", "float16", "replicated", False, detail),
        ("runs", "float32", "reduce-device", False, detail),
        ("runs", "float16", "reduce-device", False, detail),
    ]


def test_a_result_left_on_another_device_fails_the_placement_check():
    rows = conformance.check(broken.left_on_first, DEVICES[:2], tower_counts=[2],
                             dtypes=[tf.float32])
    placement = by_case(rows, "placement")
    message = ("variable 0 for /cpu:1 was made on /cpu:0; make it under "
               "tf.device('/cpu:1') (and 2 more)")
    assert placement[2, "replicated"].detail == message
    assert placement[2, "reduce-device"].detail == message
    assert all(r.passed for r in rows if r.name != "placement")


def test_a_wrong_traffic_figure_fails_naming_each_device():
    rows = conformance.check(broken.claims_ring, DEVICES[:3], tower_counts=[2, 3],
                             dtypes=[tf.float32])
    traffic = by_case(rows, "traffic")
    assert traffic[2, "replicated"].passed  # on two towers a gather moves what a ring does
    # 3 towers: 96 float32 (384 bytes) per tower; /cpu:0 gathers and sends back
    assert traffic[3, "replicated"].detail == (
        "/cpu:0 sent 768 bytes, declared 512; /cpu:1 sent 384 bytes, declared 512; "
        "/cpu:2 sent 384 bytes, declared 512; fix the algorithm or its traffic() figure"
    )


@pytest.mark.parametrize("name, traffic_rows", [
    ("central", 6), ("ring", 3), ("tree", 3), ("hierarchical", 0), ("collective", 0),
])
def test_built_ins_pass_and_central_ring_tree_have_their_bytes_checked(name, traffic_rows):
    options = ReducerOptions(name=name, group_size=2)
    rows = conformance.check(PerPlacement(lambda p: reducers.build(options, p)),
                             DEVICES[:4], tower_counts=[1, 3, 4],
                             dtypes=[tf.float32, tf.float16])
    conformance.assert_all_passed(rows)
    # all-reduces have a figure when every tower needs the mean; central always
    assert sum(r.name == "traffic" for r in rows) == traffic_rows
    assert len(rows) == 3 * 2 * 2 * len(CALL_CHECKS) + traffic_rows


def test_check_names_a_missing_device_and_a_tower_count_too_large():
    with pytest.raises(ValueError, match=r"^devices: '/cpu:99' is not a device here; "
                                         r"devices here: /cpu:0, /cpu:1, "):
        conformance.check(broken.summed, ["/cpu:0", "/cpu:99"])
    with pytest.raises(ValueError) as err:
        conformance.check(broken.summed, DEVICES[:2], tower_counts=[3])
    assert str(err.value) == ("tower_counts: 3 is not between 1 and 2 (the devices "
                              "given); pass more devices or fewer towers")


class SummedTests(conformance.ReducerTestBase):  # no Test prefix: not collected
    devices = DEVICES[:3]

    def make_reducer(self, placement):
        return broken.summed


def test_the_test_base_fails_for_a_summing_reducer():
    SummedTests().test_mean_on_every_tower_count(1)  # one tower: the sum is the mean
    with pytest.raises(AssertionError) as err:
        SummedTests().test_mean_on_every_tower_count(3)
    assert str(err.value).splitlines() == ["2 of 12 checks failed:"] + [
        f"mean, 3 towers, float32, {kind}: FAIL: returned 3.00 x the mean (the sum over "
        "3 towers?); divide by len(devices)" for kind in ("replicated", "reduce-device")
    ]


class TestGatherOnFirst(conformance.ReducerTestBase):
    """How a researcher runs the kit on their reducer: a subclass, collected."""

    devices = DEVICES[:3]
    examples = 4

    def make_reducer(self, placement):
        return gather_on_first


@pytest.mark.slow
def test_check_from_the_command_line():
    summed = run_cli("tower-reduce-bench", "--check", "tests.conformance_reducers:summed",
                     "--devices", "cpu:3")
    assert summed.returncode == 1, summed.stderr
    lines = summed.stdout.splitlines()
    assert lines[0] == (
        "checking tests.conformance_reducers:summed: towers on /cpu:0, /cpu:1, /cpu:2, "
        "reduce device /cpu:0, gradients in float32, float16, float64"
    )
    assert "mean         pass  FAIL  FAIL" in lines
    assert lines[-3:] == [
        *(f"FAIL mean with {n} towers (float32, float16, float64; replicated and "
          f"reduce-device): returned {n}.00 x the mean (the sum over {n} towers?); "
          "divide by len(devices)" for n in (2, 3)),
        "12 of 90 checks failed",
    ]
    assert "checked 3 towers: 36 checks, 6 failed" in summed.stderr.splitlines()

    # A user's stateful class, built anew per case: feedback instead of mean.
    int8 = run_cli("tower-reduce-bench", "--check", "tests.user_reducers:Int8Feedback",
                   "--devices", "cpu:2")
    assert int8.returncode == 0, int8.stderr
    lines = int8.stdout.splitlines()
    assert "mean            -     -" in lines and "feedback     pass  pass" in lines
    # With training's reduce device, /cpu:0: one tower's two variable modes
    # are one case.
    assert lines[-1] == "54 checks passed"

    ring = run_cli("tower-reduce-bench", "--check", "ring", "--devices", "cpu:3")
    assert ring.returncode == 0, ring.stderr
    lines = ring.stdout.splitlines()
    assert "mean         pass  pass  pass" in lines
    assert "traffic      pass  pass  pass" in lines
    assert lines[-1] == "93 checks passed"
