"""A scaling probe's rounds (pure): whether another round runs (``another_round``), each
round's plan and settings, which attempt a count's row shows once there are several, the
plan file with and without rounds, and the words a round begins with.

The probe's rounds as a person runs them (a supervisor, the stand-in trainer) are in
tests/integration/test_scale.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.cli.headless import round_lines
from gpuwatch.cli.parser import build_parser
from gpuwatch.config import ConfigError, load_config
from gpuwatch.measures.scaling import (
    DEFAULT_STEPS,
    MAX_ROUNDS,
    MAX_STEPS,
    ScaleError,
    another_round,
    describe,
    make_plan,
    next_round,
    plan_configs,
    reached_its_steps,
    round_configs,
    round_words,
    scaling_rows,
)
from gpuwatch.runstate import WARMUP_STEPS, RunState
from gpuwatch.supervisor.scale_attempts import read_plan, write_plan
from tests.conftest import ROOT, TINY
from trainer_runtime.protocol import Scale, event_frame

DEMO = load_config(ROOT / "demo" / "demo.yaml").config
LEVELS = ("good", "poor", "unknown", None)


# ---- whether another round runs ------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "round_number", "rounds", "failed", "stop_asked", "again"),
    [
        ("unknown", 1, 3, False, False, True),  # cannot tell: every count again
        ("unknown", 2, 3, False, False, True),
        ("unknown", 3, 3, False, False, False),  # the last round: it stays undecided
        ("unknown", 1, 1, False, False, False),  # --rounds 1: today's probe
        ("good", 1, 3, False, False, False),  # it can tell: done
        ("poor", 2, 3, False, False, False),
        (None, 1, 3, False, False, False),  # no verdict at all (fewer than 2 counts measured)
        ("unknown", 1, 3, True, False, False),  # a count failed: more steps cannot help
        ("unknown", 1, 3, False, True, False),  # a stop was asked
        ("unknown", 2, 3, True, True, False),
    ],
)
def test_another_round_only_while_the_verdict_cannot_tell_and_more_steps_can_help(
    level: str | None, round_number: int, rounds: int, failed: bool, stop_asked: bool,
    again: bool,
) -> None:
    assert another_round(level, round_number, rounds, failed=failed,
                         stop_asked=stop_asked) is again


def rounds_run(levels: list[str | None], failed: list[bool], stops: list[bool],
               rounds: int) -> int:
    """How many rounds a probe runs when round r's verdict is levels[r-1], its counts
    failed[r-1], and a stop was asked by its end stops[r-1]: the supervisor's loop."""
    round_number = 1
    while another_round(levels[round_number - 1], round_number, rounds,
                        failed=failed[round_number - 1], stop_asked=stops[round_number - 1]):
        round_number += 1
    return round_number


@given(
    rounds=st.integers(1, MAX_ROUNDS),
    levels=st.lists(st.sampled_from(LEVELS), min_size=MAX_ROUNDS, max_size=MAX_ROUNDS),
    failed=st.lists(st.booleans(), min_size=MAX_ROUNDS, max_size=MAX_ROUNDS),
    stops=st.lists(st.booleans(), min_size=MAX_ROUNDS, max_size=MAX_ROUNDS),
)
def test_rounds_never_pass_the_bound_nor_follow_a_failure_a_stop_or_a_verdict(
    rounds: int, levels: list[str | None], failed: list[bool], stops: list[bool]
) -> None:
    ran = rounds_run(levels, failed, stops, rounds)
    assert 1 <= ran <= rounds
    before = range(ran - 1)  # the rounds another one followed
    assert all(levels[r] == "unknown" and not failed[r] and not stops[r] for r in before)
    last = ran - 1
    # The last round ran is the bound's, or one that failed, was stopped, or could tell.
    assert (ran == rounds or failed[last] or stops[last] or levels[last] != "unknown")


# ---- each round's plan and settings ----------------------------------------------------


def test_each_round_runs_every_count_again_with_twice_the_steps() -> None:
    plan = make_plan(DEMO, [1, 2], "weak", 20, 0, rounds=3)
    assert (plan.round, plan.rounds, plan.steps, plan.message) == (1, 3, 20, None)
    second = next_round(plan, "not enough steps to tell (71-91%)")
    third = next_round(second, "not enough steps to tell (74-87%)")
    assert [(p.round, p.steps) for p in (plan, second, third)] == [(1, 20), (2, 40), (3, 80)]
    assert third.counts == plan.counts and (third.mode, third.unit) == ("weak", "replicas")
    assert third.message == "not enough steps to tell (74-87%)"
    configs = plan_configs(DEMO, plan, 0)
    later = round_configs(configs, third)
    assert [count for count, _ in later] == [1, 2]
    assert [c.train.max_steps for _, c in later] == [80, 80]
    # Only the steps change: each count's devices and batch are its first round's.
    assert [(c.strategy.replicas, c.train.global_batch_size) for _, c in later] == [
        (c.strategy.replicas, c.train.global_batch_size) for _, c in configs]


def test_the_rounds_are_bounded_and_their_last_steps_too() -> None:
    assert make_plan(DEMO, [1, 2], "weak", 40, 0).rounds == 1  # a plan without: one round
    with pytest.raises(ScaleError, match=rf"--rounds 0: from 1 \(each count once\) to "
                                         rf"{MAX_ROUNDS}"):
        make_plan(DEMO, [1, 2], "weak", 40, 0, rounds=0)
    with pytest.raises(ScaleError, match=rf"--rounds {MAX_ROUNDS + 1}: from 1"):
        make_plan(DEMO, [1, 2], "weak", 40, 0, rounds=MAX_ROUNDS + 1)
    most = MAX_STEPS // 2 ** (MAX_ROUNDS - 1)
    make_plan(DEMO, [1, 2], "weak", most, 0, rounds=MAX_ROUNDS)
    with pytest.raises(ScaleError) as refused:
        make_plan(DEMO, [1, 2], "weak", most + 1, 0, rounds=MAX_ROUNDS)
    assert str(refused.value) == (
        f"--steps {most + 1} --rounds {MAX_ROUNDS}: round {MAX_ROUNDS} would run "
        f"{(most + 1) * 2 ** (MAX_ROUNDS - 1):,} steps a count, at most {MAX_STEPS:,} "
        "(give fewer steps, or fewer rounds)")
    make_plan(DEMO, [1, 2], "weak", MAX_STEPS, 0, rounds=1)


def test_the_help_states_the_rounds_bound_and_the_default_steps() -> None:
    text = build_parser()._subparsers._group_actions[0].choices["scale"].format_help()  # type: ignore[union-attr]
    flat = " ".join(text.split())
    assert f"up to N rounds in all (default and most {MAX_ROUNDS}: the steps, 2x, 4x)" in flat
    assert f"up to {MAX_ROUNDS} rounds (--rounds)" in flat
    assert f"(default {DEFAULT_STEPS})" in flat
    assert MAX_ROUNDS == 3  # the help's "2x, 4x"


def test_the_plan_file_carries_the_rounds_and_one_without_them_has_one(tmp_path: Path) -> None:
    config = load_config(TINY).config
    path = tmp_path / "scale.json"
    write_plan(path, make_plan(config, [1, 2], "weak", 20, 0, rounds=3))
    assert json.loads(path.read_text()) == {"counts": [1, 2], "mode": "weak", "steps": 20,
                                            "rounds": 3}
    plan, configs = read_plan(path, config)
    assert (plan.rounds, plan.round, plan.steps) == (3, 1, 20)
    assert [c.train.max_steps for _, c in configs] == [20, 20]
    # Written before the probe had rounds: one round, as it ran then.
    path.write_text(json.dumps({"counts": [1, 2], "mode": "weak", "steps": 20}))
    assert read_plan(path, config)[0].rounds == 1
    path.write_text(json.dumps({"counts": [1, 2], "mode": "weak", "steps": 20, "rounds": "3"}))
    with pytest.raises(ConfigError, match="not a scaling plan"):
        read_plan(path, config)


# ---- which attempt a count's row shows -----------------------------------------------


def _settings(replicas: int, batch: int, steps: int) -> dict[str, Any]:
    return {"strategy": {"replicas": replicas}, "train": {"global_batch_size": batch,
                                                          "max_steps": steps}}


class Record:
    """A probe's record, built an event at a time and folded."""

    def __init__(self, counts: list[int], steps: int) -> None:
        self.events: list[dict[str, Any]] = [
            {"type": "run", "run_id": "r", "config_path": "c", "supervisor_pid": 1,
             "host": "h", "settings": _settings(1, 64, steps)},
            {"type": "scale", "counts": counts, "unit": "replicas", "mode": "weak",
             "steps": steps, "cores": 8, "rounds": 3},
        ]
        self.attempt = 0

    def round(self, number: int, steps: int) -> None:
        self.events.append({"type": "scale", "counts": [1, 2], "unit": "replicas",
                            "mode": "weak", "steps": steps, "cores": 8, "rounds": 3,
                            "round": number, "message": "not enough steps to tell (70-90%)"})

    def count(self, count: int, steps: int, step_ms: float, end: str = "relaunching",
              ran: int | None = None) -> None:
        """An attempt at `count`: `ran` steps (default all) of step_ms, then its end: the
        status "relaunching" or "finished" after done (max_steps), "running" (none yet),
        or "stopped" (stopped before its steps)."""
        self.attempt += 1
        attempt, batch = self.attempt, 64 * count
        self.events.append({"type": "attempt", "attempt": attempt, "fresh": True,
                            "reason": "scale", "settings": _settings(count, batch, steps)})
        for step in range(1, (steps if ran is None else ran) + 1):
            self.events.append({"type": "step", "attempt": attempt, "step": step,
                                "micro_step": step, "epoch": 0, "loss": 1.0, "lr": 1e-3,
                                "examples": batch, "step_time_ms": step_ms,
                                "input_wait_ms": 0.0, "grad_sync_bytes": 0.0})
        if end in ("relaunching", "finished"):
            self.events.append({"type": "done", "attempt": attempt, "reason": "max_steps",
                                "step": steps})
        if end != "running":
            self.events.append({"type": "status", "attempt": attempt, "status": end})

    def state(self) -> RunState:
        state = RunState()
        for seq, event in enumerate(self.events):
            state.apply({"v": 1, "seq": seq, "t": 1000.0 + seq, **event})
        assert state.bad_events == 0
        return state


def test_a_finished_probes_rows_are_its_last_rounds() -> None:
    record = Record([1, 2], 20)
    record.count(1, 20, 10.0)
    record.count(2, 20, 16.0)
    record.round(2, 40)
    record.count(1, 40, 10.0)
    record.count(2, 40, 12.5, end="finished")
    rows = scaling_rows(record.state())
    assert [(r.count, r.attempt, r.state, r.measured_steps) for r in rows] == [
        (1, 3, "measured", 40 - WARMUP_STEPS), (2, 4, "measured", 40 - WARMUP_STEPS)]
    assert rows[1].efficiency == pytest.approx(0.8)  # 128/12.5 over 2 x 64/10: round 2's


def test_while_a_round_runs_a_count_it_has_not_reached_shows_the_round_before() -> None:
    record = Record([1, 2], 20)
    record.count(1, 20, 10.0)
    record.count(2, 20, 16.0)
    record.round(2, 40)
    record.count(1, 40, 10.0, end="running", ran=12)
    rows = scaling_rows(record.state())
    assert [(r.count, r.attempt, r.state) for r in rows] == [(1, 3, "running"),
                                                            (2, 2, "measured")]


def test_a_round_stopped_part_way_keeps_the_round_befores_figures() -> None:
    record = Record([1, 2], 20)
    record.count(1, 20, 10.0)
    record.count(2, 20, 16.0)
    record.round(2, 40)
    record.count(1, 40, 10.0)
    record.count(2, 40, 12.5, end="stopped", ran=8)
    state = record.state()
    rows = scaling_rows(state)
    # 2 replicas: round 2's attempt was stopped short, so round 1's measure stands; the
    # rows then come from two rounds, each count's attempt measured whole.
    assert [(r.count, r.attempt, r.state) for r in rows] == [(1, 3, "measured"),
                                                            (2, 2, "measured")]
    assert rows[1].efficiency == pytest.approx(0.625)  # 128/16 over 2 x 64/10
    # A count that never measured says how its latest attempt ended.
    only = Record([1, 2], 20)
    only.count(1, 20, 10.0)
    only.count(2, 20, 16.0, end="stopped", ran=3)
    assert [(r.count, r.state) for r in scaling_rows(only.state())] == [
        (1, "measured"), (2, "stopped")]


def test_an_attempt_reached_its_steps_only_when_it_ended_there_measured() -> None:
    record = Record([1, 2], 20)
    record.count(1, 20, 10.0)
    record.count(2, 20, 16.0, end="stopped", ran=8)
    record.count(1, 20, 10.0, end="running", ran=20)
    state = record.state()
    assert reached_its_steps(state.attempts[1])
    assert not reached_its_steps(state.attempts[2])  # stopped at step 8
    assert not reached_its_steps(state.attempts[3])  # all its steps, but no done yet
    assert not reached_its_steps(None)
    short = Record([1, 2], 20)  # a trainer that says max_steps at step 3 of 20
    short.count(1, 20, 10.0, ran=3)
    assert not reached_its_steps(short.state().attempts[1])


# ---- the words ------------------------------------------------------------------------


def test_a_later_round_is_said_as_it_begins_and_described_with_its_number() -> None:
    plan = Scale(counts=[1, 2], steps=20, rounds=3)
    assert round_words(plan) is None
    assert describe(plan) == ("weak scaling (the per-replica batch kept) over replicas 1,2: "
                              "20 steps each (round 1 of up to 3), measured after the first 5")
    second = next_round(plan, "not enough steps to tell (71-91%): 80% efficiency at 2 replicas")
    assert round_words(second) == (
        "not enough steps to tell (71-91%): 80% efficiency at 2 replicas; round 2 of 3: every "
        "count again, 40 steps each")
    assert describe(second).endswith("40 steps each (round 2 of up to 3), measured after the "
                                     "first 5")
    assert describe(Scale(counts=[1, 2], steps=20)).endswith(": 20 steps each, measured after "
                                                             "the first 5")  # one round
    # Headless prints a line for each later round in what it receives, the first none.
    frames = [event_frame(p) for p in (plan, second, next_round(second, "x"))]
    assert round_lines([{"type": "step"}, *frames]) == [
        f"gpuwatch: {round_words(second)}", "gpuwatch: x; round 3 of 3: every count again, "
        "80 steps each"]
    assert round_lines([{**frames[1], "message": "\x1b[2Jbad"}])[0].startswith("gpuwatch: ?[2Jbad;")
