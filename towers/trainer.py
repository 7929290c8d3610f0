"""`Trainer`: explicit towers, one DALI shard each, the reduction you choose, from Python.

`tower-train` is a thin layer over this class: it parses flags into these
arguments and calls `fit`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO

from engine.errors import UsageError
from engine.run import weights
from engine.topology import devices as devs
from towers import data as sources
from towers import models
from towers._trained import TrainerBase

if TYPE_CHECKING:
    import keras
    from keras.optimizers.schedules import LearningRateSchedule

    from engine.cost.topology import Topology
    from towers.callbacks import Callback

__all__ = ["Trainer"]


class Trainer(TrainerBase):
    """Builds one tower per device and trains them with a custom step.

    Making a Trainer does the process-wide set-up (splitting the host CPU or
    GPU 0 into logical devices, TensorFlow's threads, the cluster), checks
    every argument and the data, and finds the devices. Towers are built by
    the first `fit` or `evaluate`, and later calls go on with them.

    Args:
      devices: the towers: `"all"` (every GPU, else one CPU tower per core),
        `"cpu:N"` (N logical CPU devices), `"gpu:N"` (N logical GPUs of GPU
        0), GPU indices `"0,1"`, or device names (`["/gpu:0", "/gpu:1"]`).
      model: `"mlp"`, `"lenet"`, `"package.module:function"`, or a function
        of (input_shape, num_classes) returning a keras.Model.
      optimizer: `"adam"`, `"sgd"`, `"momentum"`, `"rmsprop"`, or a function
        returning a new Keras optimizer, called once per variable copy
        (`lambda: keras.optimizers.SGD(0.1, momentum=0.9)`; an optimizer
        object is refused: it would be shared, and made before the Trainer
        it starts TensorFlow too early).
      learning_rate: for a named optimizer; default: its rate for a batch of
        32 scaled to the global batch (square root for adam and rmsprop,
        linearly for sgd and momentum).
      lr_schedule: how a named optimizer's rate moves after the warm-up:
        `"constant"`, `"step:EPOCHS:FACTOR"` (`"step:30:0.1"`: times 0.1
        every 30 epochs), `"cosine"` or `"poly[:POWER]"` (to 0 at the last
        step), or your own
        `keras.optimizers.schedules.LearningRateSchedule` or function of
        the update count. The rate is in the metrics, TensorBoard and
        callbacks' logs; a resumed run goes on along the same curve.
      warmup_epochs: epochs of linear warm-up to the learning rate (Goyal et
        al.), before the schedule's shape; shorter than the run.
      clip_norm: clip the gradients to this global norm after the reduction,
        so every copy applies the same clipped mean; the norm before
        clipping is in TensorBoard (`train/grad_norm`) and callbacks' logs.
      label_smoothing: the default loss's label smoothing (0.1 in the
        ResNet-50 recipes); the held-out loss is smoothed too, as in Keras.
      weight_decay: decoupled weight decay of a named optimizer (as AdamW
        and SGDW), on the weights of two or more dimensions; biases and
        normalisation scales and offsets are not decayed (the header says so).
      metrics_top_k: also report top-k accuracy (`top5_accuracy` for 5) in
        the progress lines, the metrics, TensorBoard and callbacks' logs; 0
        for none. Default: 5 for data of 100 classes or more, else none.
      accumulate: gradient accumulation: each step, every tower runs this
        many batches of `batch_size` in turn and their mean gradient goes
        to the one reduction and update, as one batch of
        `accumulate * batch_size` would (BatchNorm aside: it normalises by
        each batch's own statistics). An epoch has that many times fewer
        steps, and the default learning rate scales with the larger batch.
      ema: average the weights (an exponential moving average with this
        momentum, as Keras optimizers' `use_ema`/`ema_momentum`; 0.999 is
        typical): evaluation, checkpoints, the best checkpoint and `save`
        use the averaged weights, and a resumed run goes on with both.
      init_weights: start from these weights instead of new ones: a `.keras`
        file (`save`, `--save-model`) or a checkpoint of this engine (a
        `checkpoint_dir`, its newest, or one `ckpt-N` in it) of the same
        model; the optimizer starts afresh. A resumed run's checkpoint wins.
      loss: None (cross-entropy of softmax outputs), a `keras.losses.Loss`
        such as `SparseCategoricalCrossentropy(from_logits=True)`, or a
        function of (labels, outputs) giving one value per sample.
      from_logits: the default loss takes logits (outputs before softmax),
        as Keras' `SparseCategoricalCrossentropy(from_logits=True)`. Without
        it, a model whose outputs are not probabilities is refused before
        the first step.
      data: a `towers.data` source; default `towers.data.mnist()`.
      batch_size: samples per tower per step.
      image_size: decode and resize images to image_size x image_size;
        default: the model's own size (the ResNets'), else as stored.
      augment: the standard ImageNet training augmentation and evaluation
        crop (`engine.data.DataOptions`); default: as the data says (on
        for JPEG and TFRecord data, off for MNIST in any format).
      reducer: `"central"`, `"ring"`, `"tree"`, `"hierarchical"`,
        `"collective"`, `"nccl"`; a reducer with state with its parameters,
        `"topk:ratio=0.01"`, `"powersgd:rank=2,start_after=0"`, `"signsgd"`,
        `"localsgd:every=8"`; `"auto"` (each gradient to the built-in the
        cost model predicts fastest, see `topology`);
        `"package.module:function"` (or `:Class` of a
        `towers.reducers.StatefulReducer`); a function of (tower_grads,
        devices, destinations) returning the mean for each destination
        (docs: Guides, Reducers); or a StatefulReducer object (docs:
        Guides, Reducers with state), whose state is saved in checkpoints.
      variables: `"reduce-device"` (one copy) or `"replicated"` (one per tower).
      reduce_device: where variables live and gradients meet; default: the
        first tower's GPU when every tower is a GPU, else /cpu:0.
      group_size: towers per group for `reducer="hierarchical"` (default 2),
        at most the towers; refused with another reducer.
      pack_bytes: fuse gradients into buffers of about this many bytes,
        last layer first, so that reduction overlaps the backward pass.
      compress: `"fp16"` or `"bf16"`: move gradients in that dtype.
      topology: with `reducer="auto"`, the costs it chooses by: a topology
        file (`tower-reduce-bench --fit-links`), a built-in's name
        (`towers.cost.builtin_topologies()`) or a `towers.cost.Topology`;
        default: measured on the run's devices at start-up.
      mixed_precision: True for bfloat16 on CPU towers and float16 with loss
        scaling on GPUs, or the dtype by name: `"float16"` (GPUs) or
        `"bfloat16"` (GPUs and CPUs, no loss scaling).
      xla: compile with XLA: one GPU tower whose variables live on it is
        compiled whole (forward to update), other towers each their forward
        and backward (with `variables="replicated"`). Default (None): on
        exactly where the whole step compiles on a GPU.
      seed: model initialisation, dropout and DALI's shuffling.
      deterministic: TensorFlow op determinism (process-wide).
      gpu_memory: MiB per logical GPU with `devices="gpu:N"`.
      dali_threads: DALI threads per tower pipeline; default: half the
        host's cores over GPU towers, a quarter over CPU towers.
      prefetch: DALI's prefetch queue depth per tower pipeline.
      cluster: `"chief=h1:2223;worker=h1:2222,h2:2222"` for remote towers
        (`"worker=127.0.0.1:2222"` for workers on this host); default
        TF_CONFIG's cluster, if set.
      connect_timeout: seconds to wait at start for every cluster task.
      step_timeout: seconds one step may take, with a cluster, before the
        run stops and names the tasks that do not answer.
      check_reducer: before the first step, compare the reducer's result
        with the exact mean on gradients of the model's shapes, and stop
        with the measured factor when they differ.
      log_device_placement: TensorFlow's own log of every op's device, on
        stderr (the raw material of `fit(placement_log=...)`).
      stream: where the layout, progress and summaries go (stdout).

    Raises:
      UsageError: (or a subclass: DeviceError, DataError, ModelError,
        ReducerError, ClusterError) naming the argument, the value and the
        fix; nothing has been written.
    """

    def __init__(
        self,
        devices: str | Sequence[str] = "all",
        *,
        model: str | Callable = "mlp",
        optimizer: str | Callable = "adam",
        learning_rate: float | None = None,
        lr_schedule: str | LearningRateSchedule | Callable[[int], float] = "constant",
        warmup_epochs: float = 0.0,
        clip_norm: float | None = None,
        label_smoothing: float = 0.0,
        weight_decay: float = 0.0,
        metrics_top_k: int | None = None,
        accumulate: int = 1,
        ema: float = 0.0,
        init_weights: str | None = None,
        loss: keras.losses.Loss | Callable | None = None,
        from_logits: bool = False,
        data: sources.Source | None = None,
        batch_size: int = 64,
        image_size: int | None = None,
        augment: bool | None = None,
        reducer: str | Callable = "central",
        variables: str = "reduce-device",
        reduce_device: str | None = None,
        group_size: int | None = None,
        pack_bytes: int = 0,
        compress: str | None = None,
        topology: str | Topology | None = None,
        mixed_precision: bool | str = False,
        xla: bool | None = None,
        seed: int = 0,
        deterministic: bool = False,
        gpu_memory: int | None = None,
        dali_threads: int | None = None,
        prefetch: int = 2,
        cluster: str | None = None,
        connect_timeout: float = 60.0,
        step_timeout: float = 300.0,
        check_reducer: bool = False,
        log_device_placement: bool = False,
        stream: TextIO | None = None,
    ):
        from engine.core import schedules
        from engine.core.options import ModelOptions, refuse_optimizer_object
        from engine.run import plan
        from engine.run import session as session_lib
        from towers import _arguments
        from towers.models import pairing

        refuse_optimizer_object(optimizer)
        if isinstance(data, str):
            raise UsageError(f"<data> {data!r} is a path; give towers.data.directory({data!r}) "
                             f"(or towers.data.text({data!r}) for a text corpus)")
        _arguments.check(Trainer.__init__, locals())
        self.stream = stream or sys.stdout
        self.init_weights = init_weights
        if init_weights is not None:
            weights.check_path(init_weights)
        self.check_reducer = check_reducer
        self.stop_training = False
        if not isinstance(devices, str):
            devices = ",".join(devices)
        # Everything that needs no TensorFlow is checked first, so that bad
        # arguments are refused in a fraction of a second.
        request = devs.parse_request(devices, reduce_device, gpu_memory)
        cluster_options = session_lib.cluster_options(cluster, connect_timeout, request)
        plan.check_numbers(batch_size=batch_size, dali_threads=dali_threads,
                           prefetch=prefetch, step_timeout=step_timeout,
                           image_size=image_size, xla=xla, deterministic=deterministic)
        reducer_options = plan.reducer_options(reducer, group_size=group_size,
                                                pack_bytes=pack_bytes, compress=compress,
                                                topology=topology)
        model_options = ModelOptions(
            model=models.builder(model), model_name=models.model_name(model),
            optimizer=optimizer, learning_rate=1e-3 if learning_rate is None else learning_rate,
            loss=loss, from_logits=from_logits, seed=seed, variables=variables,
            schedule=schedules.of(lr_schedule, warmup_epochs), clip_norm=clip_norm,
            label_smoothing=label_smoothing, weight_decay=weight_decay,
            metrics_top_k=metrics_top_k, accumulate=accumulate, ema=ema,
        )
        source = data or sources.mnist()
        pairing.check_image_size(image_size, source)
        # Data the user named is checked before TensorFlow starts; MNIST that
        # is still to be prepared waits until the devices are known to be good.
        info = source.inspect(self._say) if source.is_prepared else None
        pairing.check_pairing(model, source, info)
        self._before_tensorflow()
        session = session_lib.open_session(
            request, cluster=cluster_options, step_timeout=step_timeout,
            deterministic=deterministic, log_device_placement=log_device_placement,
            collective_towers=(devs.expected_tower_count(request)
                               if reducer_options.builtin == "collective" else None),
            say=self._say, warn=self._warn, advice=self._resume_advice, on_lost=self._on_lost,
        )
        self.placement, self.watchdog = session.placement, session.watchdog
        self.info = info or source.inspect(self._say)
        towers = len(self.placement.towers)
        plan.check_data_fits(self.info, towers, batch_size, accumulate)
        plan.check_groups(reducer_options, towers)
        self.cluster = cluster_options
        self.options = plan.run_options(
            self.placement, self.info, source,
            pairing.image_shape(source, self.info, model, image_size), model_options,
            reducer_options,
            learning_rate=learning_rate, batch_size=batch_size, mixed_precision=mixed_precision,
            xla=xla, dali_threads=dali_threads, prefetch=prefetch, augment=augment,
            deterministic=deterministic,
            reduce_device_given=reduce_device is not None,
        )
        self.built = None
        self.checkpoint_dir = None
        self._checkpointing = None  # whether the built pipelines can be saved

    def fit(
        self,
        epochs: int = 5,
        steps_per_epoch: int | None = None,
        *,
        steps_per_loop: int | None = None,
        eval_steps: int | None = None,
        metrics: str | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 0,
        keep_checkpoints: int = 3,
        keep_best: str | None = None,
        resume: bool = False,
        placement_log: str | None = None,
        strict_placement: bool = False,
        max_transfer_bytes: int | None = None,
        logdir: str | None = None,
        profile_steps: tuple[int, int] | None = None,
        skip_nonfinite: bool = False,
        check_replicas: int = 0,
        verbose: int = 1,
        callbacks: Sequence[Callback] = (),
        placement_summary: bool = False,
    ) -> list[dict]:
        """Trains until `epochs` epochs are done in all (a resumed or continued
        run counts the epochs it had), evaluating after each.

        Args:
          epochs: the epoch to train up to.
          steps_per_epoch: default: one pass over the training set (100 steps
            for data of unknown size).
          steps_per_loop: steps per call of the compiled step; the host
            dispatches once per call. Default: 25 on GPU towers (or the
            largest count below that divides `checkpoint_every` and
            `check_replicas`), 1 on CPU towers. Every step is reported
            (callbacks, TensorBoard, the non-finite guard) as its own
            whatever it is; checkpoints and signals act between calls.
          eval_steps: held-out batches per tower after each epoch; 0 skips;
            default: the whole held-out set once.
          metrics: append one JSON line per epoch to this file.
          checkpoint_dir: save at the end of every epoch (and every
            `checkpoint_every` steps) here.
          checkpoint_every: also save every this many steps.
          keep_checkpoints: keep the newest this many.
          keep_best: also keep the checkpoint of the epoch with the best
            value of this figure (`eval_accuracy`, `eval_loss`,
            `eval_top5_accuracy`, `accuracy`, `loss`; Keras' `val_accuracy`
            and `val_loss` too) in `checkpoint_dir`/best, with best.json
            saying which epoch it is; `save(path, best=True)` writes its model.
          resume: go on from the newest good checkpoint in checkpoint_dir.
          placement_log: write where every op of the first train and eval
            steps ran, and what crossed devices, to this JSON Lines file.
          strict_placement: stop after the first step if a tower op strayed.
          max_transfer_bytes: stop after the first train step if it moved
            more bytes between devices than this.
          logdir: TensorBoard scalars here.
          profile_steps: (A, B): a profiler trace of global steps A to B in logdir.
          skip_nonfinite: skip (and count) steps with a non-finite loss or
            gradient instead of stopping.
          check_replicas: with replicated variables, compare the copies every
            this many steps.
          verbose: as Keras' `fit`: 0 silent, 1 the header and a live
            progress bar, 2 the header and one line per epoch. Warnings are
            printed whatever it is.
          callbacks: `towers.callbacks.Callback` objects, called after every
            step (`on_train_batch_end`) and epoch with its record
            (`on_epoch_end(epoch, logs)`, epoch counted from 0 as in Keras);
            one may stop the run
            (`towers.callbacks.EarlyStopping`).
          placement_summary: with `placement_log`, print the summary of
            where the ops ran and what crossed devices at the end (the CLI
            does); `towers.placement.summary(towers.placement.load(path))`
            gives it later.

        Returns:
          One record per epoch trained here: loss, accuracy, eval_loss,
          eval_accuracy, images_per_sec, ... (loss and accuracy None for an
          epoch none of whose steps updated: all skipped or loss-scale
          overflows). The first epoch of a `fit` times its images/s from its
          second step on: the first traces the step and, after a resume,
          waits for the readers to be restored (`seconds` counts it).

        Raises:
          UsageError: a bad argument, naming it; nothing has been written.
          RunError: the run could not go on (a subclass names why:
            NonFiniteError, StrayPlacementError, TransferBudgetError,
            ReplicaDriftError, CheckpointError).
        """
        # fit's own arguments, as given: the loop's options are made of all
        # but how it reports (verbose, callbacks, the placement summary).
        arguments = dict(locals())
        from engine.run import choices, plan
        from engine.run import train as train_lib
        from engine.run.outputs import OutputError
        from towers import _arguments
        from towers import callbacks as callbacks_lib

        _arguments.check(Trainer.fit, arguments)
        if verbose not in (0, 1, 2):
            raise UsageError(f"<verbose> ({verbose!r}) is not one of 0, 1, 2")
        loop = {k: v for k, v in arguments.items()
                if k not in ("self", "verbose", "callbacks", "placement_summary")}
        options = plan.fit_options(
            self.options.reducer, self.options.model.variables, self.info,
            len(self.placement.towers), self.cluster, run=self.options,
            gpus=choices.gpu_towers(self.placement), **loop)
        watcher = callbacks_lib.watcher(callbacks, self, options.loop.steps_per_epoch)
        if self.built is not None and options.data.checkpointing != self._checkpointing:
            raise UsageError(
                "<checkpoint_dir>: this Trainer's pipelines were built by an earlier call "
                f"{'with' if self._checkpointing else 'without'} checkpoints; make a new "
                "Trainer to change that"
            )
        self.checkpoint_dir = checkpoint_dir
        self.stop_training = False
        self._build(options)
        watcher.begin()
        try:
            history = train_lib.train(
                self.placement, options, self.info, self.stream, self._stop, self.watchdog,
                self.built, voice=self._voice(verbose), verbose=verbose, watchers=(watcher,),
                placement_summary=placement_summary,
            )
        except OutputError as err:  # how to go on, in the caller's terms
            if err.checkpoint is None:
                raise
            raise type(err)(f"{err.message}, then resume with: {self._resume_hint}",
                            err.checkpoint) from None
        watcher.end(history)
        return history
