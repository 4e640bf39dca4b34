"""The supervisor's GPUWATCH_* timings: read once, in one place; a bad one is one line and
no run, for every variable."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.supervisor.timings import Timings, read
from tests.conftest import ROOT, TINY

NAMES = [field.name for field in fields(Timings)]
WHOLE = {field.name for field in fields(Timings) if field.type in (int, "int")}


def test_the_defaults_without_any_variable():
    assert read({}) == (Timings(), None)


@given(name=st.sampled_from(NAMES), value=st.integers(min_value=1, max_value=10**9))
def test_a_positive_number_is_taken(name: str, value: int):
    timings, problem = read({Timings.variable(name): str(value)})
    assert problem is None
    assert getattr(timings, name) == value


@given(name=st.sampled_from(NAMES),
       text=st.one_of(st.text(max_size=20), st.sampled_from(
           ["0", "-1", "nan", "inf", "-inf", "1e400", "", " ", "0.0", "1.5.2", "5s"])))
def test_anything_else_is_one_line_naming_the_variable_and_the_defaults_stay(
    name: str, text: str
):
    try:
        value = (int if name in WHOLE else float)(text)
        good = math.isfinite(value) and value > 0
    except ValueError:
        good = False
    timings, problem = read({Timings.variable(name): text})
    if good:
        assert problem is None
        return
    assert timings == Timings()
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"{Timings.variable(name)}={text!r}: not a positive ")


STARTS = {"train": ["train", str(TINY), "--detach"],
          "run": ["run", "--detach", "--", sys.executable, "-V"],
          "scale": ["scale", str(TINY), "--replicas", "1,2", "--detach"]}


@pytest.mark.parametrize("name", NAMES)
def test_a_run_does_not_start_with_a_bad_timing(name: str, home: Path):
    env = {**os.environ, Timings.variable(name): "soon"}
    command = STARTS[("train", "run", "scale")[NAMES.index(name) % 3]]
    done = subprocess.run([sys.executable, "-m", "gpuwatch", *command],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == (f"gpuwatch: {Timings.variable(name)}='soon': not a positive "
                           f"{'whole number' if name in WHOLE else 'number of seconds'}\n")
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_a_resume_does_not_start_with_a_bad_timing(home: Path):
    env = {**os.environ, "GPUWATCH_LINGER_S": "0"}
    done = subprocess.run([sys.executable, "-m", "gpuwatch", "resume", "nosuchrun"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert (done.returncode, done.stderr) == (
        2, "gpuwatch: GPUWATCH_LINGER_S='0': not a positive number of seconds\n")


@pytest.mark.parametrize("name", NAMES)
def test_a_workers_agent_does_not_start_with_a_bad_timing(name: str, tmp_path: Path):
    # The agent on another host (over ssh or srun) reads its own environment: a bad timing
    # there is the same one line, and no frame, no trainer.
    env = {**os.environ, Timings.variable(name): "soon"}
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch.supervisor.remote", "--run-dir", str(tmp_path),
         "--index", "0"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"gpuwatch agent: {Timings.variable(name)}='soon': not a positive "
                           f"{'whole number' if name in WHOLE else 'number of seconds'}\n")
    assert list(tmp_path.iterdir()) == []
