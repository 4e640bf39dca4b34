"""Live settings in the trainer: a ``reconfigure`` request checked, applied between two updates.

Only ``changes.LIVE_KEYS`` change live (the input pipeline's knobs, the global batch and
accumulation): the input pipeline is rebuilt from the current data position, and for a
new batch split the accumulators and the update graph too; the model, the optimizer, the
step and the position carry on. Any other change is refused (it needs a relaunch), and
so is any live change to a data factory's pipeline (its data order would restart). In a
cluster every worker applies the same request after the same update, or none does.
``LiveSettings`` (the Trainer's ``live`` part) keeps the update graph of every batch
split used, so switching back and forth grows nothing. The loop imports this module,
never the reverse: what it uses of the trainer is ``LiveTrainer``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from trainer_runtime.changes import LIVE_KEYS, live_changes
from trainer_runtime.cluster import Agreement
from trainer_runtime.protocol import Reconfigured
from trainer_runtime.schema import RunConfig, divisibility_error, per_replica_batch
from trainer_runtime.telemetry import NullEmitter, ReconfigureRequest, SocketEmitter
from trainer_runtime.update_graph import UpdateGraph

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger("trainer_runtime")


class LiveTrainer(Protocol):
    """The trainer as live settings use it: ``loop.Trainer`` is one."""

    # What a switch changes: the settings, the batch split and its update graph.
    cfg: RunConfig
    k: int
    global_batch: int
    per_replica_batch: int
    graph: UpdateGraph
    accumulators: list[tf.Variable]

    @property
    def live(self) -> LiveSettings: ...

    @property
    def attempt(self) -> int: ...

    @property
    def worker(self) -> int: ...

    @property
    def replicas(self) -> int: ...

    @property
    def step(self) -> int: ...

    @property
    def pinned_max_steps(self) -> int | None: ...

    @property
    def agreement(self) -> Agreement | None: ...

    @property
    def emitter(self) -> SocketEmitter | NullEmitter: ...

    def drop_data(self) -> None: ...

    def restart_data(self) -> None: ...

    def reset_timing(self) -> None: ...

    def make_update_graph(self, jit_compile: bool) -> UpdateGraph: ...


class LiveSettings:
    """A Trainer's settings changed in place, and the update graphs of the batch splits it used."""

    def __init__(self, trainer: LiveTrainer) -> None:
        self.trainer = trainer
        # Update graphs of batch splits used before, by (accumulation, global batch):
        # switching back reuses their traces and accumulators instead of adding more.
        self.graphs: dict[tuple[int, int], UpdateGraph] = {}

    def check(self, settings: dict[str, Any]) -> tuple[RunConfig | None, list[str], str]:
        """(the new config or None if refused, the live keys that change, why refused).

        Pure: no TensorFlow, no collective; every worker of a cluster runs it.
        """
        trainer = self.trainer
        try:
            new = RunConfig.model_validate(settings)
            if trainer.pinned_max_steps is not None:
                new.train.max_steps = trainer.pinned_max_steps
            if new.cluster is not None and trainer.worker < new.cluster.count:
                # This worker's own input pipeline, as at start-up.
                given = new.cluster.workers[trainer.worker].data.given()
                if given:
                    new.data = type(new.data).model_validate({**new.data.model_dump(), **given})
        except Exception as exc:
            return None, [], f"settings are not valid: {_one_line(exc)}"
        live, relaunch = live_changes(trainer.cfg, new)
        if relaunch:
            shown = ", ".join(relaunch[:5]) + (
                f" and {len(relaunch) - 5} more" if len(relaunch) > 5 else ""
            )
            return None, live, (f"needs a relaunch: {shown} changed (live: {', '.join(LIVE_KEYS)})")
        if live and trainer.cfg.data.factory is not None:
            return (
                None,
                live,
                (
                    "needs a relaunch: a data factory's pipeline cannot be "
                    "rebuilt in place without restarting its data order"
                ),
            )
        problem = divisibility_error(new, trainer.replicas)
        if problem:
            return None, live, problem
        return new, live, ""

    def apply(self, new: RunConfig) -> None:
        """Switch to checked live settings (check) between two updates.

        The model, optimizer, step and data position carry on; the input pipeline
        restarts at the position; a new batch split gets new accumulators and a
        new update graph. The old ones are dropped (nothing grows per switch).
        """
        trainer = self.trainer
        old = trainer.cfg
        trainer.cfg = new
        trainer.drop_data()
        old_split = (old.train.accumulation_steps, old.train.global_batch_size)
        new_split = (new.train.accumulation_steps, new.train.global_batch_size)
        if new_split != old_split:
            trainer.k, trainer.global_batch = new_split
            trainer.per_replica_batch = per_replica_batch(new, trainer.replicas)
            self.graphs[old_split] = trainer.graph
            graph = self.graphs.pop(new_split, None)
            if graph is None:
                # A split not seen before: its accumulators and its own traces.
                graph = trainer.make_update_graph(new.train.jit_compile)
            trainer.graph = graph
            trainer.accumulators = graph.accumulators
        trainer.restart_data()
        trainer.reset_timing()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def reconfigure(trainer: LiveTrainer, request: ReconfigureRequest) -> Reconfigured:
    """Check and apply a live-settings request now (every worker at once); emit the event.

    In a cluster the workers agree on the verdict: one that refuses makes all refuse,
    before anything changes, and one that fails while applying makes all go back to
    the settings they had. A failure while applying (say, no memory for the new
    pipeline) is a refusal, not a crash: the old settings are rebuilt and training
    goes on.
    """
    t0 = time.monotonic()
    new, changed, message = trainer.live.check(request.settings)
    if trainer.agreement is not None and trainer.agreement.any(new is None) and new is not None:
        new, message = (
            None,
            ("another worker refused these settings (its reconfigured event says why)"),
        )
    if new is not None:
        old = trainer.cfg
        failure = ""
        try:
            trainer.live.apply(new)
        except Exception as exc:  # any failure: back to the old settings
            failure = f"could not apply them: {_one_line(exc)}"
        failed = bool(failure)
        if trainer.agreement is not None:
            failed = trainer.agreement.any(failed)
        if failed:
            trainer.live.apply(old)  # if even this raises, the trainer ends (a crash)
            new, message = (
                None,
                ((failure or "another worker could not apply them") + "; back on the old settings"),
            )
    return _answer(trainer, request, new is not None, changed, message, t0)


def _answer(
    trainer: LiveTrainer,
    request: ReconfigureRequest,
    ok: bool,
    changed: list[str],
    message: str,
    t0: float,
) -> Reconfigured:
    event = Reconfigured(
        attempt=trainer.attempt,
        id=request.id,
        ok=ok,
        step=trainer.step,
        changed=changed,
        seconds=round(time.monotonic() - t0, 4),
        message=message,
        worker=trainer.worker,
    )
    if event.ok:
        log.info(
            "reconfigured after step %d in %.2fs: %s",
            event.step,
            event.seconds,
            ", ".join(changed) or "nothing changed",
        )
    else:
        log.warning("refused reconfigure %d after step %d: %s", request.id, event.step, message)
    trainer.emitter.emit(event)
    return event


def too_late(trainer: LiveTrainer, request: ReconfigureRequest, here: bool) -> Reconfigured:
    """Refuse a request not applied within its deadline (here, or on another worker)."""
    if here:
        message = (
            f"not applied: the trainer was not ready for it within its "
            f"{request.deadline_s:g} s (asked {request.age_s():.1f} s ago)"
        )
    else:
        message = "not applied: another worker was not ready for it in time"
    return _answer(trainer, request, False, [], message, time.monotonic())
