"""The captured step in TensorBoard's graph dashboard, coloured by device.

TensorBoard colours a graph by the devices written in its nodes; a
`tf.function`'s traced graph holds only the requested devices, mostly none
(tensorboard#952). This writes, for each captured step, its run metadata with
every node's device set to where it really ran (from the partitioned graphs),
and step stats made from the profiled call's slices, so "Color: Device" and
"Color: Compute time" both work. Events go to `<logdir>/placement`, a run of
their own, under the tag `placement/<step>`.
"""

from __future__ import annotations

import os

import tensorflow as tf
from tensorflow.core.framework import step_stats_pb2
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.ops import summary_ops_v2

from engine.placement import report

SUBDIRECTORY = "placement"  # under `logdir`: a TensorBoard run of its own


def run_metadata(metadata, entries: list[dict], step: str) -> config_pb2.RunMetadata:
    """`metadata` (from the captured call) with devices and step stats filled in.

    Args:
      metadata: the RunMetadata of the captured call.
      entries: the placement log, for the profiled slices of `step`.
      step: `train` or `eval`.
    """
    out = config_pb2.RunMetadata()
    out.CopyFrom(metadata)
    full_names: dict[str, str] = {}
    for function_graph in out.function_graphs:
        for partition in function_graph.partition_graphs:
            for node in partition.node:
                full_names[node.name] = node.device
            out.partition_graphs.add().CopyFrom(partition)
        for node in function_graph.pre_optimization_graph.node:
            if node.name in full_names:
                node.device = full_names[node.name]
    call = report.call(entries, step)
    if call is None:
        return out
    by_device: dict[str, step_stats_pb2.DeviceStepStats] = {}
    for s in report.slices(entries, step):
        device = full_names.get(s["name"])
        if device is None:
            continue
        if device not in by_device:
            by_device[device] = out.step_stats.dev_stats.add(device=device)
        start, dur = int(round(s["start_us"])), max(int(round(s["dur_us"])), 1)
        by_device[device].node_stats.add(
            node_name=s["name"], all_start_micros=start, op_start_rel_micros=0,
            op_end_rel_micros=dur, all_end_rel_micros=dur,
            timeline_label=f"{s['name']} = {s['op']}()",
        )
    return out


def write(logdir: str, metadata: dict, entries: list[dict]) -> str:
    """Writes each captured step's run metadata for TensorBoard.

    Args:
      logdir: the run's TensorBoard directory.
      metadata: step kind -> RunMetadata of its captured call.
      entries: the placement log.

    Returns:
      The directory written to.
    """
    directory = os.path.join(logdir, SUBDIRECTORY)
    writer = tf.summary.create_file_writer(directory)
    with writer.as_default():
        for step, captured in sorted(metadata.items()):
            data = run_metadata(captured, entries, step)
            # The graph with the devices it ran on, and the step stats.
            summary_ops_v2.run_metadata_graphs(f"placement/{step}", data, step=0)
            summary_ops_v2.run_metadata(f"placement/{step}", data, step=0)
    writer.close()
    return directory
