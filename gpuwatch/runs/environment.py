"""The environments gpuwatch starts programs with: what it adds, what it removes, once.

The supervisor runs with the environment `gpuwatch` was typed in, plus two variables of
gpuwatch's own (its home, and the directory the person typed the command in), and it
notes which of them the person did not have (ADDED_ENV). From there:

- a person's own command (gpuwatch run) gets the person's environment intact, TF_CONFIG
  and every GPUWATCH_* of theirs included: gpuwatch removes only the variables it added
  itself, and adds the hook's (its directory first on PYTHONPATH, the telemetry fd and
  settings, which the hook takes out again as the program starts), PYTHONUNBUFFERED=1
  (its output reaches trainer.log as it prints) and TF_CPP_MIN_LOG_LEVEL=2 where the
  person set none;
- the bundled trainer (gpuwatch train) is gpuwatch's own program: it gets the same
  environment without the variables that would make it join some other cluster
  (CLUSTER_ENV), then its worker's own (its TF_CONFIG, in a cluster).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Variables that would make a trainer join some other cluster: a single-host
# trainer, and every worker before its own are set, starts without them.
CLUSTER_ENV = ("TF_CONFIG",)
# gpuwatch's own variables in the supervisor's environment.
HOME_ENV = "GPUWATCH_HOME"
USER_CWD_ENV = "GPUWATCH_USER_CWD"
# The names gpuwatch added to the person's environment for the supervisor (comma-separated).
ADDED_ENV = "GPUWATCH_ADDED_ENV"


def supervisor_environment(person: Mapping[str, str], home: str, cwd: str) -> dict[str, str]:
    """The supervisor's environment: the person's, its home and where they typed gpuwatch
    (factories and a command's cwd start there), and which of those names it added."""
    env = dict(person)
    added = [name for name in (HOME_ENV, USER_CWD_ENV, ADDED_ENV) if name not in person]
    env[HOME_ENV] = home
    env[USER_CWD_ENV] = cwd
    env[ADDED_ENV] = ",".join(added)
    return env


def persons_environment(supervisor: Mapping[str, str]) -> dict[str, str]:
    """The environment the person typed gpuwatch in, from the supervisor's."""
    added = set(filter(None, supervisor.get(ADDED_ENV, "").split(",")))
    return {name: value for name, value in supervisor.items() if name not in added}


def command_environment(supervisor: Mapping[str, str], hook_dir: str,
                        hook: Mapping[str, str]) -> dict[str, str]:
    """A person's own command's environment (gpuwatch run): theirs, plus the hook's."""
    env = persons_environment(supervisor)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [hook_dir, env.get("PYTHONPATH")]))
    env.update(hook)
    return env


def trainer_environment(supervisor: Mapping[str, str],
                        worker: Mapping[str, str] | None = None) -> dict[str, str]:
    """The bundled trainer's environment: the supervisor's without a cluster's variables,
    then its worker's own; the person's directory first on PYTHONPATH, as `python -m`
    would put it (a factory imports from there)."""
    env = {name: value for name, value in supervisor.items() if name not in CLUSTER_ENV}
    if worker is not None:
        env.update(worker)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    user_cwd = supervisor.get(USER_CWD_ENV)
    if user_cwd:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [user_cwd, env.get("PYTHONPATH")]))
    return env
