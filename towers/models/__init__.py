"""The model zoo (`mlp`, `lenet`, `resnet20`, `resnet50`, `transformer`), or
the user's own function or `package.module:function`.

A model maps images [B, H, W, C] in [0, 1] to outputs [B, classes] (the
`transformer`: bytes [B, T] to [B, T, 256], text data): the zoo's
give class probabilities (softmax outputs, as Keras' MNIST examples have them)
for the default loss; a model that gives logits goes with a loss that takes
them (`SparseCategoricalCrossentropy(from_logits=True)`). It is built once per
variable copy, and every tower calls its copy.

A model function may carry `default_input_shape` (the ResNets do): the images
the data is decoded and resized to for it, unless the run's `image_size` (or
the source's own shape) says otherwise.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.errors import UsageError
from engine.userfn import calling, label, load_function, spec_arguments
from engine.userfn import parameters as describe_parameters

if TYPE_CHECKING:  # keras imports TensorFlow: only once a model is built
    import keras

from towers.models.resnet import resnet20, resnet50
from towers.models.small import lenet, mlp
from towers.models.transformer import transformer

__all__ = ["ZOO", "ModelError", "builder", "default_input_shape", "input_kind", "lenet",
           "mlp", "model_name", "resnet20", "resnet50", "resolve", "transformer"]


class ModelError(UsageError):
    """A `--model` that cannot be built; the message is one line."""


ZOO: dict[str, Callable[..., keras.Model]] = {
    "mlp": mlp, "lenet": lenet, "resnet20": resnet20, "resnet50": resnet50,
    "transformer": transformer,
}
"""The built-in models by name: each a function of (input_shape, num_classes) returning a new
Keras model."""
# What each reads: images [B, H, W, C] or byte sequences [B, T].
for _name, _function in ZOO.items():
    _function.reads = "sequences" if _name == "transformer" else "images"
MODEL_CONTRACT = (
    "a model function takes input_shape and num_classes (each optional, by "
    "those names) and returns a keras.Model"
)


def resolve(model: str | Callable[..., keras.Model]) -> Callable[..., keras.Model]:
    """The model function for a zoo name, `package.module:function` or a function.

    Args:
      model: a zoo name, with its keyword parameters as a spec
        (`transformer:layers=4,width=256`), `package.module:function`, or
        a function.

    Returns:
      The function (for a spec, with its parameters bound).

    Raises:
      ModelError: an unknown name, a spec that cannot be loaded, or a
        function with parameters other than input_shape and num_classes.
    """
    if isinstance(model, str):
        if model in ZOO:
            return ZOO[model]
        name = model.partition(":")[0]
        if name in ZOO:
            return _with_parameters(model, ZOO[name])
        if ":" not in model:
            raise ModelError(
                f"<model> {model!r} is not one of {', '.join(ZOO)} and not "
                "package.module:function"
            )
        function = load_function(model, "model", ModelError)
    elif callable(model):
        function = model
    else:
        raise ModelError(
            f"<model> {model!r} is not a zoo name, package.module:function or a function"
        )
    _check_parameters(function, model if isinstance(model, str) else label(function))
    return function


def _with_parameters(spec: str, function: Callable) -> Callable:
    """The zoo `function` with the keyword parameters of `spec` bound."""
    valid = {p.name: p.default for p in inspect.signature(function).parameters.values()
             if p.kind == p.KEYWORD_ONLY}
    bound = functools.partial(function, **spec_arguments(spec, valid, ModelError, "model"))
    bound.default_input_shape = getattr(function, "default_input_shape", None)
    bound.reads = getattr(function, "reads", None)
    return bound


def _check_parameters(function: Callable, name: str) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    required = [
        p.name for p in signature.parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY,
                                               p.KEYWORD_ONLY)
        and p.name not in ("input_shape", "num_classes")
    ]
    if required:
        raise ModelError(
            f"<model> {name!r} takes {describe_parameters(signature)}; {MODEL_CONTRACT}"
        )


def builder(model: str | Callable[..., keras.Model]) -> Callable[..., keras.Model]:
    """A function of (input_shape, num_classes) that builds `model`: user
    functions get those arguments when they declare them, and must return a
    built (or buildable) keras.Model.

    Args:
      model: a zoo name (`towers.models.names()`), `"package.module:function"`,
        or a function.

    Raises:
      ModelError: as `resolve`; when called, a function that returns
        something other than a keras.Model.
    """
    function = resolve(model)
    name = model if isinstance(model, str) else label(function)

    def build(input_shape, num_classes: int) -> keras.Model:
        import keras

        wanted = inspect.signature(function).parameters
        takes_any = any(p.kind == p.VAR_KEYWORD for p in wanted.values())
        kwargs = {
            key: value
            for key, value in (("input_shape", tuple(input_shape)), ("num_classes", num_classes))
            if key in wanted or takes_any
        }
        with calling("model", name):
            built = function(**kwargs)
        if not isinstance(built, keras.Model):
            raise ModelError(
                f"<model> {name!r} returned {type(built).__name__}, not a keras.Model"
            )
        if not built.built:
            built.build((None, *input_shape))
        return built

    build.__qualname__ = name
    return build


def model_name(model: str | Callable[..., keras.Model]) -> str:
    """How checkpoints and messages name `model`: the name or spec as given,
    else the function's label.

    Args:
      model: as `builder` takes it.
    """
    return model if isinstance(model, str) else label(model)


def input_kind(model: str | Callable[..., keras.Model]) -> str | None:
    """What `model` reads, `"images"` or `"sequences"`, for the zoo's models
    (their function's `reads`); None when it does not say (a user's model).

    Args:
      model: as `builder` takes it.

    Raises:
      ModelError: as `resolve`.
    """
    return getattr(resolve(model), "reads", None)


def default_input_shape(model: str | Callable[..., keras.Model]) -> tuple[int, int, int] | None:
    """The (height, width, channels) `model` is made for, or None when any
    shape does (its function's `default_input_shape`).

    Args:
      model: as `builder` takes it.

    Raises:
      ModelError: as `resolve`.
    """
    shape = getattr(resolve(model), "default_input_shape", None)
    return None if shape is None else tuple(shape)
