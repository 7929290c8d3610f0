"""Gradient accumulation: K batches of B per tower make one step whose
update is that of one batch of K x B (a model without BatchNorm or dropout,
an exact-mean reducer), one reduction serves K batches (the placement log's
bytes per sample), and bad counts are refused in one line."""

import inspect
import io
import json

import numpy as np
import pytest
from conftest import flag_message

import towers
from engine.errors import UsageError
from engine.placement import summary as summary_lib
from engine.run import plan


def one_sgd_step(batch_size, accumulate, variables="reduce-device", model="lenet"):
    """The gradient one SGD step applied (from the weights before and after)
    and the step's record."""
    trainer = towers.Trainer(["/cpu:0", "/cpu:1"], model=model, optimizer="sgd", learning_rate=0.1,
                             batch_size=batch_size, accumulate=accumulate, seed=4,
                             variables=variables, stream=io.StringIO())
    trainer.evaluate(steps=1)  # builds the towers
    before = [v.numpy() for v in trainer.model.trainable_variables]
    record, = trainer.fit(epochs=1, steps_per_epoch=1, eval_steps=0, verbose=0)
    after = [v.numpy() for v in trainer.model.trainable_variables]
    return [(b - a) / 0.1 for b, a in zip(before, after)], record


@pytest.mark.slow
@pytest.mark.parametrize("variables", ["reduce-device", "replicated"])
def test_four_batches_of_32_make_the_step_of_one_batch_of_128(variables):
    large, large_record = one_sgd_step(128, 1, variables)
    accumulated, record = one_sgd_step(32, 4, variables)
    assert record["loss"] == pytest.approx(large_record["loss"], rel=1e-6)
    assert record["accuracy"] == large_record["accuracy"]
    for got, want in zip(accumulated, large):
        assert np.abs(want).max() > 1e-3  # every layer has a gradient to compare
        # Weights minus weights in float32, over a sum in another order.
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-7)


@pytest.mark.slow
def test_one_reduction_serves_k_batches_in_the_placement_log(tmp_path):
    """With replicated variables a step moves the gradients' reduction only;
    accumulating 4 batches moves the same bytes per step for 4 times the
    samples."""
    per_sample, totals = {}, {}
    for accumulate in (1, 4):
        log = tmp_path / f"placement-{accumulate}.jsonl"
        trainer = towers.Trainer(["/cpu:0", "/cpu:1"], model="lenet", batch_size=16,
                                 accumulate=accumulate, variables="replicated",
                                 stream=io.StringIO())
        trainer.fit(epochs=1, steps_per_epoch=2, eval_steps=0, placement_log=str(log),
                    verbose=0)
        entries = [json.loads(line) for line in log.read_text().splitlines()]
        lines = summary_lib.summary(entries).splitlines()
        total = next(x for x in lines if x.startswith("  total "))
        totals[accumulate] = int(total.split()[1].replace(",", ""))
        per_sample[accumulate] = next(x for x in lines if x.startswith("  per sample:"))
    parameter_bytes = entries[0]["parameter_bytes"]
    for accumulate, total in totals.items():
        # Central reduction: each tower's gradients cross once each way (give
        # or take a few scalars: the loss, the finite flags), whatever K is.
        assert abs(total - 2 * parameter_bytes) < 128
    assert per_sample[1] == (f"  per sample: {totals[1] / 32:,.0f} bytes "
                             "(32 samples per step: 2 towers x a batch of 16)")
    assert per_sample[4] == (f"  per sample: {totals[4] / 128:,.0f} bytes "
                             "(128 samples per step: 2 towers x 4 accumulated batches of 16)")

def test_the_epoch_and_the_default_learning_rate_count_the_accumulated_batches():
    trainer = towers.Trainer(["/cpu:0", "/cpu:1"], optimizer="sgd", batch_size=50, accumulate=3,
                             stream=io.StringIO())
    fit = {name: p.default for name, p in inspect.signature(trainer.fit).parameters.items()
           if name in inspect.signature(plan.fit_options).parameters}
    options = plan.fit_options(trainer.options.reducer, "reduce-device", trainer.info, 2,
                                 None, run=trainer.options, **{**fit, "epochs": 1})
    # MNIST's 60,000 training samples, 2 towers x 3 x 50 per step.
    assert options.loop.steps_per_epoch == 60_000 // 300
    assert trainer.options.model.learning_rate == pytest.approx(0.01 * 300 / 32)


@pytest.mark.parametrize("arguments, message", [
    ({"accumulate": 0}, "--accumulate (0) must be at least 1 (1: no accumulation)"),
    ({"accumulate": 1000, "batch_size": 64},
     "--accumulate 1000: 30000 samples per shard for 2 towers hold 468 batches of 64, "
     "fewer than one step of 1000; lower --accumulate or --batch-size"),
])
def test_a_count_that_does_not_fit_is_refused(arguments, message):
    with pytest.raises(UsageError) as err:
        towers.Trainer(["/cpu:0", "/cpu:1"], stream=io.StringIO(), **arguments)
    assert flag_message(err.value) == message


@pytest.mark.slow
def test_a_resume_with_another_count_is_refused_naming_it(tmp_path):
    first = towers.Trainer(["/cpu:0", "/cpu:1"], model="lenet", batch_size=16, accumulate=2,
                           stream=io.StringIO())
    first.fit(epochs=1, steps_per_epoch=2, eval_steps=0, checkpoint_dir=str(tmp_path),
              verbose=0)
    again = towers.Trainer(["/cpu:0", "/cpu:1"], model="lenet", batch_size=16,
                           stream=io.StringIO())
    with pytest.raises(UsageError) as err:
        again.fit(epochs=2, steps_per_epoch=2, eval_steps=0, checkpoint_dir=str(tmp_path),
                  resume=True, verbose=0)
    assert flag_message(err.value) == (
        f"--resume: {tmp_path}/ckpt-2 was written with accumulate 2, and this run has "
        "accumulate 1; resume with the same --accumulate, or start afresh with another "
        "--checkpoint-dir (the checkpoints are left as they are)")
