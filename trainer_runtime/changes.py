"""What a change of settings is: which keys a running trainer takes live, at an update
boundary in the same process (any other change is a relaunch), and which a person's own
command takes at all. Rules on dotted keys (``data.prefetch``); no TensorFlow, as in
``schema``, whose configs they compare.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

# The settings a running trainer can change at an update boundary, in the same process
# (a `reconfigure` frame); any other change is a relaunch.
LIVE_KEYS = frozenset({
    "data.prefetch",
    "data.parallel_calls",
    "data.read_latency_ms",
    "data.decode_cost",
    "data.cache",
    "train.global_batch_size",
    "train.accumulation_steps",
})


# The settings that mean something for a person's own command (gpuwatch run): its hook
# applies data.prefetch and train.max_steps (trainer_runtime/hook); name is the run's.
# Every other setting is the script's own business: refused by `--set`, a relaunch and
# the dashboard's keys alike, with the reason command_setting_refusal gives.
COMMAND_KEYS = ("data.prefetch", "train.max_steps", "name")
# Where a multi-worker command runs (gpuwatch run --workers N, --set cluster.KEY=V): the
# launcher and its hosts; each worker gets the TF_CONFIG its place needs. Set when the
# run starts or relaunches, never live.
COMMAND_CLUSTER_KEYS = ("cluster.launcher", "cluster.workers", "cluster.ports",
                        "cluster.timeout_s", "cluster.python", "cluster.ssh_options")
ACCUMULATION_REFUSAL = (
    "a script's gradient accumulation is not changed from outside: Keras' "
    "gradient_accumulation_steps is wrong under MirroredStrategy inside tf.function "
    "(keras-team/keras#20582)"
)
BATCH_REFUSAL = "a script's batch size is its own: gpuwatch cannot change it from outside"
_COMMAND_REFUSALS = {
    "train.accumulation_steps": ACCUMULATION_REFUSAL,
    "train.global_batch_size": BATCH_REFUSAL,
    "command": "the command is the run's own: start another run with gpuwatch run",
    "cluster.collective": "a command's own MultiWorkerMirroredStrategy picks its collective "
                          "(its CommunicationOptions)",
    "cluster": f"set a command's cluster key by key: {', '.join(COMMAND_CLUSTER_KEYS)}",
}


def command_setting_refusal(key: str) -> str | None:
    """Why the dotted setting `key` cannot be set for a person's own command, in words; None
    for the settings it can (COMMAND_KEYS, and where its workers run: COMMAND_CLUSTER_KEYS)."""
    key = key.strip()
    if key in COMMAND_KEYS or key in COMMAND_CLUSTER_KEYS or key.startswith(
            tuple(f"{cluster_key}." for cluster_key in COMMAND_CLUSTER_KEYS)):
        return None
    section = key.partition(".")[0]
    reason = _COMMAND_REFUSALS.get(key) or _COMMAND_REFUSALS.get(section)
    if reason is not None:
        return reason
    return (f"a script's own code decides it: for a command gpuwatch sets only "
            f"{', '.join(COMMAND_KEYS)} and where its workers run (cluster.*)")


def dotted_settings(settings: Any, prefix: str = "") -> dict[str, Any]:
    """A config (RunConfig or its dict) as ``{"data.prefetch": value, ...}``, in its order.

    Only the first two levels are split into dotted keys; deeper values (a factory's
    kwargs, the cluster's list of workers) are one value each. What a change of
    settings compares (``live_changes``, the dashboard's attempts table).
    """
    if isinstance(settings, BaseModel):
        settings = settings.model_dump(mode="json")
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name.count(".") < 1:
            flat.update(dotted_settings(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def live_changes(old: Any, new: Any) -> tuple[list[str], list[str]]:
    """The dotted keys that differ between two configs: (live keys, other keys), sorted.

    Either may be a RunConfig or its dict. Only the first two levels are split into
    dotted keys (``data.prefetch``); deeper values (a factory's kwargs) compare whole.
    """
    before, after = dotted_settings(old), dotted_settings(new)
    changed = sorted(
        key for key in before.keys() | after.keys() if before.get(key) != after.get(key)
    )
    return (
        [key for key in changed if key in LIVE_KEYS],
        [key for key in changed if key not in LIVE_KEYS],
    )
