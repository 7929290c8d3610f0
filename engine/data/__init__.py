"""Input: DALI pipelines per tower, data-set inspection and checks, MNIST, record files."""

from engine.data.inspect import (
    FORMATS,
    DataError,
    DatasetInfo,
    class_folders,
    eval_batches,
    inspect,
    shard_range,
    valid_counts,
)
from engine.data.pipeline import (
    DataOptions,
    GpuUnavailableError,
    PipelineFunction,
    Shard,
    sample_shape,
    tower_dataset,
    tower_pipeline,
)

__all__ = [
    "FORMATS", "DataError", "DataOptions", "DatasetInfo", "GpuUnavailableError",
    "PipelineFunction", "Shard", "class_folders", "eval_batches",
    "inspect", "sample_shape", "shard_range", "tower_dataset", "tower_pipeline", "valid_counts",
]
