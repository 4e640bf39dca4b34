"""Wire format shared by trainer, supervisor and dashboard: NDJSON frames over AF_UNIX.

Stdlib only: this package is imported by both sides of every socket, so it must
not pull in TensorFlow, Textual or gpuwatch.

Every frame is one JSON object on one line, with ``"v"`` (the protocol version,
an integer) and ``"type"``. A frame longer than ``MAX_FRAME_BYTES``, one that is
not UTF-8, not JSON, not an object, nested deeper than ``MAX_NESTING_DEPTH``, or
lacks ``v``/``type`` is a ``ProtocolError`` (every decode failure is one, never
anything else); the reader of a connection counts it and closes that connection,
never crashes.

Import every name from here (``trainer_runtime.protocol``); each is defined once, in
one of its modules, which import each other directly, never through this package:
  framing            the line framing and its limits: encode, decode, FrameBuffer,
                     ProtocolError
  wire               wire kinds: what a declared field accepts, and its check
  commands           the commands' declarations, parse_command, command_frame
  figures            rates, the input-wait share and the Breakdown of a step's time
  samples            the device readings a sample event carries: HostSample, GpuSample,
                     GpuSummary, and their wire objects
  events             the events' declarations, EVENTS, the statuses
  envelopes          the envelope of an event frame: event_frame, parse_event
  supervisor_frames  the supervisor's own frames: snapshot parts, reconfigure
  reference          command_reference() and event_reference(): the text below

Frame types
-----------
trainer -> supervisor (the trainer's telemetry socket):
  hello       The trainer is built and about to train.
              attempt (int): the attempt it belongs to (1, 2, ...)
              pid (int): the trainer's process id
              tf_version (str): TensorFlow's version
              replicas (int): replicas in sync
              device_kind (str): "gpu" or "cpu" (logical CPU replicas)
              devices (list[str]): the replica devices
              param_count (int): trainable parameters
              param_bytes (int): their bytes
              global_batch_size (int): examples per optimizer update
              accumulation_steps (int): micro-steps per update
              per_replica_batch (int): examples per replica per micro-step
              start_step (int): optimizer steps before this attempt
              start_micro_step (int): micro-steps before this attempt
              worker (int): the worker that sent it (0 = chief)
              workers (int): workers in the cluster (1: one host)
              host (str): the worker's host name (its node's Slurm name in a Slurm
                step: SLURMD_NODENAME)
              flops_per_example (float | None): FLOPs of one example's forward and
                backward pass (matmuls, convs, einsums), counted in the traced update;
                null: not counted
  step        One optimizer update as the trainer measured it (t: when it ended).
              attempt (int): the attempt it belongs to (1, 2, ...)
              step (int): optimizer steps so far, counted across attempts
              micro_step (int): micro-batches so far
              epoch (int | None): passes over the data so far (0 for a factory's;
                null: not known, a script's own loop, whose epochs are its own)
              loss (float | None): mean loss of the update (null if not finite)
              lr (float | None): the learning rate it applied (null: not known, a
                script's loop)
              examples (int): examples trained on, counted in the graph
              step_time_ms (float): wall time of the whole update
              input_wait_ms (float | None): host time blocked on the input iterator
                (null: not measurable, the hook event says why)
              grad_sync_bytes (float): estimated all-reduce bytes in this update
              position (int | None): examples trained on so far, all attempts
              dropped (int): telemetry frames dropped so far
              worker (int): the worker that sent it (0 = chief)
              compute_ms (float | None): batch in hand to local gradients ready,
                before the all-reduce
              sync_ms (float | None): gradient all-reduce: the last local replica's
                gradients ready to the reduced gradients in hand (holds waiting for
                slower workers, and on a GPU backward work still queued); null: not
                timed apart
              update_ms (float | None): optimizer update: reduced gradients in hand to
                the new weights written
  checkpoint  A checkpoint was written.
              attempt (int): the attempt it belongs to (1, 2, ...)
              step (int): the optimizer step it holds
              micro_step (int): the micro-step it holds
              path (str): its path prefix
              seconds (float): time the save took
              worker (int): the worker that sent it (0 = chief)
  resume      The attempt continues from a checkpoint.
              attempt (int): the attempt it belongs to (1, 2, ...)
              from_step (int): the checkpoint's optimizer step
              from_micro_step (int): its micro-step
              checkpoint (str | None): its path
              position (int): examples trained on before it
              data_order (str): "continued" or "restarted"
              data_note (str): why the data order restarted
              lost_steps (int | None): added by the supervisor: steps since the
                checkpoint
              worker (int): the worker that sent it (0 = chief)
  reconfigured The trainer applied (or refused) live settings in the same process.
              attempt (int): the attempt it belongs to (1, 2, ...)
              id (int): the reconfigure request's id
              ok (bool): whether the new settings now apply
              step (int): the last step under the old settings; the new apply from
                step + 1
              changed (list[str]): the dotted keys that changed
              seconds (float): time the switch took
              message (str): why not (ok false), or a note, one line
              worker (int): the worker that sent it (0 = chief)
  done        The trainer is ending after a checkpoint.
              attempt (int): the attempt it belongs to (1, 2, ...)
              reason (str): "max_steps", "epochs", "sigterm", "socket_lost", or a
                script's "exited"
              step (int): the last optimizer step
              worker (int): the worker that sent it (0 = chief)
  error       The trainer cannot go on; the message is its root cause, one line.
              attempt (int): the attempt it belongs to (1, 2, ...)
              kind (str): "config", "factory" or "runtime"
              message (str): one line
              worker (int): the worker that sent it (0 = chief)
  hook        What gpuwatch's hook in a person's own command (`gpuwatch run`)
              instruments, or why
              attempt (int): the attempt it belongs to (1, 2, ...)
              installed (bool): the hook runs in the command's Python
              message (str): why not, or what it watches: one line
              tensorflow (bool): the command imported TensorFlow
              keras_version (str): Keras' version, once imported
              loop (str): "fit", "fit (callback)", "strategy.run (tf.function)",
                "strategy.run (eager)"; "": no training loop seen yet
              input_wait (str): "" measured, else why it is not measurable
              strategy (str): the strategy's class, once seen
              worker (int): the worker that sent it (0 = chief)
agent -> supervisor (past 8 workers, instead of a worker's steps but the chief's):
  steps       A worker's updates over about a second, summed by its agent: past
              attempt (int): the attempt it belongs to (1, 2, ...)
              worker (int): the worker whose steps these are
              first_step (int): the first update it covers
              last_step (int): the last update it covers
              count (int): the updates it covers
              epoch (int | None): the last update's epoch (null: not known)
              examples (int): examples trained on in them
              loss (float | None): the last finite loss among them (null: none)
              position (int | None): the last update's position
              dropped (int): telemetry frames dropped so far
              step_time_ms (list[float]): step time: [min, median, max, sum] ms over
                its steps
              input_wait_ms (list[float] | None): input wait: [min, median, max, sum]
                ms over its steps (null: not measured in all)
              compute_ms (list[float] | None): compute: [min, median, max, sum] ms
                over its steps (null: not measured in all)
              sync_ms (list[float] | None): gradient all-reduce: [min, median, max,
                sum] ms over its steps (null: not measured in all)
              update_ms (list[float] | None): optimizer update: [min, median, max,
                sum] ms over its steps (null: not measured in all)
              breakdown_ms (list[float] | None): [step, input, compute, sync, update]
                ms summed over its steps that have a breakdown (null: none has)
supervisor -> dashboard, besides every trainer and agent event relayed:
  run         The run: the first line of events.jsonl (attempt 0).
              run_id (str): the run's id
              name (str): the config's name
              config_path (str): the config as given
              supervisor_pid (int): the supervisor's process id
              host (str): where it runs
              settings (dict[str, Any]): the validated config
              created (float | None): when the run was made
  attempt     An attempt starts with these settings.
              attempt (int): the attempt it belongs to (1, 2, ...)
              settings (dict[str, Any]): the full validated config
              fresh (bool): whether it ignores checkpoints
              reason (str): "start", "relaunch", "live", "resume" or "scale"
              config_path (str): attempt-N.yaml in the run directory
  scale       The run is a scaling probe: a short fresh attempt at each device count,
              in order.
              counts (list[int]): the device counts, in the order they run
              unit (str): "replicas", or "workers" for a cluster
              mode (str): "weak" (the per-replica batch kept) or "strong" (the global
                batch kept)
              steps (int): optimizer steps of each attempt, warm-up included
              cores (int | None): CPU cores the supervisor's host lets its trainers
                use (logical CPU replicas beyond them share cores)
              rounds (int): rounds at most: while the verdict cannot tell, every count
                runs again with twice the steps, a round each
              round (int): the round this plan is (1, 2, ...); a later round's scale
                event is recorded as it begins, its steps doubled
              message (str | None): why a later round runs, one line: the verdict the
                round before could not give
  status      The run's status changed (see STATUSES).
              attempt (int): the attempt it belongs to (1, 2, ...)
              status (str): one of STATUSES
              exit_code (int | None): the trainer's, if it exited
              signal (str | None): the signal that ended it
              message (str | None): what happened, one line
              log_tail (list[str]): the trainer log's last lines, on a crash
              worker (int | None): the worker whose exit set this status, in a cluster
  sample      One device sample of the host (1 Hz).
              host (HostSample): the host's readings: cpu_pct, per_cpu_pct,
                mem_used_bytes, mem_total_bytes, load_1m, run_cpu_pct, run_rss_bytes,
                spare_rss_bytes (past 8 workers, a worker's but the chief's: cpu_pct,
                mem_used_bytes, mem_total_bytes, load_1m)
              gpus (list[GpuSample]): one per GPU: index, name, uuid, lost, mig,
                util_gpu_pct, util_mem_pct, mem_used_bytes, mem_total_bytes,
                temperature_c, power_w, power_limit_w, sm_clock_mhz, pcie_gen,
                pcie_width, pcie_tx_bytes_per_s, pcie_rx_bytes_per_s,
                nvlink_tx_bytes_per_s, nvlink_rx_bytes_per_s, pcie_source,
                nvlink_links_active, nvlink_version, processes (each process: pid,
                used_bytes, in_run)
              nvml (str | None): null when NVML works, else why it does not
              worker (int): the worker whose host it samples
              gpu_summary (GpuSummary | None): past 8 workers, a worker's (not the
                chief's) GPUs summed, gpus then empty: count, lost, util_gpu_pct [min,
                mean, max], mem_used_bytes, mem_total_bytes, pcie_bytes_per_s,
                nvlink_bytes_per_s
Every frame carries "v" and "type"; "t" is the sender's clock (a step's: when it
ended); the supervisor adds "seq", the event's line number in events.jsonl.
supervisor -> dashboard, replies:
  ack / err   id (the command's), message (err only), and any result fields
supervisor -> dashboard, first, when a subscribe asked for a snapshot it has:
  snapshot    seq (the last event the state folds), schema (its format), part and
              parts (0-based index and count), data (that part of the snapshot text);
              the parts come in order before any event; the client joins them
              (SnapshotParts) into one frame whose data is the whole text

dashboard -> supervisor (commands; each answered by ack or err). Every field is
checked by type and range; an unknown command or field, or a value of the wrong
kind (1 is not true, true is not 1), is answered err and changes nothing.
  (any)       fields every command may carry
              id: a string of at most 128 characters, an integer (-9007199254740991 to
                9007199254740991) or null; default null; the reply echoes it (when it
                is valid)
  subscribe   Send every recorded event with seq >= from_seq, then live ones.
              from_seq: an integer from 0 to 9007199254740991; default 0
              snapshot: a string of 1 to 128 characters or null; default null; the
                snapshot format the client reads (gpuwatch.runstate.codec.schema_id);
                when the supervisor has one of that format at seq S >= from_seq, it
                sends it first (snapshot frames) and then the events from S + 1; the
                ack says snapshot_seq
              dashboard: true or false; default false; true: a person watches (the
                dashboard); while one does and the run is live, a spare trainer waits
                for a relaunch
  relaunch    Stop the trainer, start a new attempt with these settings (resumes from
              checkpoint).
              overrides: an object of at most 64 dotted keys (like "data.prefetch") to
                JSON values; default {}; validated as the config is
              fresh: true or false; default false; only a literal true starts from
                step 0, discarding progress
              live: true or false; default true; false: always a full relaunch (key R)
  stop        Stop the trainer (it checkpoints first) and the run.
  status      The reply carries the current status, attempt, step, pids and counters.
"""

from __future__ import annotations

# typing.get_type_hints reads a class's annotations (strings: PEP 563) in the namespace
# of its __module__, which for the classes below is this package (see the end): these
# are the names their annotations use besides the classes themselves.
from collections.abc import Callable, Mapping  # noqa: F401
from typing import Any, ClassVar  # noqa: F401

from trainer_runtime.protocol.commands import (
    COMMANDS,
    Command,
    InvalidCommand,
    Relaunch,
    Status,
    Stop,
    Subscribe,
    build_command,
    command_frame,
    encode_command,
    parse_command,
    reply_id,
)
from trainer_runtime.protocol.envelopes import (
    ENVELOPE,
    Envelope,
    encode_event,
    event_frame,
    parse_event,
)
from trainer_runtime.protocol.events import (
    AGENT_EVENTS,
    EVENTS,
    FAILED_STATUSES,
    SPREAD,
    STATUSES,
    SUMMARY_PAST_WORKERS,
    TERMINAL_STATUSES,
    TRAINER_EVENTS,
    Attempt,
    Checkpoint,
    Done,
    Error,
    Event,
    Hello,
    Hook,
    Reconfigured,
    Resume,
    Run,
    Sample,
    Scale,
    StatusChange,
    Step,
    StepSummary,
    host_name,
)
from trainer_runtime.protocol.figures import (
    Breakdown,
    breakdown,
    input_wait_pct,
    per_second,
    sum_breakdowns,
)
from trainer_runtime.protocol.framing import (
    MAX_FRAME_BYTES,
    MAX_NESTING_DEPTH,
    PROTOCOL_VERSION,
    FrameBuffer,
    ProtocolError,
    decode,
    encode,
    encode_frame,
)
from trainer_runtime.protocol.reference import command_reference, event_reference
from trainer_runtime.protocol.samples import (
    LEAN_HOST_FIELDS,
    GpuProcess,
    GpuSample,
    GpuSummary,
    HostSample,
    WireRecordError,
    record_from_wire,
    wire_field_names,
    wire_object,
)
from trainer_runtime.protocol.supervisor_frames import (
    LIVE_DEADLINE_S,
    MAX_LIVE_DEADLINE_S,
    MAX_SNAPSHOT_CHARS,
    RECONFIGURE,
    SNAPSHOT,
    SNAPSHOT_PART_CHARS,
    SnapshotParts,
    parse_reconfigure,
    reconfigure_frame,
    snapshot_frames,
)
from trainer_runtime.protocol.wire import (
    BOOL,
    COMMAND_ID,
    MAX_ID_CHARS,
    MAX_OVERRIDE_KEY_CHARS,
    MAX_OVERRIDES,
    MAX_WIRE_INT,
    OVERRIDES,
    SEQ,
    SNAPSHOT_FORMAT,
    CommandId,
    WireKind,
)

# A constant here is the defining module's value, bound once: to change one (a test
# does), set it in that module.
__all__ = [
    "AGENT_EVENTS",
    "BOOL",
    "COMMANDS",
    "COMMAND_ID",
    "ENVELOPE",
    "EVENTS",
    "FAILED_STATUSES",
    "LEAN_HOST_FIELDS",
    "LIVE_DEADLINE_S",
    "MAX_FRAME_BYTES",
    "MAX_ID_CHARS",
    "MAX_LIVE_DEADLINE_S",
    "MAX_NESTING_DEPTH",
    "MAX_OVERRIDES",
    "MAX_OVERRIDE_KEY_CHARS",
    "MAX_SNAPSHOT_CHARS",
    "MAX_WIRE_INT",
    "OVERRIDES",
    "PROTOCOL_VERSION",
    "RECONFIGURE",
    "SEQ",
    "SNAPSHOT",
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_PART_CHARS",
    "SPREAD",
    "STATUSES",
    "SUMMARY_PAST_WORKERS",
    "TERMINAL_STATUSES",
    "TRAINER_EVENTS",
    "Attempt",
    "Breakdown",
    "Checkpoint",
    "Command",
    "CommandId",
    "Done",
    "Envelope",
    "Error",
    "Event",
    "FrameBuffer",
    "GpuProcess",
    "GpuSample",
    "GpuSummary",
    "Hello",
    "Hook",
    "HostSample",
    "InvalidCommand",
    "ProtocolError",
    "Reconfigured",
    "Relaunch",
    "Resume",
    "Run",
    "Sample",
    "Scale",
    "SnapshotParts",
    "Status",
    "StatusChange",
    "Step",
    "StepSummary",
    "Stop",
    "Subscribe",
    "WireKind",
    "WireRecordError",
    "breakdown",
    "build_command",
    "command_frame",
    "command_reference",
    "decode",
    "encode",
    "encode_command",
    "encode_event",
    "encode_frame",
    "event_frame",
    "event_reference",
    "host_name",
    "input_wait_pct",
    "parse_command",
    "parse_event",
    "parse_reconfigure",
    "per_second",
    "reconfigure_frame",
    "record_from_wire",
    "reply_id",
    "snapshot_frames",
    "sum_breakdowns",
    "wire_field_names",
    "wire_object",
]

# The classes keep the home they had when this package was one module: their
# __module__ is in gpuwatch.runstate.codec's schema id (snapshot.json written by an earlier
# version stays readable), in their pickles and in tracebacks. Set after each class is
# made (dataclass reads ClassVar in its defining module's namespace).
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type):
        _value.__module__ = __name__
del _name, _value
