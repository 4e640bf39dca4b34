"""The distributed training loop: build, run updates, report steps, checkpoint.

The Trainer builds data, model, optimizer and gradient accumulators under a
MirroredStrategy; the update itself is traced by ``update_graph.UpdateGraph``.
train.steps_per_execution updates run inside one tf.function call, and every update's
timings still come out as its own step. Under MultiWorkerMirroredStrategy each worker
runs this same loop and reports its own loss and timings, but examples and the data
position are the whole update's, so they agree everywhere; the workers agree on stopping
at each execution boundary and on the step they resume from (``cluster.Agreement``).
Live settings apply at an execution boundary when the supervisor sends ``reconfigure``
(``live_settings.py``); in a cluster every worker applies the same request after the
same update, or none does.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer_runtime.cluster import Agreement
from trainer_runtime.data import batch_mismatch, input_options, make_dataset_fn
from trainer_runtime.devices import Devices
from trainer_runtime.factories import FactoryError
from trainer_runtime.live_settings import LiveSettings, reconfigure, too_late
from trainer_runtime.models import build_model
from trainer_runtime.protocol import Checkpoint, Resume, Step
from trainer_runtime.schema import RunConfig, per_replica_batch
from trainer_runtime.teardown import PipelineReaper
from trainer_runtime.telemetry import NullEmitter, ReconfigureRequest, SocketEmitter
from trainer_runtime.update_graph import UpdateGraph

log = logging.getLogger("trainer_runtime")
# What a person can do about a checkpoint that cannot be restored (a resume needs it).
START_OVER = "a new run (gpuwatch train with these settings) starts over without it"


class ResumeError(Exception):
    """A cluster worker cannot restore the step the workers agreed on (exit 2, config)."""


@dataclass
class StopFlags:
    """Set from signal handlers / other threads; read by the loop between executions."""

    sigterm: threading.Event = field(default_factory=threading.Event)

    def install(self) -> None:
        def handler(signum: int, frame: Any) -> None:
            self.sigterm.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


def _schedule(cfg: RunConfig) -> Any:
    lr = cfg.train.learning_rate
    if cfg.train.lr_schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(lr, cfg.train.lr_decay_steps)
    if cfg.train.lr_schedule == "step":
        # Halve every decay_steps / 4 updates.
        every = max(1, cfg.train.lr_decay_steps // 4)
        bounds = [every * i for i in range(1, 8)]
        values = [lr * 0.5**i for i in range(8)]
        return keras.optimizers.schedules.PiecewiseConstantDecay(bounds, values)
    return lr


def _optimizer(cfg: RunConfig) -> keras.optimizers.Optimizer:
    schedule = _schedule(cfg)
    opt: keras.optimizers.Optimizer
    if cfg.train.optimizer == "sgd":
        opt = keras.optimizers.SGD(learning_rate=schedule)
    else:
        opt = keras.optimizers.Adam(learning_rate=schedule)
    if cfg.train.mixed_precision == "mixed_float16":
        opt = keras.optimizers.LossScaleOptimizer(opt)
    return opt


WHY_NOT_SAVED = "why-not-saved.txt"


class PipelineCheckpoint:
    """A factory dataset's tf.data iterators, saved beside each checkpoint where tf.data can.

    tf.distribute's DistributedIterator is not trackable (TF 2.21: "Checkpoint was
    expecting iterator to be a trackable object"), but the per-pipeline tf.data
    iterators inside it are. Each is saved as ``pipeline_<i>`` in
    ``checkpoints/data/data-<step>``, with the batch layout it was built for; a
    resume restores them only under the same layout. Anything else (a pipeline
    tf.data cannot serialise, a changed batch, no saved state) restarts the data
    order, and the resume event says so and why.
    """

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.dir = (os.path.join(trainer.run_dir, "checkpoints", "data")
                    if trainer.run_dir and trainer.cfg.checkpoint.enabled else None)
        self.broken: str | None = None
        self._ckpt: tf.train.Checkpoint | None = None
        self._layout = tf.Variable(self._current_layout(), dtype=tf.int64, trainable=False,
                                   name="pipeline_layout")

    def _current_layout(self) -> list[int]:
        return [self.trainer.replicas, self.trainer.per_replica_batch]

    def _checkpoint(self) -> tf.train.Checkpoint:
        if self._ckpt is None:
            workers = getattr(self.trainer.iterator, "_iterators", None) or []
            inner = [getattr(worker, "_iterator", None) for worker in workers]
            if not inner or any(it is None for it in inner):
                raise ValueError("tf.distribute does not expose the tf.data iterators here")
            self._ckpt = tf.train.Checkpoint(
                layout=self._layout, **{f"pipeline_{i}": it for i, it in enumerate(inner)})
        return self._ckpt

    def _prefix(self, step: int) -> str:
        assert self.dir is not None
        return os.path.join(self.dir, f"data-{step}")

    def write(self, step: int) -> None:
        """Save the iterators as they stand at `step`. Called before the model's checkpoint
        of that step: a ckpt-<step> on disk then always has its data-<step>, whenever the
        process is killed (the other order left, after a SIGKILL between the two, a
        checkpoint whose resume restarted the data order)."""
        if self.dir is None or self.broken:
            return
        try:
            os.makedirs(self.dir, exist_ok=True)
            self._checkpoint().write(self._prefix(step))
        except Exception as exc:  # tf.data refuses some pipelines (e.g. external state)
            self.broken = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            log.warning("the data factory's pipeline cannot be checkpointed: %s", self.broken)
            with contextlib.suppress(OSError), open(
                os.path.join(self.dir, WHY_NOT_SAVED), "w", encoding="utf-8"
            ) as fh:
                fh.write(self.broken)

    def prune(self, kept: list[str]) -> None:
        """Remove the saved iterators of checkpoints no longer kept (after the model's save)."""
        if self.dir is None or self.broken:
            return
        keep = {f"data-{path.rsplit('-', 1)[-1]}" for path in kept}
        for name in os.listdir(self.dir):
            if name.split(".", 1)[0] not in keep and name.startswith("data-"):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.dir, name))

    def restore(self, step: int) -> str:
        """Restore the iterators saved at `step`; "" if done, else why the data restarts."""
        if self.dir is None or not os.path.exists(self._prefix(step) + ".index"):
            why = ""
            with contextlib.suppress(OSError, TypeError), open(
                os.path.join(str(self.dir), WHY_NOT_SAVED), encoding="utf-8"
            ) as fh:
                why = f" ({fh.read(300)})"
            return ("data order restarted: tf.data could not save the data factory's "
                    f"pipeline{why}")
        try:
            saved = tf.train.load_checkpoint(self._prefix(step)).get_tensor(
                "layout/.ATTRIBUTES/VARIABLE_VALUE").tolist()
            if saved != self._current_layout():
                return ("data order restarted: replicas x per-replica batch changed from "
                        f"{saved[0]} x {saved[1]}, so the factory's pipeline starts over")
            self._checkpoint().read(self._prefix(step)).expect_partial()
        except Exception as exc:
            return (f"data order restarted: the factory's pipeline could not be restored "
                    f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")
        return ""


class Trainer:
    """Builds data, model and optimizer under a (MultiWorker)MirroredStrategy and runs updates.

    `worker` of `workers`: this process's place in a cluster (0 of 1 on one host).
    `chief_dir`: the chief's run dir, where this worker can read it (resume).
    """

    def __init__(self, cfg: RunConfig, strategy: tf.distribute.Strategy,
                 devices: Devices, run_dir: str | None = None, attempt: int = 1,
                 emitter: SocketEmitter | NullEmitter | None = None,
                 worker: int = 0, workers: int = 1, chief_dir: str | None = None) -> None:
        self.cfg = cfg
        self.strategy = strategy
        self.devices = devices
        self.run_dir = run_dir
        self.attempt = attempt
        self.worker = worker
        self.workers = workers
        self.chief_dir = chief_dir
        self.multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        self.agreement = Agreement(strategy) if self.multi_worker else None
        # The step every worker resumed from (None: started fresh); save decisions use it.
        self.resumed_step: int | None = None
        self.emitter: SocketEmitter | NullEmitter = emitter or NullEmitter()
        self.step_frames = cfg.telemetry.enabled
        self.replicas = strategy.num_replicas_in_sync
        self.k = cfg.train.accumulation_steps
        self.per_replica_batch = per_replica_batch(cfg, self.replicas)
        self.global_batch = cfg.train.global_batch_size
        self.step = 0
        self.micro_step = 0
        # Examples trained on so far, over all attempts: the built-in data's position.
        self.position = 0
        self._last_end: float | None = None
        self._batch_checked = False
        self._iterator: Any = None
        self.dist_dataset: Any = None
        self.reaper = PipelineReaper()  # old input pipelines go there (drop_data)
        # train.max_steps given on the command line: kept over live settings.
        self.pinned_max_steps: int | None = None
        self.live = LiveSettings(self)  # settings changed between two updates
        self._build()

    # ----------------------------------------------------------------- build
    def _make_data(self, start_position: int) -> None:
        """The distributed dataset from `start_position` (built-in data); no iterator yet."""
        cfg = self.cfg
        dataset_fn = make_dataset_fn(cfg.data, cfg.train.seed, self.per_replica_batch,
                                     start_position)
        self.dist_dataset = self.strategy.distribute_datasets_from_function(
            dataset_fn, options=input_options(cfg.data, self.devices.kind, self.multi_worker))
        self._iterator = None

    def drop_data(self) -> None:
        """Forget the input pipeline: `iterator` makes it again, at the position then.

        The old pipeline is torn down on the reaper's thread: destroyed here, a
        pipeline a minute old held the training thread for up to a minute while
        its autotuner slept out its period (``teardown.py``).
        """
        box = [self._iterator, self.dist_dataset]
        self._iterator = None
        self.dist_dataset = None
        self.reaper.drop(box)  # box now holds the only references

    def restart_data(self) -> None:
        """The input pipeline again from the current position, its iterator made now."""
        self._make_data(self.position)
        _ = self.iterator  # made now: a live switch's cost is counted in the switch

    @property
    def iterator(self) -> Any:
        """The distributed iterator, made on first use: after restore() set the position.

        Made any earlier, a prefetching pipeline would start reading at position 0.
        """
        if self._iterator is None:
            if self.dist_dataset is None:
                self._make_data(self.position)
            self._iterator = iter(self.dist_dataset)
        return self._iterator

    def _build(self) -> None:
        cfg = self.cfg
        keras.mixed_precision.set_global_policy(cfg.train.mixed_precision)
        keras.utils.set_random_seed(cfg.train.seed)
        if cfg.data.factory is None:
            # The built-in data's shape is known; its pipeline waits for the position.
            input_shape = tuple(cfg.data.input_shape)
        else:
            self._make_data(0)
            spec = self.dist_dataset.element_spec[0]
            feature_spec = (getattr(spec, "_value_specs", [spec])[0]
                            if not hasattr(spec, "shape") else spec)
            input_shape = tuple(int(d) for d in feature_spec.shape[1:])
        self.input_shape = input_shape
        with self.strategy.scope():
            self.model = build_model(cfg.model, input_shape, cfg.data.classes)
            self.optimizer = _optimizer(cfg)
            # Keras 3 needs its optimizer variables before the first tf.function
            # traces, or the step fails on an unfed placeholder (FACTS.md).
            self.optimizer.build(self.model.trainable_variables)
        self.graph = self.make_update_graph(cfg.train.jit_compile)
        self.accumulators: list[tf.Variable] = self.graph.accumulators
        self.param_count = int(sum(np.prod(v.shape) for v in self.model.trainable_variables))
        self.param_bytes = int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize
                                   for v in self.model.trainable_variables))
        r = self.replicas
        self.grad_sync_bytes = int(self.param_bytes * 2 * (r - 1) / r) if r > 1 else 0
        self._step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self._micro_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="micro_step")
        self._position_var = tf.Variable(-1, dtype=tf.int64, trainable=False, name="position")
        self.ckpt = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                        step=self._step_var, micro_step=self._micro_var,
                                        data_position=self._position_var)
        self._pipeline_ckpt = PipelineCheckpoint(self) if cfg.data.factory else None
        self.manager: tf.train.CheckpointManager | None = None
        if self.run_dir and self.cfg.checkpoint.enabled:
            self.manager = tf.train.CheckpointManager(
                self.ckpt, os.path.join(self.run_dir, "checkpoints"),
                max_to_keep=self.cfg.checkpoint.keep)
        if cfg.data.factory is None:
            self.examples_per_epoch = cfg.data.examples
        else:
            self.examples_per_epoch = 0

    def make_update_graph(self, jit_compile: bool, split: bool = True) -> UpdateGraph:
        """The update graph of the current batch split, with its own gradient accumulators;
        ``split=False``: the optimizer all-reduces (the fused path, untimed)."""
        accumulators: list[tf.Variable] = []
        if self.k > 1:
            with self.strategy.scope():
                accumulators = [
                    tf.Variable(tf.zeros(v.shape, dtype=v.dtype), trainable=False,
                                synchronization=tf.VariableSynchronization.ON_READ,
                                aggregation=tf.VariableAggregation.SUM,
                                name=f"grad_accum_{i}")
                    for i, v in enumerate(self.model.trainable_variables)
                ]
        return UpdateGraph(self.strategy, self.model, self.optimizer, accumulators,
                           self.k, self.global_batch, jit_compile, split)

    # --------------------------------------------------------------- running
    def concrete_update_fn(self) -> Any:
        """The traced one-update function (tests count its collectives)."""
        return self.graph.concrete_update_fn(self.iterator)

    def run_updates(self, n: int) -> list[Step]:
        """Run n optimizer updates (one tf.function call); emit and return their steps."""
        multi = n > 1 or self.cfg.train.steps_per_execution > 1
        fn = self.graph.function(multi)
        start = time.time()
        out = fn(self.iterator, tf.constant(n, tf.int32)) if multi else fn(self.iterator)
        ends, waits, losses, lrs, local_counts, computes, syncs, updates = (
            t.numpy() for t in out)
        split = self.graph.split  # the all-reduce timed apart from the update
        # Every worker reads the same batch per update: the whole update's examples,
        # the same on every worker, with no collective.
        counts = local_counts * self.workers
        if self._pipeline_ckpt is not None and not self._batch_checked:
            self._check_factory_batch(int(counts[0]))
        prev = self._last_end if self._last_end is not None else start
        steps = []
        for i in range(len(ends)):
            self.step += 1
            self.micro_step += self.k
            self.position += int(counts[i])
            end = float(ends[i])
            loss = float(losses[i])
            step = Step(
                attempt=self.attempt, step=self.step, micro_step=self.micro_step,
                epoch=self.epoch, loss=loss if math.isfinite(loss) else None,
                lr=float(lrs[i]), examples=int(counts[i]), position=self.position,
                step_time_ms=max(0.0, (end - prev) * 1000.0),
                input_wait_ms=float(waits[i]) * 1000.0,
                grad_sync_bytes=self.grad_sync_bytes, dropped=self.emitter.dropped,
                worker=self.worker, compute_ms=float(computes[i]) * 1000.0,
                sync_ms=float(syncs[i]) * 1000.0 if split else None,
                update_ms=float(updates[i]) * 1000.0 if split else None,
            )
            prev = end
            steps.append(step)
            if self.step_frames:
                self.emitter.emit(step, t=end)
        self._last_end = prev
        return steps

    def _check_factory_batch(self, examples: int) -> None:
        """The first update of a factory dataset holds the batch it was asked for, or exit 2."""
        self._batch_checked = True
        if examples != self.global_batch:
            assert self.cfg.data.factory is not None
            got = examples / (self.replicas * self.k)
            shown = int(got) if got == int(got) else round(got, 2)
            raise FactoryError(batch_mismatch(self.cfg.data.factory, shown,  # type: ignore[arg-type]
                                              self.per_replica_batch))

    def reset_timing(self) -> None:
        """Forget the last end time (after a pause that is not training time)."""
        self._last_end = None

    @property
    def epoch(self) -> int:
        if not self.examples_per_epoch:
            return 0
        return self.position // self.examples_per_epoch

    # ----------------------------------------------------------- checkpoints
    def restore(self, fresh: bool) -> Resume | None:
        """Restore the latest checkpoint (unless fresh); the `resume` event to send, or None."""
        if self.manager is None or fresh:
            return None
        if self.agreement is not None:
            return self._restore_agreed(self.agreement)
        if not self.manager.latest_checkpoint:
            return None
        path = self.manager.latest_checkpoint
        # expect_partial: a changed precision policy (LossScaleOptimizer or not)
        # leaves some saved optimizer values unused; that is fine.
        self.ckpt.restore(path).expect_partial()
        return self._after_restore(path)

    def _restore_agreed(self, agreement: Agreement) -> Resume | None:
        """Cluster resume: every worker restores the same step, or all stop.

        The chief's checkpoint is the real one; a worker reads it from the chief's run dir
        where it can, else its own scratch copy of the same step. The step is the chief's
        latest that every worker has: a worker killed while the chief saved may lack the
        newest (its scratch copy unwritten), and then the one before it is taken, rather
        than no resume at all (the chief keeps checkpoint.keep of them).
        """
        assert self.manager is not None and self.run_dir is not None
        kept = ([int(p.rsplit("-", 1)[-1]) for p in self.manager.checkpoints]
                if self.worker == 0 else [])
        candidates = agreement.chief(len(kept))  # the others add 0
        if candidates <= 0:
            return None
        dirs = [os.path.join(d, "checkpoints") for d in (self.chief_dir, self.run_dir) if d]
        agreed, path = _common_checkpoint(agreement, kept, candidates, dirs)
        problem = ""
        if path is None:
            where = " or ".join(dirs)
            problem = (f"worker {self.worker} has none of the chief's kept checkpoints (the "
                       f"last: step {agreed}) in {where}; {START_OVER}")
        else:
            try:
                self.ckpt.restore(path).expect_partial()
            except Exception as exc:
                problem = (f"worker {self.worker}: checkpoint {path} does not fit this model "
                           f"({' '.join(str(exc).split())[:300]}); {START_OVER}")
        # All or none: a worker that trained alone would block the others' collectives.
        if agreement.any(bool(problem)):
            raise ResumeError(problem or f"another worker could not restore step {agreed} "
                              f"(its own error names it); {START_OVER}")
        assert path is not None
        self.resumed_step = agreed
        return self._after_restore(path)

    def _after_restore(self, path: str) -> Resume:
        self.step = int(self._step_var.numpy())
        self.micro_step = int(self._micro_var.numpy())
        saved_position = int(self._position_var.numpy())
        note = ""
        if self._pipeline_ckpt is not None:
            # A factory dataset: its tf.data iterators, where they could be saved.
            self.position = max(0, saved_position)
            note = self._pipeline_ckpt.restore(self.step)
            if not note:
                # The restored pipeline was checked when it started; mid-epoch it may sit
                # on a short last batch, which is no sign of a wrong batch size.
                self._batch_checked = True
        elif saved_position < 0:
            note = "data order restarted: the checkpoint has no data position"
        else:
            self.position = saved_position
            self._make_data(self.position)
        return Resume(attempt=self.attempt, from_step=self.step,
                      from_micro_step=self.micro_step, checkpoint=path,
                      position=self.position, data_order="restarted" if note else "continued",
                      data_note=note, worker=self.worker)

    def save(self) -> tuple[str, float] | None:
        if self.manager is None:
            return None
        t0 = time.monotonic()
        self._step_var.assign(self.step)
        self._micro_var.assign(self.micro_step)
        self._position_var.assign(self.position)
        if self._pipeline_ckpt is not None:
            self._pipeline_ckpt.write(self.step)
        path = self.manager.save(checkpoint_number=self.step)
        if self._pipeline_ckpt is not None:
            self._pipeline_ckpt.prune(self.manager.checkpoints)
        seconds = time.monotonic() - t0
        self.emitter.emit(Checkpoint(attempt=self.attempt, step=self.step,
                                     micro_step=self.micro_step, path=path,
                                     seconds=round(seconds, 4), worker=self.worker))
        return path, seconds


def step_limit(cfg: RunConfig, examples_per_epoch: int, step: int = 0,
               position: int = 0) -> tuple[int | None, str]:
    """The optimizer-step count at which the run ends, and the done reason it gives.

    Epochs count examples (the data's position), so a batch changed on resume
    still ends the run after `train.epochs` passes over the data.
    """
    limit: int | None = cfg.train.max_steps
    reason = "max_steps"
    if cfg.train.epochs is not None and examples_per_epoch:
        left = max(0, cfg.train.epochs * examples_per_epoch - position)
        by_epochs = step + -(-left // cfg.train.global_batch_size)
        if limit is None or by_epochs < limit:
            limit, reason = by_epochs, "epochs"
    return limit, reason


def _local_stop(trainer: Trainer, flags: StopFlags) -> str | None:
    if flags.sigterm.is_set():
        return "sigterm"
    if trainer.emitter.lost:
        return "socket_lost"
    return None


def train(trainer: Trainer, flags: StopFlags) -> tuple[str, int]:
    """Run until a limit, SIGTERM or a lost socket; checkpoint; return (reason, step).

    In a cluster a stop on one worker stops all after the same step (agreed at the
    execution boundary); a worker that was not itself stopped says "sigterm".
    """
    cfg = trainer.cfg
    limit, limit_reason = step_limit(cfg, trainer.examples_per_epoch, trainer.step,
                                     trainer.position)
    spe = cfg.train.steps_per_execution
    every = cfg.checkpoint.every_steps
    last_saved = trainer.step
    saved = False
    reason = limit_reason
    pending: ReconfigureRequest | None = None
    while True:
        if limit is not None and trainer.step >= limit:
            reason = limit_reason
            break
        local = _local_stop(trainer, flags)
        if pending is None:
            pending = trainer.emitter.take_request()
        expired = pending is not None and pending.expired
        ready = pending is not None and not expired and trainer.step >= pending.at_step
        late_elsewhere = False
        if trainer.agreement is not None:
            # One collective per boundary: stop anywhere, whether every worker holds the
            # same request ready (ids summed: all equal means W x id), and whether any
            # worker's request ran out of time (then every worker holding it drops it).
            ready_id = pending.id if (ready and pending is not None) else 0
            stops, readies, ids, lates = trainer.agreement.sums(
                [int(local is not None), int(ready), ready_id, int(expired)])
            if stops:
                reason = local or "sigterm"
                break
            ready = readies == trainer.workers and ids == trainer.workers * ready_id
            late_elsewhere = lates > 0 and not expired
        elif local is not None:
            reason = local
            break
        if pending is not None and (expired or late_elsewhere):
            # No collective in it: workers that never held the request run on in step.
            too_late(trainer, pending, here=expired)
            pending = None
        if ready and pending is not None:
            reconfigure(trainer, pending)
            pending = None
            limit, limit_reason = step_limit(trainer.cfg, trainer.examples_per_epoch,
                                             trainer.step, trainer.position)
            continue
        n = spe
        if limit is not None:
            n = min(n, limit - trainer.step)
        # End an execution on a checkpoint boundary so saves land on every_steps.
        n = min(n, every - trainer.step % every)
        trainer.run_updates(n)
        if trainer.step // every > last_saved // every:
            trainer.save()
            last_saved = trainer.step
            saved = True
    if trainer.agreement is not None:
        # The same decision on every worker (all must save together), then wait for
        # all: a worker that exits early would fail the others' last collectives.
        if trainer.step != last_saved or (not saved and trainer.resumed_step is None):
            trainer.save()
        trainer.agreement.any(False)
    elif (trainer.step != last_saved
          or (trainer.manager and not trainer.manager.latest_checkpoint)):
        trainer.save()
    return reason, trainer.step


def _common_checkpoint(agreement: Agreement, kept: list[int], candidates: int,
                       dirs: list[str]) -> tuple[int, str | None]:
    """The chief's newest kept step (its `kept`, others pass []) that every worker finds in
    one of its `dirs`, and this worker's path of it; the oldest step tried and None when
    no step of the `candidates` is everyone's. Every worker makes the same calls."""
    agreed, path = -1, None
    for back in range(candidates):  # newest first
        agreed = agreement.chief((kept[-1 - back] if kept else -1) + 1) - 1
        found = [c for d in dirs if os.path.exists((c := os.path.join(d, f"ckpt-{agreed}"))
                                                   + ".index")]
        path = found[0] if found else None
        if not agreement.any(path is None):
            break
    return agreed, path
