"""Residual networks: the CIFAR ResNet-20 and ImageNet's ResNet-50.

Both take images in [0, 1] and end in a float32 softmax, as the rest of the
zoo does; batch normalisation after each convolution makes the input scaling
matter little. Each function carries `default_input_shape`, the images the
data pipeline decodes to for it unless `image_size` says otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # keras imports TensorFlow: only once a model is built
    import keras

__all__ = ["resnet20", "resnet50"]


def _conv_bn(x, filters: int, strides: int = 1, *, relu: bool = True, kernel: int = 3):
    import keras

    x = keras.layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                            kernel_initializer="he_normal")(x)
    x = keras.layers.BatchNormalization()(x)
    return keras.layers.ReLU()(x) if relu else x


def resnet20(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10) -> keras.Model:
    """ResNet-20 of He et al. 2016 (section 4.2, CIFAR-10): about 0.27M parameters.

    A 3x3 convolution with 16 filters, then three stages of three basic blocks
    (two 3x3 convolutions each) with 16, 32 and 64 filters, the second and
    third stages starting with stride 2; global average pooling and a softmax.
    Where a stage halves the size, the shortcut is a 1x1 convolution with
    stride 2 (the paper's option B).

    Args:
      input_shape: one image's (height, width, channels).
      num_classes: outputs of the softmax.

    Returns:
      The keras.Model, its outputs probabilities.
    """
    import keras

    inputs = keras.Input(input_shape)
    x = _conv_bn(inputs, 16)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            strides = 2 if stage and not block else 1
            y = _conv_bn(x, filters, strides)
            y = _conv_bn(y, filters, relu=False)
            if strides != 1:
                x = _conv_bn(x, filters, strides, relu=False, kernel=1)
            x = keras.layers.ReLU()(keras.layers.Add()([x, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, _probabilities(keras.layers.Dense(num_classes)(x)),
                       name="resnet20")


def resnet50(input_shape: Sequence[int] = (224, 224, 3), num_classes: int = 1000) -> keras.Model:
    """ResNet-50 (He et al. 2015), Keras' architecture without pretrained
    weights: 25.6M parameters at 1000 classes, 4.1 GFLOPs per 224x224 image.

    Args:
      input_shape: one image's (height, width, channels).
      num_classes: outputs of the softmax.

    Returns:
      The keras.Model, its outputs probabilities.
    """
    import keras

    base = keras.applications.ResNet50(
        weights=None, input_shape=tuple(input_shape), classes=num_classes,
        classifier_activation=None,
    )
    return keras.Model(base.inputs, _probabilities(base.output), name="resnet50")


def _probabilities(logits):
    """Softmax in float32 whatever the layers compute in: in float16 it
    overflows and underflows over many classes (Keras' mixed-precision guide
    keeps the output in float32 for that reason)."""
    import keras

    return keras.layers.Activation("softmax", dtype="float32", name="probabilities")(logits)


resnet20.default_input_shape = (32, 32, 3)
resnet50.default_input_shape = (224, 224, 3)
