"""tower-train's flags: one per argument of towers.Trainer and its fit, plus
what only a command line needs (--data, --debug, --log-device-placement)."""

from __future__ import annotations

import click

from engine.core.options import OPTIMIZERS, VARIABLE_MODES
from engine.data.inspect import FORMATS
from engine.reducers.options import COMPRESSION_DTYPES
from towers.cli._run_flags import RUN_OPTIONS
from towers.data import DEFAULT_MNIST

__all__ = ["options"]

DEFAULT_DATA = DEFAULT_MNIST


def options(command):
    """Adds every tower-train flag to `command`."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


# `--help` shows the flags in these groups, in this order (towers.cli.common.GroupedCommand).
SECTIONS = {
    "Devices": ["devices", "gpu_memory", "reduce_device", "list_devices"],
    "Data": ["data_path", "data_format", "seq_len", "image_size", "num_classes",
             "synthetic_samples", "augment", "data_pipeline", "dali_threads", "prefetch"],
    "Model and loss": ["model", "from_logits", "optimizer", "learning_rate", "lr_schedule",
                       "warmup_epochs", "clip_norm", "label_smoothing",
                       "weight_decay", "ema", "init_weights", "seed"],
    "Training": ["batch_size", "accumulate", "epochs", "steps_per_epoch", "steps_per_loop",
                 "eval_steps", "skip_nonfinite", "deterministic", "metrics", "metrics_top_k",
                 "save_model"],
    "Reduction": ["reducer", "variables", "group_size", "pack_bytes", "compress", "topology",
                  "check_reducer", "check_replicas"],
    "Precision and speed": ["xla", "mixed_precision"],
    "Checkpoints": ["checkpoint_dir", "checkpoint_every", "keep_checkpoints", "keep_best",
                    "resume", "max_restarts"],
    "Placement log and profiling": ["placement_log", "strict_placement",
                                    "max_transfer_bytes", "log_device_placement", "logdir",
                                    "profile_steps"],
    "Cluster": ["cluster", "connect_timeout", "step_timeout"],
    "Output": ["verbose", "debug", "version", "help"],
}


_OPTIONS = [
    click.option(
        "--devices",
        default="all",
        show_default=True,
        help="Towers: GPU indices (0,1,2,3), 'all' (every GPU, else one CPU tower "
        "per core), 'cpu:N' (N logical CPU devices), 'gpu:N' (N logical GPUs of GPU 0), "
        "or names (/gpu:1,/cpu:0).",
    ),
    click.option(
        "--gpu-memory",
        default=None,
        type=int,
        help="With --devices gpu:N: MiB of GPU 0's memory for each logical GPU "
        "(default 4096).",
    ),
    click.option(
        "--reduce-device",
        default=None,
        help="Where variables live and gradients are averaged. Default: the first "
        "tower's GPU when every tower is a GPU (no weight or gradient crosses the "
        "host), else /cpu:0 (host memory every tower reaches alike).",
    ),
    click.option(
        "--data",
        "data_path",
        default=None,
        help=f"Directory with train/ (and val/). Default: real MNIST in {DEFAULT_DATA}, "
        "prepared on first use.",
    ),
    click.option(
        "--data-format",
        default="auto",
        show_default=True,
        type=click.Choice(["auto", *FORMATS]),
        help="caffe2 = LMDB, folder = one sub-folder per class, jpeg = class folders or "
        "train.txt/val.txt file lists, tfrecord = ImageNet-format TFRecords (DALI "
        "indices made when missing), text = a byte corpus for --model transformer "
        "(--data FILE, default the Python standard library's sources), synthetic = "
        "DALI-generated. Without --data, caffe2, jpeg and tfrecord read real MNIST "
        "written in that format.",
    ),
    click.option(
        "--seq-len",
        default=None,
        type=int,
        help="With --data-format text: bytes per sequence (default 128).",
    ),
    click.option(
        "--image-size",
        default=None,
        type=int,
        help="Decode and resize images to SIZE x SIZE. Default: the model's own size "
        "(32 for resnet20, 224 for resnet50), else as stored.",
    ),
    click.option(
        "--num-classes",
        default=None,
        type=int,
        help="Classes of --data-format synthetic (default 10), or of TFRecords "
        "without a meta.json.",
    ),
    click.option(
        "--synthetic-samples",
        default=None,
        type=int,
        help="With --data-format synthetic: a fixed set of N samples that every "
        "step draws from, which a model can memorise (a falling loss in a few "
        "steps even at 1000 classes). Default: every sample new.",
    ),
    click.option(
        "--augment/--no-augment",
        default=None,
        help="The standard ImageNet training augmentation (random resized crop, "
        "flip) and evaluation centre crop. Default: on for jpeg and tfrecord "
        "data, off for MNIST in any format.",
    ),
    click.option(
        "--data-pipeline",
        default=None,
        help="Your own DALI pipeline instead of --data: package.module:function taking "
        "one towers.data.Shard and returning a pipeline of (images, labels); "
        "28x28x1 images, 10 classes (docs: Data and your own pipeline).",
    ),
    click.option(
        "--model",
        default="mlp",
        show_default=True,
        help="mlp, lenet, resnet20 (CIFAR ResNet, 32x32x3), resnet50 (224x224x3), "
        "transformer[:layers=2,width=128,heads=4] (byte-level language model, with "
        "--data-format text), or package.module:function returning a Keras model.",
    ),
    click.option(
        "--from-logits",
        is_flag=True,
        help="Your --model outputs logits (no softmax at its end): the loss takes "
        "them as such, as Keras' from_logits=True. Without it, a model whose outputs "
        "are not probabilities is refused before the first step.",
    ),
    click.option(
        "--batch-size",
        default=64,
        show_default=True,
        type=int,
        help="Samples per tower per step.",
    ),
    click.option(
        "--accumulate",
        default=1,
        show_default=True,
        type=int,
        help="Gradient accumulation: batches per tower per step, run in turn; their "
        "mean gradient goes to one reduction and update, as one batch of "
        "K x --batch-size would (BatchNorm aside).",
    ),
    click.option(
        "--ema",
        default=0.0,
        type=float,
        metavar="MOMENTUM",
        help="Average the weights (an exponential moving average with this momentum, "
        "0.999 typical; Keras' use_ema): evaluation, checkpoints, the best checkpoint "
        "and --save-model use the averages.",
    ),
    click.option("--epochs", default=5, show_default=True, type=int,
                 help="Epochs to train in all (a resumed run trains up to this many)."),
    click.option(
        "--steps-per-epoch",
        default=None,
        type=int,
        help="Default: one pass over the training set.",
    ),
    click.option(
        "--steps-per-loop",
        default=None,
        type=int,
        help="Training steps per call of the compiled step: the host dispatches, "
        "and looks at progress, checkpoints and signals, once per K steps; every "
        "step is still reported and guarded as its own. Default: 25 on GPU towers "
        "(fewer where --checkpoint-every needs), 1 on CPU towers.",
    ),
    click.option(
        "--eval-steps",
        default=None,
        type=int,
        help="Held-out batches per tower after each epoch; 0 skips. "
        "Default: the whole held-out set once.",
    ),
    click.option(
        "--optimizer",
        default="adam",
        show_default=True,
        type=click.Choice(list(OPTIMIZERS)),
        help="The Keras optimizer (momentum: SGD with momentum 0.9).",
    ),
    click.option(
        "--lr",
        "learning_rate",
        default=None,
        type=float,
        help="Learning rate. Default: the optimizer's rate for a batch of 32 "
        "(adam, rmsprop 0.001; sgd, momentum 0.01) scaled to the global batch: "
        "by its square root for adam and rmsprop, linearly for sgd.",
    ),
    click.option(
        "--lr-schedule",
        default="constant",
        show_default=True,
        help="How the learning rate moves after the warm-up: constant, "
        "step:EPOCHS:FACTOR (step:30:0.1: times 0.1 every 30 epochs), cosine or "
        "poly[:POWER] (to 0 at the last step). Counted in updates: a resumed run "
        "goes on along the same curve.",
    ),
    click.option(
        "--warmup-epochs",
        default=0.0,
        show_default=True,
        type=float,
        help="Epochs of linear warm-up to --lr (Goyal et al.), before the schedule; "
        "shorter than --epochs.",
    ),
    click.option(
        "--clip-norm",
        default=None,
        type=float,
        help="Clip the gradients to this global norm after the reduction (every copy "
        "applies the same clipped mean); the norm before clipping goes to --logdir.",
    ),
    click.option(
        "--label-smoothing",
        default=0.0,
        show_default=True,
        type=float,
        help="Label smoothing of the default loss (0.1 in the ResNet-50 recipes); "
        "eval_loss is smoothed too.",
    ),
    click.option(
        "--weight-decay",
        default=0.0,
        show_default=True,
        type=float,
        help="Decoupled weight decay (as AdamW, SGDW) on the weights of two or more "
        "dimensions; none on biases and normalisation scales and offsets.",
    ),
    click.option(
        "--init-weights",
        default=None,
        metavar="PATH",
        help="Start from these weights: a .keras file (--save-model) or a checkpoint "
        "(a --checkpoint-dir, or its ckpt-N) of the same model; the optimizer starts "
        "afresh.",
    ),
    click.option("--seed", default=0, show_default=True, type=int,
                 help="Seeds model initialisation, dropout and DALI's shuffling."),
    click.option(
        "--metrics",
        "metrics",
        default=None,
        help="Append one JSON line per epoch to this file.",
    ),
    click.option(
        "--metrics-top-k",
        default=None,
        type=int,
        help="Also report top-K accuracy (top5_accuracy for 5); 0 for none. "
        "Default: 5 for data of 100 classes or more.",
    ),
    click.option(
        "--reducer",
        default="central",
        show_default=True,
        help="How gradients are averaged: central (on --reduce-device), ring, "
        "tree, hierarchical, collective, nccl (GPU only); with state: "
        "topk[:ratio=0.01], powersgd[:rank=2,start_after=0], signsgd, "
        "localsgd[:every=8] (with --variables replicated); auto (per gradient, "
        "the one the cost model predicts fastest; see --topology); or "
        "package.module:function or :Class (docs: Reducers, for the contract).",
    ),
    click.option(
        "--variables",
        "variables",
        default="reduce-device",
        show_default=True,
        type=click.Choice(VARIABLE_MODES),
        help="One copy of the variables on --reduce-device, or a copy per tower.",
    ),
    click.option(
        "--group-size",
        default=None,
        type=int,
        help="Towers per group for --reducer hierarchical (default 2), at most the "
        "towers.",
    ),
    click.option(
        "--pack-bytes",
        default=0,
        show_default=True,
        type=int,
        help="Fuse gradients into buffers of about this many bytes before "
        "reducing; 0 reduces each gradient alone.",
    ),
    click.option(
        "--compress",
        default=None,
        type=click.Choice(COMPRESSION_DTYPES),
        help="Move gradients in this dtype, casting back after the transfer.",
    ),
    click.option(
        "--topology",
        default=None,
        metavar="FILE",
        help="With --reducer auto: the costs it chooses by, a file from "
        "tower-reduce-bench --fit-links or a built-in's name. Default: measured "
        "on the run's devices at start-up.",
    ),
    click.option(
        "--check-reducer",
        is_flag=True,
        help="Before the first step, compare the reducer's result with the exact "
        "mean on gradients of the model's shapes; stop with the factor if they differ.",
    ),
    click.option(
        "--check-replicas",
        default=0,
        show_default=True,
        type=int,
        help="With --variables replicated, compare the copies every K steps "
        "and stop if they drift apart.",
    ),
    *RUN_OPTIONS,
]
