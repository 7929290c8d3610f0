"""The zoo's larger models: their sizes, their shapes, and float32 outputs
under mixed precision."""

import pytest

from engine.core import precision
from towers import models


@pytest.mark.parametrize("name, shape, classes, parameters", [
    ("resnet20", (32, 32, 3), 10, 272_474),
    ("resnet50", (224, 224, 3), 1000, 25_583_592),  # 25.6M with batch norm's statistics
])
def test_resnets_have_their_published_sizes(name, shape, classes, parameters):
    assert models.default_input_shape(name) == shape
    model = models.builder(name)(shape, classes)
    assert sum(int(v.shape.num_elements()) for v in model.trainable_variables) == parameters
    assert tuple(model.output.shape) == (None, classes)


@pytest.mark.parametrize("name, shape", [("resnet20", (32, 32, 3)), ("resnet50", (64, 64, 3)),
                                         ("transformer:layers=1,width=32,heads=2", (16,))])
def test_outputs_stay_float32_under_float16(name, shape):
    """A float16 softmax over 1000 classes turned ResNet-50's loss to NaN on an
    H200 at step 18: the probabilities are computed in float32."""
    classes = 256 if name.startswith("transformer") else 1000
    with precision.policy("float16"):
        model = models.builder(name)(shape, classes)
    assert model.output.dtype == "float32"
    assert any(layer.compute_dtype == "float16" for layer in model.layers)
