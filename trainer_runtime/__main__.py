"""Trainer CLI: ``python -m trainer_runtime --run-dir DIR --config FILE --attempt N``.

With a ``cluster:`` section the process is worker ``--worker I`` of a
MultiWorkerMirroredStrategy cluster: TF_CONFIG (or Slurm's environment) says
where the others are, ``--chief-dir`` where the chief's checkpoints are.

Exit codes (docs/internals.md): 0 done (max_steps/epochs, SIGTERM or a lost
telemetry socket, each after a checkpoint); 2 bad config or factory (one
``error:`` line on stderr and an ``error`` frame); 1 crashed while training
(traceback on stderr, ``error`` frame kind runtime).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from trainer_runtime import protocol, scratch
from trainer_runtime.schema import RunConfig, divisibility_error

# A cluster forms (every worker's TensorFlow server up and registered) within
# cluster.timeout_s plus this; a slow peer's TensorFlow import fits in it.
FORMING_GRACE_S = 30.0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer_runtime")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--config", required=True, help="RunConfig as YAML or JSON")
    p.add_argument("--attempt", type=int, default=1)
    p.add_argument("--telemetry-fd", type=int, default=None)
    p.add_argument("--fresh", action="store_true", help="ignore existing checkpoints")
    p.add_argument("--max-steps", type=int, default=None, help="overrides train.max_steps")
    p.add_argument("--worker", type=int, default=0,
                   help="this worker's index in cluster.workers (0 = the chief)")
    p.add_argument("--chief-dir", default=None,
                   help="the chief's run dir, when this worker can read it (resume)")
    return p.parse_args(argv)


def load_config(path: str) -> RunConfig:
    """Read and validate; raises ValueError with a one-line reason."""
    text = Path(path).read_text()
    data: Any
    if path.endswith(".json"):
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return RunConfig.model_validate(data)


def _one_line(exc: BaseException) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            parts = [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errors()]
            return "; ".join(parts)
        except Exception:
            pass
    return " ".join(str(exc).split())


_ROOT_CAUSE = re.compile(r"^\s*((?:[A-Za-z_][\w.]*)?(?:Error|Exception|Exhausted)\w*: .+)$", re.M)


def _runtime_message(exc: BaseException) -> str:
    """One line a person can act on, for an exception raised while training.

    TensorFlow wraps a Python error raised inside the graph (a py_function, a
    dataset) in "Graph execution error: Detected at node ... (most recent call
    last): File ..." with the real cause near the end; lead with that cause.
    """
    text = str(exc)
    head = f"{type(exc).__name__}: "
    if "Could not start gRPC server" in text:
        return head + _server_not_started(os.environ.get("TF_CONFIG"))
    causes = [m.strip() for m in _ROOT_CAUSE.findall(text)]
    if "Graph execution error" in text and causes:
        node = re.search(r"Detected at node ([^\s]+)", text)
        where = f" (at node {node.group(1)})" if node else ""
        return (head + causes[-1] + where)[:1000]
    return (head + " ".join(text.split()))[:1000]


def _server_not_started(tf_config: str | None) -> str:
    """TensorFlow's "Could not start gRPC server", with the address it could not listen on
    (this worker's in TF_CONFIG) and what to do: almost always, another program has the
    port."""
    address = None
    try:
        spec = json.loads(tf_config or "")
        address = spec["cluster"]["worker"][spec["task"]["index"]]
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    if not isinstance(address, str) or not address.split():
        return "Could not start gRPC server (another program holds this worker's port?)"
    address = " ".join(address.split())[:100]
    port = address.rpartition(":")[2]
    where = (f"port {port} ({address}, this worker's in TF_CONFIG)"
             if port.isascii() and port.isdigit()
             else f"{address} (this worker's address in TF_CONFIG)")
    return (f"Could not start gRPC server: {where} is probably in use by another program: "
            f"free it, or relaunch (each attempt takes a new port unless cluster.ports or "
            f"Slurm's port base fixes it)")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # What TensorFlow writes to the temporary directory goes where _exit_now removes it.
    global _SCRATCH
    _SCRATCH = scratch.take(os.getpid())
    # A C++ abort or a segfault still leaves a line in trainer.log for the supervisor.
    faulthandler.enable(all_threads=False)
    # Before TensorFlow loads: its C++ INFO/WARNING chatter would bury trainer.log.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # INFO for our own lines only: TensorFlow's Python loggers (e.g. "Sharding callback
    # duration" twice a step for a factory dataset) would flood trainer.log.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s trainer %(levelname)s %(message)s")
    log = logging.getLogger("trainer_runtime")
    log.setLevel(logging.INFO)

    from trainer_runtime.telemetry import NullEmitter, SocketEmitter

    emitter: SocketEmitter | NullEmitter = NullEmitter()
    buffer_frames = 4096
    config: RunConfig | None = None

    def fail(kind: str, message: str, code: int) -> int:
        print(f"error: {message}", file=sys.stderr, flush=True)
        emitter.emit(protocol.Error(attempt=args.attempt, kind=kind, message=message,
                                    worker=args.worker))
        emitter.close()
        return code

    try:
        config = load_config(args.config)
        if args.max_steps is not None:
            config.train.max_steps = args.max_steps
        buffer_frames = config.telemetry.buffer_frames
        workers = config.cluster.count if config.cluster else 1
        if not 0 <= args.worker < workers:
            raise ValueError(f"--worker {args.worker} is not one of the {workers} workers "
                             "of cluster.workers" if config.cluster else
                             f"--worker {args.worker} needs a cluster: section")
        if config.cluster is None:
            # One host: a TF_CONFIG left in the environment must not make TensorFlow
            # look for a cluster.
            os.environ.pop("TF_CONFIG", None)
        else:
            # This worker's own input pipeline (its storage, its CPUs).
            given = config.cluster.workers[args.worker].data.given()
            if given:
                config.data = type(config.data).model_validate(
                    {**config.data.model_dump(), **given})
    except Exception as exc:
        if args.telemetry_fd is not None:
            emitter = SocketEmitter.from_fd(args.telemetry_fd, buffer_frames)
        return fail("config", f"config {args.config}: {_one_line(exc)}", 2)
    if args.telemetry_fd is not None:
        emitter = SocketEmitter.from_fd(args.telemetry_fd, buffer_frames)

    from trainer_runtime.loop import StopFlags

    flags = StopFlags()
    flags.install()  # early: a SIGTERM during TF start-up must still end cleanly

    t0 = time.monotonic()
    import tensorflow as tf

    from trainer_runtime.cluster import (
        ClusterError,
        make_multiworker_strategy,
        resolve_tf_config,
    )
    from trainer_runtime.devices import (
        DeviceShortage,
        make_strategy,
        setup_devices,
        setup_worker_devices,
        worker_devices,
    )
    from trainer_runtime.factories import FactoryError
    from trainer_runtime.flops import trainer_flops_per_example
    from trainer_runtime.loop import START_OVER, ResumeError, Trainer, train
    from trainer_runtime.models import ModelConfigError

    strategy: tf.distribute.Strategy
    try:
        if config.cluster is None:
            devices = setup_devices(config.strategy)
            strategy, _note = make_strategy(devices, config.strategy.cross_device_ops)
        else:
            gpus = setup_worker_devices()
            tf_config = resolve_tf_config(config.cluster, args.worker, os.environ, gpus)
            # Before any other op: the strategy configures TensorFlow's runtime.
            # Measured here (TF 2.21): a worker whose peer never starts blocks in this
            # call for good, holding the GIL (no Python thread or signal handler runs),
            # deaf to SIGTERM. faulthandler's C watchdog still fires: exit 1 with the
            # stack in trainer.log (no error frame can be sent from there).
            forming_s = config.cluster.timeout_s + FORMING_GRACE_S
            log.info("worker %d of %d: waiting up to %.0f s for the cluster to form",
                     args.worker, workers, forming_s)
            faulthandler.dump_traceback_later(forming_s, exit=True)
            try:
                strategy, _note = make_multiworker_strategy(config.cluster, tf_config, gpus)
            finally:
                faulthandler.cancel_dump_traceback_later()
            # The coordination service's preemption notifier has just taken SIGTERM
            # over (its own C handler); take it back, the loop agrees on stopping.
            flags.install()
            devices = worker_devices(strategy, gpus)
        problem = divisibility_error(config, strategy.num_replicas_in_sync)
        if problem:
            return fail("config", problem, 2)
        trainer = Trainer(config, strategy, devices, run_dir=args.run_dir,
                          attempt=args.attempt, emitter=emitter, worker=args.worker,
                          workers=workers, chief_dir=args.chief_dir)
    except (ClusterError, DeviceShortage) as exc:
        return fail("config", str(exc), 2)
    except FactoryError as exc:
        return fail("factory", str(exc), 2)
    except ModelConfigError as exc:
        return fail("config", str(exc), 2)
    except Exception as exc:  # MemoryError, a TensorFlow error: the cause, then exit 1
        traceback.print_exc()
        return fail("runtime", _runtime_message(exc), 1)
    trainer.pinned_max_steps = args.max_steps
    try:
        resume = trainer.restore(args.fresh)
    except ResumeError as exc:
        return fail("config", str(exc), 2)
    except Exception as exc:
        if trainer.multi_worker:  # the agreement's collective failed: a lost worker
            traceback.print_exc()
            return fail("runtime", _runtime_message(exc), 1)
        return fail("config", f"checkpoint in {args.run_dir}/checkpoints does not fit this "
                    f"model ({_one_line(exc)[:300]}); {START_OVER}", 2)
    # Traced here rather than in the first update (which reuses the trace), so the
    # hello carries the update's FLOPs per example.
    flops_per_example = trainer_flops_per_example(trainer)
    log.info("built and traced in %.1fs: %d replicas on %s, %d parameters", time.monotonic() - t0,
             trainer.replicas, devices.kind, trainer.param_count)
    emitter.emit(protocol.Hello(
        attempt=args.attempt, pid=os.getpid(), tf_version=tf.__version__,
        replicas=trainer.replicas, device_kind=devices.kind, devices=devices.names,
        param_count=trainer.param_count, param_bytes=trainer.param_bytes,
        global_batch_size=trainer.global_batch, accumulation_steps=trainer.k,
        per_replica_batch=trainer.per_replica_batch, start_step=trainer.step,
        start_micro_step=trainer.micro_step, worker=args.worker, workers=workers,
        host=protocol.host_name(), flops_per_example=flops_per_example))
    if resume is not None:
        log.info("resumed from step %d (%s), data position %d, data order %s%s",
                 resume.from_step, resume.checkpoint, resume.position, resume.data_order,
                 f" ({resume.data_note})" if resume.data_note else "")
        emitter.emit(resume)
    try:
        reason, step = train(trainer, flags)
    except FactoryError as exc:  # the first batch of a factory dataset was the wrong size
        return fail("factory", str(exc), 2)
    except Exception as exc:
        traceback.print_exc()
        sys.stderr.flush()
        emitter.emit(protocol.Error(attempt=args.attempt, kind="runtime",
                                    message=_runtime_message(exc), worker=args.worker))
        emitter.close()
        return 1
    log.info("done: %s at step %d", reason, step)
    emitter.emit(protocol.Done(attempt=args.attempt, reason=reason, step=step,
                               worker=args.worker))
    emitter.close()
    return 0


# This trainer's temporary directory (trainer_runtime.scratch), once main() made it.
_SCRATCH: str | None = None


def _exit_now(code: int) -> None:
    """Exit without interpreter finalisation.

    Seen here: after training ends, finalisation can hang for good on TensorFlow's
    tf.data / py_function threads (the supervisor then had to SIGKILL a trainer that
    had already checkpointed and said `done`). Everything that matters is flushed
    and closed by now, so skip it.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    scratch.remove(_SCRATCH)
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
