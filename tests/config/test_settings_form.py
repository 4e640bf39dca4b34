"""The settings screen's form (config/settings_form.py): text in, pending settings or lines out."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from gpuwatch.config import ConfigError, load_config
from gpuwatch.config.settings_form import (
    FORM_KEYS,
    GENERAL,
    LIVE_FORM_KEYS,
    RELAUNCH_FORM_KEYS,
    FormRefused,
    form_texts,
    read_form,
)
from gpuwatch.config.words import accepts
from gpuwatch.runstate import SettingRefused, check_pending, get_setting, pending_applies_live
from tests.support.command_run import command_settings
from trainer_runtime.changes import LIVE_KEYS, command_setting_refusal
from trainer_runtime.schema import RunConfig

# As an attempt event carries them: the demo's run (a 40 ms read, batch 256), 2 replicas.
SETTINGS: dict[str, Any] = RunConfig.model_validate(
    {"data": {"read_latency_ms": 40.0}, "train": {"global_batch_size": 256}}
).model_dump(mode="json")
REPLICAS = 2
TEXTS = {
    "data.read_latency_ms": "40.0",
    "data.decode_cost": "0",
    "data.prefetch": "off",
    "data.parallel_calls": "1",
    "data.cache": "off",
    "train.global_batch_size": "256",
    "train.accumulation_steps": "1",
    "train.steps_per_execution": "1",
    "train.jit_compile": "off",
    "train.mixed_precision": "float32",
}


def refused(texts: dict[str, str], pending: dict[str, Any] | None = None) -> dict[str, str]:
    with pytest.raises(FormRefused) as caught:
        read_form(SETTINGS, pending or {}, {**TEXTS, **texts}, REPLICAS)
    return caught.value.errors


def test_the_form_has_every_live_setting_in_the_schemas_order_then_the_relaunch_ones():
    assert set(LIVE_FORM_KEYS) == LIVE_KEYS
    assert FORM_KEYS == LIVE_FORM_KEYS + RELAUNCH_FORM_KEYS
    assert RELAUNCH_FORM_KEYS == (
        "train.steps_per_execution", "train.jit_compile", "train.mixed_precision"
    )
    assert not set(RELAUNCH_FORM_KEYS) & LIVE_KEYS  # each takes a relaunch
    assert tuple(TEXTS) == FORM_KEYS


def test_relaunch_settings_read_as_the_config_file_reads_them_and_make_r_relaunch():
    texts = {**TEXTS, "train.steps_per_execution": "8", "train.jit_compile": "on",
             "train.mixed_precision": "mixed_bfloat16"}
    pending = read_form(SETTINGS, {}, texts, REPLICAS)
    assert pending == {"train.steps_per_execution": 8, "train.jit_compile": True,
                       "train.mixed_precision": "mixed_bfloat16"}
    assert not pending_applies_live(SETTINGS, pending, running=True)
    # A live key with them: all pending together, and r relaunches with all of them.
    both = read_form(SETTINGS, {}, {**TEXTS, "train.steps_per_execution": "8",
                                    "data.parallel_calls": "4"}, REPLICAS)
    assert both == {"data.parallel_calls": 4, "train.steps_per_execution": 8}
    assert not pending_applies_live(SETTINGS, both, running=True)
    assert pending_applies_live(SETTINGS, {"data.parallel_calls": 4}, running=True)


def test_relaunch_settings_are_bounded_by_the_schema_one_line_each():
    assert refused({"train.steps_per_execution": "0", "train.jit_compile": "maybe",
                    "train.mixed_precision": "float8", "data.parallel_calls": "4"}) == {
        "train.steps_per_execution": "train.steps_per_execution: must be at least 1 (got 0)",
        "train.jit_compile": "train.jit_compile: must be true or false (got 'maybe')",
        "train.mixed_precision": "train.mixed_precision: must be one of 'float32', "
                                 "'mixed_float16' or 'mixed_bfloat16' (got 'float8'); did you "
                                 "mean 'float32'?",
    }


def test_a_record_without_a_relaunch_setting_shows_the_schemas_default():
    older = copy.deepcopy(SETTINGS)
    del older["train"]["jit_compile"], older["train"]["mixed_precision"]
    assert form_texts(older, {}) == TEXTS
    assert read_form(older, {}, TEXTS, REPLICAS) == {}


def test_a_command_run_refuses_what_its_script_decides_as_relaunch_says_it():
    own = command_settings()
    texts = form_texts(own, {})
    assert read_form(own, {}, texts, 1) == {}
    assert read_form(own, {}, {**texts, "data.prefetch": "on"}, 1) == {"data.prefetch": True}
    with pytest.raises(FormRefused) as caught:
        read_form(own, {}, {**texts, "train.steps_per_execution": "8",
                            "train.global_batch_size": "512"}, 1)
    assert caught.value.errors == {
        key: f"{key}: {command_setting_refusal(key)}"
        for key in ("train.global_batch_size", "train.steps_per_execution")
    }


def test_what_each_field_takes_is_said_from_the_schema():
    assert accepts("data.parallel_calls") == "'autotune' or an integer from 1 to 256"
    assert accepts("data.prefetch") == "true, false, 'autotune' or an integer from 1 to 1024"
    assert accepts("data.cache") == "true or false"
    assert accepts("data.read_latency_ms") == "a number from 0.0 to 60000.0"
    # Not one value, or no such setting: nothing to say.
    assert accepts("data") == accepts("model.hidden_units") == accepts("data.nope") == ""


def test_texts_are_the_running_values_and_pending_ones_win():
    assert form_texts(SETTINGS, {}) == TEXTS
    pending = {"data.prefetch": True, "train.global_batch_size": 512, "data.cache": True}
    texts = form_texts(SETTINGS, pending)
    assert (texts["data.prefetch"], texts["train.global_batch_size"]) == ("on", "512")
    assert texts["data.cache"] == "on"


def test_unchanged_texts_are_no_change():
    assert read_form(SETTINGS, {}, TEXTS, REPLICAS) == {}
    # Other spellings of the running values are no change either.
    same = {"data.read_latency_ms": "40", "data.prefetch": "false", "data.cache": "no"}
    assert read_form(SETTINGS, {}, {**TEXTS, **same}, REPLICAS) == {}


def test_values_are_read_as_the_config_file_reads_them():
    texts = {
        **TEXTS,
        "data.read_latency_ms": "15",
        "data.parallel_calls": "auto",
        "data.prefetch": "4",
        "data.cache": "on",
        "train.accumulation_steps": "2",
    }
    assert read_form(SETTINGS, {}, texts, REPLICAS) == {
        "data.read_latency_ms": 15.0,
        "data.parallel_calls": "autotune",
        "data.prefetch": 4,
        "data.cache": True,
        "train.accumulation_steps": 2,
    }


def test_pending_settings_outside_the_form_are_kept_and_a_field_set_back_drops_its_own():
    pending = {"data.prefetch": True, "train.learning_rate": 0.01}
    texts = {**form_texts(SETTINGS, pending), "data.prefetch": "off"}
    assert read_form(SETTINGS, pending, texts, REPLICAS) == {"train.learning_rate": 0.01}


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("data.parallel_calls", "0"),
        ("data.parallel_calls", "257"),
        ("data.read_latency_ms", "fast"),
        ("data.read_latency_ms", "-1"),
        ("data.read_latency_ms", ".inf"),
        ("data.decode_cost", "99999999999999999999"),
        ("data.decode_cost", "1" * 101),
        ("data.decode_cost", "true"),
        ("data.prefetch", "sometimes"),
        ("data.prefetch", "[1,"),
        ("data.cache", "maybe"),
        ("train.global_batch_size", ""),
        ("train.accumulation_steps", "1.5"),
        ("train.steps_per_execution", "1001"),
        ("train.steps_per_execution", "auto"),
        ("train.jit_compile", "2"),
        ("train.mixed_precision", "fp16"),
    ],
)
def test_a_bad_field_gets_the_config_loaders_own_line(key, text, tmp_path):
    # Ground truth: what `gpuwatch train --set key=text` says about the same value.
    config = tmp_path / "run.yaml"
    config.write_text("data:\n  read_latency_ms: 40.0\n")
    with pytest.raises(ConfigError) as loaded:
        load_config(config, [f"{key}={text}"])
    assert loaded.value.source is not None
    expected = str(loaded.value).removeprefix(f"{loaded.value.source}: ")
    assert refused({key: text}) == {key: expected}


def test_bounds_read_in_plain_words():
    assert refused({"data.parallel_calls": "0"}) == {
        "data.parallel_calls": "data.parallel_calls: must be 'autotune' or an integer from 1 "
        "to 256 (got 0)"
    }
    assert refused({"data.read_latency_ms": "fast"}) == {
        "data.read_latency_ms": "data.read_latency_ms: must be a number (got 'fast')"
    }


def test_every_bad_field_gets_its_own_line_at_once():
    errors = refused(
        {
            "data.parallel_calls": "0",
            "data.read_latency_ms": "x",
            "data.cache": "[",
            "data.prefetch": "on",
        }
    )
    assert set(errors) == {"data.parallel_calls", "data.read_latency_ms", "data.cache"}


def test_a_date_is_not_a_value_and_says_so():
    # PyYAML builds 2001-13-01 as a date and raises ValueError: a line, not a traceback.
    assert refused({"data.prefetch": "2001-13-01"}) == {
        "data.prefetch": "data.prefetch: value is not valid YAML (month must be in 1..12)"
    }


def test_batch_that_does_not_split_over_the_replicas_is_under_the_batch():
    assert refused({"train.global_batch_size": "257"}) == {
        "train.global_batch_size": "train.global_batch_size 257 is not divisible by replicas x "
        "accumulation_steps = 2 x 1 = 2"
    }


def test_a_limit_across_settings_is_under_the_one_the_person_changed():
    # Accumulation 3 alone: the running batch 256 does not divide by it.
    assert refused({"train.accumulation_steps": "3"}) == {
        "train.accumulation_steps": "train.global_batch_size: 256 is not divisible by "
        "train.accumulation_steps 3"
    }
    # 256 / (2 replicas x 256) leaves a replica no example: the split, under accumulation.
    errors = refused({"train.accumulation_steps": "256"})
    assert list(errors) == ["train.accumulation_steps"]
    assert errors["train.accumulation_steps"].endswith("a replica would get no example")
    # Both changed and together wrong: one line, under the first the problem names.
    assert list(refused({"train.global_batch_size": "100", "train.accumulation_steps": "3"})) == [
        "train.global_batch_size"
    ]
    # Both changed and together right: no line (384 = 2 replicas x 3 x 64).
    texts = {**TEXTS, "train.global_batch_size": "384", "train.accumulation_steps": "3"}
    assert read_form(SETTINGS, {}, texts, REPLICAS) == {
        "train.global_batch_size": 384,
        "train.accumulation_steps": 3,
    }


def test_the_datas_limit_names_the_batch():
    errors = refused({"train.global_batch_size": "32768"})
    assert errors == {
        "train.global_batch_size": "train.global_batch_size: 32768 is more than data.examples "
        "16384: one update would need more examples than the data has"
    }


def test_settings_this_gpuwatch_cannot_read_are_one_general_line():
    with pytest.raises(FormRefused) as caught:
        read_form({"data": {"no_such_knob": 1}}, {}, TEXTS, REPLICAS)
    assert list(caught.value.errors) == [GENERAL]


# Text a person might type: numbers, words, YAML's odd corners, and anything at all.
_TYPED = st.one_of(
    st.integers(min_value=0, max_value=64).map(lambda n: str(n * 8)),  # often a usable value
    st.sampled_from(["on", "off", "auto", "autotune", "true", "no", "0.5", "12.5"]),
    st.text(max_size=40),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(
        [
            "on",
            "off",
            "auto",
            "autotune",
            "yes",
            "null",
            "~",
            "",
            "1e3",
            "0x10",
            "0o7",
            "1_0",
            "1:30",
            "2001-13-01",
            "!!float x",
            "!!int 0x",
            "&a [*a]",
            "{a: 1}",
            "[1, 2]",
            "'8'",
            "!!python/object:os.system",
            "1" * 120,
            "--- 1\n--- 2",
            "\t8",
            "8 # comment",
        ]
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    texts=st.dictionaries(st.sampled_from(FORM_KEYS), _TYPED, max_size=3),
    prefetch_pending=st.booleans(),
)
def test_any_text_in_any_field_is_a_setting_the_schema_takes_or_a_line(texts, prefetch_pending):
    pending: dict[str, Any] = {"data.prefetch": True} if prefetch_pending else {}
    try:
        result = read_form(SETTINGS, pending, {**form_texts(SETTINGS, pending), **texts}, REPLICAS)
    except FormRefused as refusal:
        event("refused")
        assert refusal.errors, "refused without a line"
        for key, line in refusal.errors.items():
            assert key in FORM_KEYS or key == GENERAL
            assert line and "\n" not in line and "Input should" not in line, line
            assert "pydantic" not in line and "Traceback" not in line, line
        return
    # Accepted: only real changes, and the run would start with them (the check `r`,
    # the p/a/b keys and the supervisor's relaunch make, not the form's own).
    event("accepted with changes" if result else "accepted, nothing changed")
    data = copy.deepcopy(SETTINGS)
    for key, value in result.items():
        assert get_setting(SETTINGS, key) != value, key
        section, _, name = key.partition(".")
        data[section][name] = value
    config = RunConfig.model_validate(data)  # the schema itself takes the new settings
    split = REPLICAS * config.train.accumulation_steps
    assert config.train.global_batch_size % split == 0, "the batch splits over the replicas"
    try:
        check_pending(SETTINGS, result, REPLICAS)
    except SettingRefused as exc:
        pytest.fail(f"the form took {result} but a relaunch refuses it: {exc}")
