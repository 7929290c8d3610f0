"""Python arguments of the wrong type are refused in one line, naming the
argument, the value and its type, and what is accepted, before TensorFlow
starts: the ten tries of a new user (issue 44, item 3), and every argument of
the Trainer's signature, fit's, evaluate's and save's walked with a value of
a type none of them takes."""

from __future__ import annotations

import inspect

import pytest

import towers
from towers import _arguments


@pytest.mark.parametrize("arguments, message", [
    ({"devices": 2}, "devices 2 is an int; give a str, or a list or tuple"),
    ({"batch_size": "64"}, "batch_size '64' is a str; give an int (without quotes: "
                           "batch_size=64)"),
    ({"batch_size": True}, "batch_size True is a bool; give an int"),
    ({"learning_rate": "0.1"}, "learning_rate '0.1' is a str; give a number, or None (without "
                               "quotes: learning_rate=0.1)"),
    ({"model": 3}, "model 3 is an int; give a str, or a function"),
    ({"data": "/data/imagenet"}, "data '/data/imagenet' is a path; give "
                                 "towers.data.directory('/data/imagenet') (or "
                                 "towers.data.text('/data/imagenet') for a text corpus)"),
    ({"optimizer": object()}, "optimizer <a object object> is an object; give a str, or a "
                              "function"),
])
def test_a_wrong_type_is_one_line_naming_the_argument(arguments, message):
    with pytest.raises(towers.UsageError) as err:
        towers.Trainer(**{"devices": ["/cpu:0"], **arguments})
    assert str(err.value) == message
    assert "0x" not in str(err.value)


def test_a_keras_optimizer_object_is_refused_with_the_form_that_works():
    class SGD:  # a Keras optimizer's interface, without starting TensorFlow here
        learning_rate = 0.1

        def apply(self, grads, variables): ...
        def get_config(self): ...

        @classmethod
        def from_config(cls, config): ...

    with pytest.raises(towers.UsageError) as err:
        towers.Trainer(["/cpu:0"], optimizer=SGD())
    assert str(err.value) == (
        "optimizer a SGD object: each variable copy needs an optimizer of its own, and one "
        "made before the Trainer starts TensorFlow too early to split devices; give a "
        "function that makes it: optimizer=lambda: keras.optimizers.SGD(...)")


@pytest.mark.parametrize("arguments, message", [
    ({"epochs": "2"}, "epochs '2' is a str; give an int (without quotes: epochs=2)"),
    ({"steps_per_epoch": 2.5}, "steps_per_epoch 2.5 is a float; give an int, or None"),
    ({"checkpoint_every": None}, "checkpoint_every None is a NoneType; give an int"),
])
def test_fit_refuses_a_wrong_type_the_same_way(arguments, message):
    trainer = towers.Trainer(["/cpu:0"], data=towers.data.synthetic())
    with pytest.raises(towers.UsageError) as err:
        trainer.fit(**arguments)
    assert str(err.value) == message


def test_unions_are_split_at_the_top_level_only():
    assert _arguments._parts("Sequence[str | int] | None") == ["Sequence[str | int]", "None"]
    assert [said for _, said in _arguments.accepted("str | Topology | None")] == [
        "a str", "a towers.cost.Topology", "None"]
    assert _arguments.accepted("str | Shard | None") is None  # not checked here
    assert [said for _, said in _arguments.accepted("float | None")] == ["a number", "None"]


class Wrong:
    """A value of no type any argument takes."""


TRAINER_ARGUMENTS = [name for name in inspect.signature(towers.Trainer.__init__).parameters
                     if name != "self"]
FIT_ARGUMENTS = [name for name in inspect.signature(towers.Trainer.fit).parameters
                 if name != "self"]


@pytest.mark.parametrize("name", TRAINER_ARGUMENTS)
def test_every_trainer_argument_refuses_a_wrong_type_in_one_line(name):
    """Walks the signature: an argument added later is checked too."""
    with pytest.raises(towers.UsageError) as err:
        towers.Trainer(**{"devices": ["/cpu:0"], name: Wrong()})
    message = str(err.value)
    assert "\n" not in message and "0x" not in message
    assert message.startswith(f"{name} <a Wrong object> is a Wrong; give "), message


@pytest.fixture(scope="module")
def trainer():
    return towers.Trainer(["/cpu:0"], data=towers.data.synthetic())


@pytest.mark.parametrize("name", FIT_ARGUMENTS)
def test_every_fit_argument_refuses_a_wrong_type_in_one_line(trainer, name):
    with pytest.raises(towers.UsageError) as err:
        trainer.fit(**{name: Wrong()})
    message = str(err.value)
    assert "\n" not in message and "0x" not in message
    assert message.startswith(f"{name} <a Wrong object> is a Wrong; give "), message


@pytest.mark.parametrize("method, name", [("evaluate", "steps"), ("save", "path"),
                                          ("save", "best")])
def test_evaluate_and_save_refuse_a_wrong_type_in_one_line(trainer, method, name):
    arguments = {"path": "/tmp/model.keras", name: Wrong()}
    with pytest.raises(towers.UsageError) as err:
        getattr(trainer, method)(**({name: Wrong()} if method == "evaluate" else arguments))
    assert str(err.value).startswith(f"{name} <a Wrong object> is a Wrong; give ")
