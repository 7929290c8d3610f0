"""The weights' exponential moving average (`ema=`, `--ema`): the averages
are Keras' `use_ema` arithmetic over the weights training would have without
them, training itself is unchanged, evaluation and saving read the averages,
a checkpoint holds both and a resumed run goes on bit for bit; bad momenta
are refused in one line."""

import io

import numpy as np
import pytest
from conftest import flag_message

import towers
from engine.errors import UsageError

MOMENTUM = 0.5


class Weights(towers.callbacks.Callback):
    """The model's trainable weights after every step."""

    def __init__(self, trainer):
        self.trainer, self.after = trainer, []

    def on_train_batch_end(self, batch, logs):
        self.after.append([v.numpy() for v in self.trainer.model.trainable_variables])


def trainer(ema=0.0, **arguments):
    return towers.Trainer(["/cpu:0", "/cpu:1"], optimizer="sgd", learning_rate=0.5,
                          batch_size=16, seed=7, deterministic=True, ema=ema,
                          stream=io.StringIO(), **arguments)


def weights(model):
    return [v.numpy() for v in model.trainable_variables]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three steps without averages (each step's weights recorded) and the
    same three with them, keeping the best checkpoint."""
    plain = trainer()
    seen = Weights(plain)
    plain.fit(epochs=1, steps_per_epoch=3, eval_steps=0, callbacks=[seen], verbose=0)
    averaged = trainer(ema=MOMENTUM)
    averaged.fit(epochs=1, steps_per_epoch=3, eval_steps=0, verbose=2, keep_best="loss",
                 checkpoint_dir=str(tmp_path_factory.mktemp("ema") / "ckpt"))
    return plain, seen.after, averaged


@pytest.mark.slow
def test_the_averages_are_kerass_ema_of_the_weights_training_would_have(runs):
    plain, after, averaged = runs
    want = after[0]  # the first update's weights start the average
    for step in after[1:]:
        want = [MOMENTUM * a + (1 - MOMENTUM) * w for a, w in zip(want, step)]
    moved = max(float(np.abs(a - b).max()) for a, b in zip(after[0], after[-1]))
    assert moved > 1e-3  # the weights did move, so the averages differ from them
    for got, expected in zip(weights(averaged.model), want):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    # Training itself is unchanged: the trained weights are the plain run's.
    for got, expected in zip(averaged.built.step.trained, weights(plain.model)):
        np.testing.assert_array_equal(got.numpy(), expected)
    assert "weights averaged (EMA 0.5): evaluation, checkpoints and saving use the averages" \
        in averaged.stream.getvalue()


@pytest.mark.slow
def test_evaluation_and_saving_read_the_averages(runs, tmp_path):
    import keras

    plain, _, averaged = runs
    # The plain run's model holds what the averaged run trained; with the
    # averages put in, it evaluates the same held-out batches as the averaged
    # run does (neither has read any yet).
    trained = weights(plain.model)
    for variable, value in zip(plain.model.trainable_variables, weights(averaged.model)):
        variable.assign(value)
    assert plain.evaluate(steps=2) == averaged.evaluate(steps=2)
    for variable, value in zip(plain.model.trainable_variables, trained):
        variable.assign(value)
    for best in (False, True):  # the one epoch is the best one too
        saved = keras.models.load_model(averaged.save(str(tmp_path / f"m{best}.keras"),
                                                      best=best))
        for got, expected in zip(weights(saved), weights(averaged.model)):
            np.testing.assert_array_equal(got, expected)


@pytest.mark.slow
def test_each_replica_keeps_its_own_averages_and_they_agree():
    replicated = trainer(ema=MOMENTUM, variables="replicated")
    replicated.fit(epochs=1, steps_per_epoch=3, eval_steps=0, verbose=0)
    step = replicated.built.step
    count = len(replicated.model.trainable_variables)
    assert len(step.trained) == 2 * count  # a copy's trained weights beside it
    assert step.variables.check(0.0, 1) == 0.0  # the copies' averages are equal
    for k, average in enumerate(weights(replicated.model)):
        assert not np.array_equal(average, step.trained[k].numpy())
        np.testing.assert_array_equal(step.trained[k].numpy(), step.trained[count + k].numpy())


@pytest.mark.slow
def test_a_resumed_run_goes_on_with_the_averages_and_the_trained_weights(tmp_path):
    straight = trainer(ema=MOMENTUM)
    straight.fit(epochs=2, steps_per_epoch=2, eval_steps=0, verbose=0)
    folder = str(tmp_path / "ckpt")
    trainer(ema=MOMENTUM).fit(epochs=1, steps_per_epoch=2, eval_steps=0, verbose=0,
                              checkpoint_dir=folder)
    resumed = trainer(ema=MOMENTUM)
    resumed.fit(epochs=2, steps_per_epoch=2, eval_steps=0, verbose=0,
                checkpoint_dir=folder, resume=True)
    for got, expected in zip(weights(resumed.model), weights(straight.model)):
        np.testing.assert_array_equal(got, expected)
    for got, expected in zip(resumed.built.step.trained, straight.built.step.trained):
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
    # Its checkpoints fit only a run with the same averaging.
    with pytest.raises(UsageError) as err:
        trainer().fit(epochs=3, steps_per_epoch=2, eval_steps=0, verbose=0,
                      checkpoint_dir=folder, resume=True)
    assert "was written with ema 0.5, and this run has ema 0.0; resume with the same " \
        "ema" in str(err.value)


@pytest.mark.parametrize("value", [1.0, -0.1, float("nan")])
def test_a_momentum_outside_0_to_1_is_refused(value):
    with pytest.raises(UsageError) as err:
        towers.Trainer(["/cpu:0"], ema=value)
    assert flag_message(err.value) == (
        f"--ema ({value}) must be at least 0 and below 1 (0.999 averages over about the "
        "last 1,000 updates; 0: none)")


def test_local_sgd_replicas_are_not_compared_through_their_averages():
    # Each copy averages its own weights: the averages differ even right
    # after an averaging step, where the copies agree.
    local = trainer(ema=MOMENTUM, variables="replicated", reducer="localsgd:every=2")
    with pytest.raises(UsageError) as err:
        local.fit(epochs=1, steps_per_epoch=4, check_replicas=2, verbose=0)
    assert flag_message(err.value) == (
        "--check-replicas 2 --ema 0.5: under local SGD each copy averages its own weights, "
        "and those averages differ even where the copies agree; drop one of the two")
