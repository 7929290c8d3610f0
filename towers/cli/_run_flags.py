"""tower-train's flags of how a run goes once its model is chosen:
checkpoints, determinism, precision and speed, the placement log and
profiling, the cluster, and the output (towers.cli.train_flags adds them
after the others; `--help` groups them by train_flags.SECTIONS)."""

from __future__ import annotations

import click

from engine.core.options import COMPUTE_DTYPES

# --mixed-precision's values: auto (the device's own) or a compute dtype below
# float32.
MIXED_PRECISION = ("auto", *(d for d in COMPUTE_DTYPES if d != "float32"))

RUN_OPTIONS = [
    click.option(
        "--checkpoint-dir",
        default=None,
        help="Save checkpoints here: at the end of every epoch, and every "
        "--checkpoint-every steps.",
    ),
    click.option(
        "--checkpoint-every",
        default=0,
        show_default=True,
        type=int,
        help="Also save every K steps (0: only at the end of epochs).",
    ),
    click.option(
        "--keep-checkpoints",
        default=3,
        show_default=True,
        type=int,
        help="Keep the newest M checkpoints.",
    ),
    click.option(
        "--keep-best",
        default=None,
        metavar="METRIC",
        help="Also keep the checkpoint of the epoch with the best METRIC "
        "(eval_accuracy, eval_loss, eval_top5_accuracy, accuracy, loss) in "
        "--checkpoint-dir/best; --save-model then writes that epoch's model.",
    ),
    click.option(
        "--resume",
        is_flag=True,
        help="Continue from the newest good checkpoint in --checkpoint-dir.",
    ),
    click.option(
        "--skip-nonfinite",
        is_flag=True,
        help="Skip (and count) steps whose loss or gradient is not finite "
        "instead of stopping.",
    ),
    click.option(
        "--deterministic",
        is_flag=True,
        help="TensorFlow op determinism: runs with the same seed and devices "
        "give identical losses.",
    ),
    click.option(
        "--xla/--no-xla",
        default=None,
        help="Compile with XLA: one GPU tower whose variables live on it is compiled "
        "whole, forward to update; other towers each their forward and backward "
        "(needs --variables replicated). Default: on exactly where the whole step "
        "compiles on a GPU.",
    ),
    click.option(
        "--mixed-precision",
        is_flag=False,
        flag_value="auto",
        default=None,
        metavar="[" + "|".join(MIXED_PRECISION) + "]",
        type=click.Choice(MIXED_PRECISION),
        help="Alone or 'auto': compute in float16 on GPU towers (with dynamic loss "
        "scaling) and bfloat16 on CPU towers; or in the dtype named (bfloat16 needs no "
        "loss scaling). Variables and the loss stay float32.",
    ),
    click.option(
        "--logdir",
        default=None,
        help="Write TensorBoard scalars here (loss, accuracy, step time each "
        "step; images/s and held-out numbers each epoch).",
    ),
    click.option(
        "--profile-steps",
        default=None,
        help="A:B: a TensorFlow profiler trace of global steps A to B, in --logdir.",
    ),
    click.option(
        "--placement-log",
        default=None,
        help="Write where every op of the first train and eval steps really "
        "ran, and what crossed devices, to this JSON Lines file; a summary "
        "is printed at the end.",
    ),
    click.option(
        "--strict-placement",
        is_flag=True,
        help="Stop after the first step if any tower op ran outside its "
        "tower's device.",
    ),
    click.option(
        "--max-transfer-bytes",
        default=None,
        type=click.IntRange(min=0),
        metavar="N",
        help="Stop with exit 1 after the first train step if it moved more than N "
        "bytes between devices (a traffic budget for CI; the error names the "
        "largest tensor, --placement-log records them all).",
    ),
    click.option(
        "--log-device-placement",
        is_flag=True,
        help="Also turn on TensorFlow's own device placement printout.",
    ),
    click.option(
        "--dali-threads",
        default=None,
        type=int,
        help="DALI worker threads per tower pipeline. Default: a quarter of "
        "this host's cores per tower (at least 1), leaving the rest to the towers.",
    ),
    click.option(
        "--prefetch",
        default=2,
        show_default=True,
        type=int,
        help="DALI prefetch queue depth per tower pipeline.",
    ),
    click.option(
        "--cluster",
        "cluster",
        default=None,
        help="Train on remote towers too: the workers' addresses, e.g. "
        "worker=h1:2222,h2:2222 (each running tower-worker); add "
        "'chief=THIS_HOST:PORT;' in front when the workers are on other hosts. "
        "Default: TF_CONFIG's cluster, if set.",
    ),
    click.option(
        "--connect-timeout",
        default=60.0,
        show_default=True,
        type=float,
        help="Seconds to wait for every cluster task to answer at start.",
    ),
    click.option(
        "--step-timeout",
        default=300.0,
        show_default=True,
        type=float,
        help="With a cluster: seconds a step may take before the run stops "
        "and names the tasks that do not answer.",
    ),
    click.option(
        "--max-restarts",
        default=0,
        show_default=True,
        type=int,
        help="When the run's process dies (killed, failed) or loses a worker (with a "
        "cluster: after every task answers again, up to --connect-timeout), start it "
        "again from the newest checkpoint, up to N times; a stop by Ctrl-C or SIGTERM "
        "is not restarted, nor the same failure at the same step twice. Needs "
        "--checkpoint-dir.",
    ),
    click.option(
        "--save-model",
        default=None,
        metavar="PATH",
        help="After training, write the model where it loads without this package: "
        "PATH.keras as a Keras model file (keras.models.load_model), any other PATH "
        "as a TensorFlow SavedModel (tf.saved_model.load).",
    ),
    click.option(
        "--verbose",
        is_flag=True,
        help="Also show TensorFlow's own C++ logs (kept off the terminal otherwise, "
        "unless TF_CPP_MIN_LOG_LEVEL is set).",
    ),
    click.option(
        "--debug",
        is_flag=True,
        help="On an error in your own model, loss, reducer or pipeline, also print "
        "its traceback (your frames). Also: TOWER_TRAIN_DEBUG=1.",
    ),
]
