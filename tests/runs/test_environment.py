"""The environments gpuwatch starts programs with (gpuwatch/runs/environment.py), variable by
variable: a person's command gets theirs intact, TF_CONFIG included, plus only the hook's
few; the bundled trainer drops a cluster's variables. Property tests over any environment."""

from __future__ import annotations

import os
import string

from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.runs.environment import (
    ADDED_ENV,
    CLUSTER_ENV,
    HOME_ENV,
    USER_CWD_ENV,
    command_environment,
    persons_environment,
    supervisor_environment,
    trainer_environment,
)

HOOK = {"GPUWATCH_HOOK_FD": "7", "GPUWATCH_HOOK": '{"attempt": 1}'}
HOOK_DIR = "/opt/gpuwatch/hook/site"
# What gpuwatch adds to a command, besides the hook's: the person's value wins for the first.
ADDED_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2"}
ADDED_ALWAYS = {"PYTHONUNBUFFERED": "1"}

# Names a person may have set: the ones the rule names, and any others.
NAMES = st.one_of(
    st.sampled_from([*CLUSTER_ENV, HOME_ENV, "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL",
                     "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG",
                     "GPUWATCH_STOP_GRACE_S", "SLURM_PROCID", "LD_LIBRARY_PATH"]),
    st.text(string.ascii_uppercase + string.digits + "_", min_size=1, max_size=12),
).filter(lambda name: name not in (USER_CWD_ENV, ADDED_ENV, *HOOK))
VALUES = st.text(st.characters(blacklist_characters="\0", codec="utf-8"), max_size=40)
ENVIRONMENTS = st.dictionaries(NAMES, VALUES, max_size=12)


@given(ENVIRONMENTS, VALUES, VALUES)
def test_the_supervisor_knows_the_persons_environment_exactly(
    person: dict[str, str], home: str, cwd: str
) -> None:
    supervisor = supervisor_environment(person, home, cwd)
    assert supervisor[HOME_ENV] == home and supervisor[USER_CWD_ENV] == cwd
    # A GPUWATCH_HOME of their own is the home (gpuwatch was typed with it).
    assert persons_environment(supervisor) == (
        person if HOME_ENV not in person else {**person, HOME_ENV: home})


@given(ENVIRONMENTS, VALUES, VALUES)
def test_a_command_gets_the_persons_environment_and_only_the_hooks_additions(
    person: dict[str, str], home: str, cwd: str
) -> None:
    person.pop(HOME_ENV, None)  # theirs is the home: the test above
    env = command_environment(supervisor_environment(person, home, cwd), HOOK_DIR, HOOK)
    for name, value in person.items():
        if name == "PYTHONPATH":
            continue
        if name in ADDED_ALWAYS:
            assert env[name] == ADDED_ALWAYS[name]
        else:
            assert env[name] == value, name  # TF_CONFIG, CUDA_*, their own GPUWATCH_*
    assert env["PYTHONPATH"] == os.pathsep.join(filter(None, [HOOK_DIR,
                                                               person.get("PYTHONPATH")]))
    added = set(env) - set(person)
    assert added <= {"PYTHONPATH", *HOOK, *ADDED_DEFAULTS, *ADDED_ALWAYS}, added
    assert {name: env[name] for name in HOOK} == HOOK
    for name, value in ADDED_DEFAULTS.items():
        assert env[name] == person.get(name, value)
    # Nothing of gpuwatch's own reaches it.
    assert not {HOME_ENV, USER_CWD_ENV, ADDED_ENV} & set(env)


@given(ENVIRONMENTS, VALUES, VALUES, st.dictionaries(st.sampled_from(CLUSTER_ENV), VALUES))
def test_the_bundled_trainer_drops_a_clusters_variables_and_takes_its_workers(
    person: dict[str, str], home: str, cwd: str, worker: dict[str, str]
) -> None:
    env = trainer_environment(supervisor_environment(person, home, cwd), worker or None)
    for name in CLUSTER_ENV:
        assert env.get(name) == worker.get(name)  # its worker's, never the person's
    for name, value in person.items():
        if name not in (*CLUSTER_ENV, HOME_ENV, "PYTHONPATH", *ADDED_ALWAYS):
            assert env[name] == value, name
    assert env[HOME_ENV] == home and env["PYTHONUNBUFFERED"] == "1"
    # The person's directory first, as `python -m` would put it (a factory imports from it).
    assert env.get("PYTHONPATH", "") == os.pathsep.join(filter(None, [cwd,
                                                                      person.get("PYTHONPATH")]))
