"""Tests for gpuwatch.config: YAML -> RunConfig, and errors that name file, key and line."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuwatch.config import (
    ConfigError,
    LoadedConfig,
    apply_overrides,
    check_replicas,
    dump_config,
    expected_replicas,
    format_override,
    load_config,
    parse_override,
)
from trainer_runtime.schema import RunConfig

GOOD = """\
name: demo
model:
  name: mlp
  hidden_units: [512, 256]
data:
  prefetch: off
  read_latency_ms: 5
  parallel_calls: 1
train:
  global_batch_size: 256
  accumulation_steps: 2
  learning_rate: 1e-3
strategy:
  cpu_replicas: 2
"""
# Lines in GOOD:      6: prefetch   7: read_latency_ms   10: global_batch_size
#                     11: accumulation_steps   12: learning_rate   14: cpu_replicas

HYPOTHESIS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def write(tmp_path: Path, text: str | bytes, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def load_error(path: Path | str, overrides: tuple[str, ...] = ()) -> str:
    """The message of the ConfigError that loading raises, checked to be one clean line."""
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides)
    return assert_clean(caught.value)


# A traceback's and pydantic's words, never ours (the input a message echoes may hold them).
NOT_OUR_WORDS = (
    "Traceback",
    "errors.pydantic.dev",
    "Input should be",
    "validation error",
    "Unable to parse",
    "should have at",
    "Value error,",
    "Field required",
)


def assert_clean(err: ConfigError) -> str:
    message = str(err)
    assert "\n" not in message and "\r" not in message
    assert message == message.strip() and message
    words = own_words(err)
    assert not [phrase for phrase in NOT_OUR_WORDS if phrase in words], message
    return message


def own_words(err: ConfigError) -> str:
    """The message without what it echoes of the input, which may say anything.

    A message is "SOURCE[:LINE[:COLUMN]]: [KEY: ]PROBLEM": SOURCE is the file or the --set
    (which repeats the override), KEY comes from the input, and PROBLEM shows the value it
    refuses after "got". The rest is the message's own words.
    """

    def spaced(text: str) -> str:  # ConfigError puts its message on one line
        return " ".join(text.split())

    words = str(err)
    if err.source and words.startswith(spaced(err.source)):
        words = re.sub(r"^(:\d+)*: ", "", words.removeprefix(spaced(err.source)))
    if err.key and words.startswith(f"{spaced(err.key)}: "):
        words = words.removeprefix(f"{spaced(err.key)}: ")
    return re.sub(r"\bgot\b.*", "got", words)


def test_own_words_leave_out_the_echoed_input_but_not_pydantic_phrasing() -> None:
    echo = "Input should be"
    ours = ConfigError(
        f"f.yaml:1: {echo}: must be an integer (got {echo!r})", source="f.yaml", key=echo
    )
    assert assert_clean(ours)
    leak = ConfigError(
        f"f.yaml:1: {echo}: Input should be a valid integer (got {echo!r})",
        source="f.yaml",
        key=echo,
    )
    assert "Input should be a valid integer" in own_words(leak)
    label = f"--set train.seed={echo}"
    leak = ConfigError(f"{label}: train.seed: Unable to parse (got {echo!r})", source=label)
    assert own_words(leak).startswith("train.seed: Unable to parse")


def replaced(tmp_path: Path, old: str, new: str) -> Path:
    assert old in GOOD
    return write(tmp_path, GOOD.replace(old, new))


# ------------------------------------------------------------------------- a good config


def test_good_config_loads_with_types_and_text(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    loaded = load_config(path)
    assert isinstance(loaded, LoadedConfig)
    assert isinstance(loaded.config, RunConfig)
    assert loaded.path == path
    assert loaded.text == GOOD
    assert loaded.config.name == "demo"
    assert loaded.config.model.hidden_units == [512, 256]
    assert loaded.config.train.global_batch_size == 256
    assert loaded.config.train.learning_rate == pytest.approx(1e-3)  # PyYAML reads 1e-3 as text


def test_yaml_on_and_off_are_booleans_for_prefetch(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "data: {prefetch: off}\n")).config.data.prefetch is False
    assert load_config(write(tmp_path, "data: {prefetch: on}\n")).config.data.prefetch is True
    auto = load_config(write(tmp_path, "data: {prefetch: autotune}\n")).config.data.prefetch
    assert auto == "autotune"


def test_minimal_mapping_takes_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "name: x\n")).config == RunConfig(name="x")


def test_merge_keys_and_aliases_are_allowed(tmp_path: Path) -> None:
    text = "model:\n  kwargs: &base {width: 3}\ndata:\n  kwargs:\n    <<: *base\n    depth: 2\n"
    config = load_config(write(tmp_path, text)).config
    assert config.data.kwargs == {"width": 3, "depth": 2}


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "\ufeffname: bom\n".encode())
    assert load_config(path).config.name == "bom"


# ------------------------------------------------------------------- reading the file


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert load_error(path) == f"{path}: no such file"


def test_an_empty_path_is_no_config_not_the_working_directory() -> None:
    # (Path("") is ".": it said ".: is a directory, not a config file".)
    assert load_error("") == "no config file given ('')"


def test_relative_path_is_named_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_error("demo/demo.yaml") == "demo/demo.yaml: no such file"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    assert load_error(tmp_path) == f"{tmp_path}: is a directory, not a config file"


def test_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, GOOD)

    def refuse(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    # Patched rather than chmod: tests may run as root, who reads everything.
    monkeypatch.setattr(Path, "read_bytes", refuse)
    assert load_error(path) == f"{path}: permission denied"


def test_non_utf8_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, b"name: ok\nmodel:\n  name: caf\xe9\n")
    assert load_error(path) == f"{path}:3: not UTF-8 text (byte 0xe9)"


def test_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    assert load_error(path) == f"{path}: empty config (expected a mapping of settings)"


def test_comment_only_file_is_empty(tmp_path: Path) -> None:
    path = write(tmp_path, "# nothing here\n\n")
    assert load_error(path) == f"{path}: empty config (expected a mapping of settings)"


def test_top_level_list(tmp_path: Path) -> None:
    path = write(tmp_path, "\n- name: a\n- name: b\n")
    assert load_error(path) == (
        f"{path}:2: the top level must be a mapping of settings (got a list)"
    )


def test_top_level_scalar(tmp_path: Path) -> None:
    path = write(tmp_path, "just words\n")
    assert load_error(path) == (
        f"{path}:1: the top level must be a mapping of settings (got the text 'just words')"
    )


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\ntrain:\n  global_batch_size: 4\n    accumulation_steps: 2\n")
    assert load_error(path) == (
        f"{path}:4:23: YAML syntax error: mapping values are not allowed here"
    )


def test_unclosed_flow_sequence(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  hidden_units: [512,\n")
    message = load_error(path)
    assert message.startswith(f"{path}:3:1: YAML syntax error: ")


def test_two_documents_are_a_syntax_error(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\n---\nname: b\n")
    assert load_error(path) == (
        f"{path}:2:1: YAML syntax error: but found another document "
        "(expected a single document in the stream)"
    )


def test_unprintable_character(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\nmodel: \x00\n")
    assert load_error(path) == f"{path}:2: YAML syntax error: unacceptable character #x0000"


def test_python_tags_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "name: !!python/object/apply:os.system ['true']\n")
    assert load_error(path).startswith(f"{path}:1:7: YAML syntax error: could not determine")


def test_recursive_alias(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\nmodel:\n  kwargs: &loop {again: *loop}\n")
    assert (
        load_error(path)
        == f"{path}:3: model.kwargs.again: a YAML alias refers to a node that contains it"
    )


def test_deep_nesting_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "model: {kwargs: {a: " + "[" * 5000 + "]" * 5000 + "}}\n")
    assert load_error(path) == f"{path}:1: the config is nested more than 32 levels deep"


# --------------------------------------------------------------------- duplicate keys


def test_duplicate_top_level_key_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "data:\n  cache: true\n")
    assert load_error(path) == f"{path}:15: data: duplicate key (first at line 5)"


def test_duplicate_nested_key_names_both_lines(tmp_path: Path) -> None:
    path = replaced(tmp_path, "  parallel_calls: 1\n", "  parallel_calls: 1\n  prefetch: on\n")
    assert load_error(path) == f"{path}:9: data.prefetch: duplicate key (first at line 6)"


def test_duplicate_key_spelled_differently(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  seed: 1\n  'seed': 2\n")
    assert load_error(path) == f"{path}:3: train.seed: duplicate key (first at line 2)"


# ------------------------------------------------------------------------ unknown keys


def test_unknown_nested_key_suggests_close_one(tmp_path: Path) -> None:
    path = replaced(tmp_path, "prefetch: off", "prefetc: off")
    assert load_error(path) == f"{path}:6: data.prefetc: unknown key; did you mean 'prefetch'?"


def test_unknown_section_suggests_close_one(tmp_path: Path) -> None:
    path = replaced(tmp_path, "train:", "trian:")
    assert load_error(path) == f"{path}:9: trian: unknown key; did you mean 'train'?"


def test_key_in_the_wrong_section_names_the_right_one(tmp_path: Path) -> None:
    path = replaced(tmp_path, "  learning_rate: 1e-3\n", "  learning_rate: 1e-3\n  prefetch: 2\n")
    assert load_error(path) == (
        f"{path}:13: train.prefetch: unknown key; did you mean 'data.prefetch'?"
    )


def test_unknown_key_with_nothing_close_lists_the_keys(tmp_path: Path) -> None:
    path = write(tmp_path, "checkpoint:\n  zzzz: 1\n")
    assert load_error(path) == (
        f"{path}:2: checkpoint.zzzz: unknown key (expected one of: every_steps, keep, enabled)"
    )


def test_non_string_key(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\n1: 2\n")
    assert load_error(path) == f"{path}:2: (top level): keys must be strings (got 1)"


def test_non_string_key_in_kwargs(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  kwargs:\n    3: x\n")
    assert load_error(path) == f"{path}:3: model.kwargs: keys must be strings (got 3)"


# -------------------------------------------------------------------------- wrong type


def test_integer_field_given_text(tmp_path: Path) -> None:
    path = replaced(tmp_path, "global_batch_size: 256", "global_batch_size: abc")
    assert load_error(path) == (
        f"{path}:10: train.global_batch_size: must be an integer (got 'abc')"
    )


def test_integer_field_given_fraction(tmp_path: Path) -> None:
    path = replaced(tmp_path, "global_batch_size: 256", "global_batch_size: 25.5")
    assert load_error(path) == (
        f"{path}:10: train.global_batch_size: must be a whole number (got 25.5)"
    )


def test_integer_field_given_boolean(tmp_path: Path) -> None:
    path = replaced(tmp_path, "accumulation_steps: 2", "accumulation_steps: yes")
    assert load_error(path) == f"{path}:11: train.accumulation_steps: must be a number, not true"


def test_boolean_is_not_a_number_even_where_one_would_be_out_of_range(tmp_path: Path) -> None:
    # pydantic's lax mode would read `yes` as 1, which is below data.classes' bound of 2.
    path = write(tmp_path, "data:\n  classes: yes\n")
    assert load_error(path) == f"{path}:2: data.classes: must be a number, not true"


def test_boolean_for_a_number_is_the_first_problem_in_file_order(tmp_path: Path) -> None:
    path = replaced(tmp_path, "accumulation_steps: 2", "accumulation_steps: yes")
    path.write_text(path.read_text().replace("cpu_replicas: 2", "cpu_replicas: 100"))
    assert load_error(path) == f"{path}:11: train.accumulation_steps: must be a number, not true"


def test_yaml_exponent_without_a_dot_is_still_a_number(tmp_path: Path) -> None:
    # YAML 1.1 reads `1e-3` as text; the schema keeps reading such text as a number.
    assert load_config(write(tmp_path, GOOD)).config.train.learning_rate == 0.001


def test_float_field_given_text(tmp_path: Path) -> None:
    path = replaced(tmp_path, "learning_rate: 1e-3", "learning_rate: fast")
    assert load_error(path) == f"{path}:12: train.learning_rate: must be a number (got 'fast')"


def test_bool_field_given_text(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\ntrain:\n  jit_compile: maybe\n")
    assert load_error(path) == f"{path}:3: train.jit_compile: must be true or false (got 'maybe')"


def test_string_field_given_number(tmp_path: Path) -> None:
    path = replaced(tmp_path, "name: demo", "name: 5")
    assert load_error(path) == f"{path}:1: name: must be a string (got 5)"


def test_section_given_scalar(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\ndata: 5\n")
    assert load_error(path) == f"{path}:2: data: must be a mapping of settings (got 5)"


def test_list_field_given_scalar(tmp_path: Path) -> None:
    path = replaced(tmp_path, "[512, 256]", "512")
    assert load_error(path) == f"{path}:4: model.hidden_units: must be a list (got 512)"


def test_choice_field_suggests_close_choice(tmp_path: Path) -> None:
    path = replaced(tmp_path, "name: mlp", "name: resnt")
    assert load_error(path) == (
        f"{path}:3: model.name: must be one of 'mlp', 'convnet' or 'resnet' (got 'resnt'); "
        "did you mean 'resnet'?"
    )


def test_prefetch_union_in_plain_words(tmp_path: Path) -> None:
    path = replaced(tmp_path, "prefetch: off", "prefetch: sometimes")
    assert load_error(path) == (
        f"{path}:6: data.prefetch: must be true, false, 'autotune' or an integer from 1 to "
        "1024 (got 'sometimes')"
    )


def test_factory_form(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  factory: not a factory\n")
    assert load_error(path) == (
        f"{path}:2: model.factory: factory must look like 'package.module:function', "
        "got 'not a factory'"
    )


FACTORY_CHARS = "abcXY_.:019 -\n\t$;/"


@HYPOTHESIS
@given(spec=st.text(alphabet=FACTORY_CHARS, max_size=30))
@example(spec="pkg.nets:build\n")
@example(spec="pkg.nets:build ")
def test_any_factory_text_is_a_whole_module_colon_function_or_refused(spec: str) -> None:
    """A factory is imported by name: the schema takes only 'package.module:function',
    whole (no trailing newline, space or other text), or refuses it in one line."""
    from trainer_runtime.schema import FACTORY_RE

    try:
        config = RunConfig.model_validate({"model": {"factory": spec}})
    except Exception as exc:  # pydantic's ValidationError: refused
        assert "factory" in str(exc)
        return
    taken = config.model.factory
    assert taken == spec and FACTORY_RE.fullmatch(taken)
    module, _, function = taken.partition(":")
    assert module and function and not set(taken) & set(" -\n\t$;/")


def test_a_factory_with_a_last_newline_is_refused(tmp_path: Path) -> None:
    """The form is the whole text: a regex's "$" would take "pkg.mod:fn\\n"."""
    path = write(tmp_path, 'model:\n  factory: "pkg.nets:build\\n"\n')
    assert load_error(path).startswith(f"{path}:2: model.factory: factory must look like")


# ----------------------------------------------------------------------- out of range


def test_batch_zero(tmp_path: Path) -> None:
    path = replaced(tmp_path, "global_batch_size: 256", "global_batch_size: 0")
    assert load_error(path) == f"{path}:10: train.global_batch_size: must be at least 1 (got 0)"


def test_accumulation_zero(tmp_path: Path) -> None:
    path = replaced(tmp_path, "accumulation_steps: 2", "accumulation_steps: 0")
    assert load_error(path) == f"{path}:11: train.accumulation_steps: must be at least 1 (got 0)"


def test_negative_latency(tmp_path: Path) -> None:
    path = replaced(tmp_path, "read_latency_ms: 5", "read_latency_ms: -5")
    assert load_error(path) == f"{path}:7: data.read_latency_ms: must be at least 0.0 (got -5)"


def test_infinite_latency(tmp_path: Path) -> None:
    path = replaced(tmp_path, "read_latency_ms: 5", "read_latency_ms: .inf")
    assert load_error(path) == f"{path}:7: data.read_latency_ms: must be a finite number (got .inf)"


def test_too_many_cpu_replicas(tmp_path: Path) -> None:
    path = replaced(tmp_path, "cpu_replicas: 2", "cpu_replicas: 100")
    assert load_error(path) == f"{path}:14: strategy.cpu_replicas: must be at most 64 (got 100)"


def test_list_item_out_of_range_names_the_item_line(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  hidden_units:\n    - 64\n    - 0\n")
    assert load_error(path) == f"{path}:4: model.hidden_units[1]: must be greater than 0 (got 0)"


def test_union_out_of_range(tmp_path: Path) -> None:
    path = replaced(tmp_path, "parallel_calls: 1", "parallel_calls: 0")
    assert load_error(path) == (
        f"{path}:8: data.parallel_calls: must be 'autotune' or an integer from 1 to 256 (got 0)"
    )


def test_first_problem_in_file_order_is_reported(tmp_path: Path) -> None:
    text = GOOD.replace("cpu_replicas: 2", "cpu_replicas: 0").replace(
        "read_latency_ms: 5", "read_latency_ms: -1"
    )
    path = write(tmp_path, text)
    assert load_error(path).startswith(f"{path}:7: data.read_latency_ms: ")


# ---------------------------------------------------------------------- divisibility


def test_batch_not_divisible_by_accumulation_points_at_batch(tmp_path: Path) -> None:
    path = replaced(tmp_path, "accumulation_steps: 2", "accumulation_steps: 3")
    assert load_error(path) == (
        f"{path}:10: train.global_batch_size: 256 is not divisible by train.accumulation_steps 3"
    )


def test_batch_default_not_divisible_points_at_accumulation(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\ntrain:\n  accumulation_steps: 3\n")
    assert load_error(path) == (
        f"{path}:3: train.global_batch_size: 256 is not divisible by train.accumulation_steps 3"
    )


def test_check_replicas_names_source_and_numbers(tmp_path: Path) -> None:
    loaded = load_config(
        write(tmp_path, GOOD.replace("global_batch_size: 256", "global_batch_size: 6"))
    )
    check_replicas(loaded.config, 3, "x")  # 6 = 3 x 2
    with pytest.raises(ConfigError, match="replicas must be at least 1"):
        check_replicas(loaded.config, 0, "x")
    with pytest.raises(ConfigError) as caught:
        check_replicas(loaded.config, 2, loaded.where("train.global_batch_size"))
    assert assert_clean(caught.value) == (
        f"{loaded.path}:10: train.global_batch_size 6 is not divisible by replicas x "
        "accumulation_steps = 2 x 2 = 4"
    )


def test_loaded_config_where_prefers_the_override(tmp_path: Path) -> None:
    loaded = load_config(write(tmp_path, GOOD), ["train.global_batch_size=64"])
    assert loaded.where("train.global_batch_size") == "--set train.global_batch_size=64"
    assert loaded.where("train.seed") == f"{loaded.path}:9"  # its parent's line
    assert loaded.where("data.prefetch") == f"{loaded.path}:6"


# ------------------------------------------------------------------------- overrides


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("train.global_batch_size=512", ("train.global_batch_size", 512)),
        ("data.prefetch=true", ("data.prefetch", True)),
        ("data.prefetch=off", ("data.prefetch", False)),
        ("data.prefetch=autotune", ("data.prefetch", "autotune")),
        ("model.hidden_units=[256, 128]", ("model.hidden_units", [256, 128])),
        ("train.learning_rate=0.01", ("train.learning_rate", 0.01)),
        ("name=a=b", ("name", "a=b")),
        (" train.max_steps = 5 ", ("train.max_steps", 5)),
        ("train.max_steps=", ("train.max_steps", None)),
        ("model.kwargs={width: 3}", ("model.kwargs", {"width": 3})),
    ],
)
def test_parse_override_types(text: str, expected: tuple[str, Any]) -> None:
    assert parse_override(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("data.prefetch", "--set data.prefetch: expected key.path=value (no '=')"),
        ("=3", "--set =3: expected key.path=value (empty key)"),
        ("  =3", "--set   =3: expected key.path=value (empty key)"),
        ("data..x=3", "--set data..x=3: data..x: a key path needs names between the dots"),
        (".x=3", "--set .x=3: .x: a key path needs names between the dots"),
    ],
)
def test_parse_override_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_override(text)
    assert assert_clean(caught.value) == " ".join(message.split())


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("2001-13-01", "month must be in 1..12"),  # YAML 1.1 reads it as a date
        ("!!int x", "invalid literal for int() with base 10: 'x'"),
        ("0x_", "invalid literal for int() with base 16: ''"),
        ("!!timestamp x", "cannot build this value"),  # PyYAML's own AttributeError
    ],
)
def test_parse_override_value_yaml_cannot_build_is_a_config_error(value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_override(f"data.prefetch={value}")
    assert assert_clean(caught.value) == (
        f"--set data.prefetch={value}: data.prefetch: value is not valid YAML ({problem})"
    )


@pytest.mark.parametrize(
    ("text", "line", "key", "shown", "problem"),
    [
        ("data:\n  prefetch: 2001-13-01\n", 2, "data.prefetch", "'2001-13-01' as timestamp",
         "month must be in 1..12"),
        ("data: {cache: on, prefetch: !!int x}\n", 1, "data.prefetch", "'x' as int",
         "invalid literal for int() with base 10: 'x'"),
        ("model:\n  hidden_units: [4, 0x_]\n", 2, "model.hidden_units[1]", "'0x_' as int",
         "invalid literal for int() with base 16: ''"),
        ("name: !!timestamp x\n", 1, "name", "'x' as timestamp", "cannot build this value"),
    ],
)
def test_a_file_value_yaml_cannot_build_names_its_line_and_key(
    tmp_path: Path, text: str, line: int, key: str, shown: str, problem: str
) -> None:
    path = write(tmp_path, text)
    assert load_error(path) == f"{path}:{line}: {key}: cannot read {shown} ({problem})"


SCALARS_YAML_MAY_NOT_BUILD = st.one_of(
    st.dates().map(str),
    st.from_regex(r"\A[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}\Z"),
    st.from_regex(r"\A0x[0-9a-fA-F_]{0,4}\Z"),
    st.from_regex(r"\A0b[01_]{0,4}\Z"),
    st.from_regex(r"\A[0-9_:]{1,8}\Z"),
    st.sampled_from(["!!int", "!!float", "!!timestamp", "!!bool", "!!binary"]).flatmap(
        lambda tag: st.text(alphabet="0123456789abx-:._ ", max_size=8).map(
            lambda v: f"{tag} {v}"
        )
    ),
)


@HYPOTHESIS
@given(
    value=SCALARS_YAML_MAY_NOT_BUILD,
    key=st.sampled_from(["data.prefetch", "train.global_batch_size", "name", "model.hidden_units"]),
)
def test_any_scalar_in_a_file_is_read_or_refused_with_its_line(
    tmp_path: Path, value: str, key: str
) -> None:
    section, _, leaf = key.rpartition(".")
    body = f"{leaf}: {value}\n" if not section else f"{section}:\n  {leaf}: {value}\n"
    path = write(tmp_path, body)
    try:
        load_config(path)
    except ConfigError as err:
        message = assert_clean(err)
        assert "cannot load config" not in message, message
        assert message.startswith(f"{path}:"), message


# What a dashboard's pending settings hold: JSON values (the relaunch command's overrides).
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8,
)


@given(json_values)
@example(1e-05)
@example(1e20)
@example("😀 on")
@example("on")
@example({"a": [True, None]})
def test_format_override_is_read_back_by_parse_override_exactly(value: Any) -> None:
    """A resume from the dashboard passes its pending settings as --set texts."""
    key, parsed = parse_override(format_override("data.prefetch", value))
    assert key == "data.prefetch"
    assert parsed == value and repr(parsed) == repr(value)  # 1 is not 1.0, -0.0 not 0.0


def test_parse_override_bad_yaml_value() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_override("model.hidden_units=[1,")
    assert assert_clean(caught.value).startswith(
        "--set model.hidden_units=[1,: model.hidden_units: value is not valid YAML ("
    )


def test_set_overrides_apply_with_types(tmp_path: Path) -> None:
    loaded = load_config(
        write(tmp_path, GOOD),
        [
            "data.prefetch=autotune",
            "train.global_batch_size=512",
            "model.hidden_units=[128, 64]",
            "model.hidden_units.1=32",
            "train.max_steps=10",
            "checkpoint.enabled=no",
        ],
    )
    config = loaded.config
    assert config.data.prefetch == "autotune"
    assert config.train.global_batch_size == 512
    assert config.model.hidden_units == [128, 32]
    assert config.train.max_steps == 10
    assert config.checkpoint.enabled is False
    assert loaded.text == GOOD  # the file as read, not as overridden


def test_set_wrong_type_names_the_override(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    assert load_error(path, ("train.global_batch_size=abc",)) == (
        "--set train.global_batch_size=abc: train.global_batch_size: must be an integer (got 'abc')"
    )


def test_set_unknown_key_suggests(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    assert load_error(path, ("data.prefetc=true",)) == (
        "--set data.prefetc=true: data.prefetc: unknown key; did you mean 'prefetch'?"
    )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.lists(st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True), min_size=1, max_size=5),
    known=st.sampled_from(["", "train.", "data.", "model.", "strategy.", "checkpoint."]),
)
@example(path=["trian", "max_steps"], known="")  # the issue's own: it blamed the file
def test_an_unknown_key_at_any_depth_of_a_set_names_the_set(
    tmp_path: Path, path: list[str], known: str
) -> None:
    """Whatever the depth of the wrong key a --set makes, the error names that --set, never
    the file (which has no such key)."""
    dotted = known + ".".join(path)
    override = f"{dotted}=1"
    try:
        load_config(write(tmp_path, GOOD), (override,))
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(f"--set {override}: "), message
        assert str(tmp_path) not in message, message


def test_set_out_of_range(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    assert load_error(path, ("train.accumulation_steps=0",)) == (
        "--set train.accumulation_steps=0: train.accumulation_steps: must be at least 1 (got 0)"
    )


def test_set_breaking_divisibility_names_the_override(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    assert load_error(path, ("train.accumulation_steps=3",)) == (
        "--set train.accumulation_steps=3: train.global_batch_size: 256 is not divisible by "
        "train.accumulation_steps 3"
    )


def test_set_can_fix_a_file_problem(tmp_path: Path) -> None:
    path = replaced(tmp_path, "accumulation_steps: 2", "accumulation_steps: 3")
    loaded = load_config(path, ["train.global_batch_size=384"])
    assert loaded.config.train.global_batch_size == 384


def test_set_inside_a_scalar(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    assert load_error(path, ("name.first=x",)) == (
        "--set name.first=x: name: is not a mapping (got 'demo'), so it has no key 'first'"
    )


def test_set_list_item_out_of_range(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    assert load_error(path, ("model.hidden_units.5=7",)) == (
        "--set model.hidden_units.5=7: model.hidden_units: no item 5 in a list of 2"
    )


def test_file_errors_come_before_override_errors(tmp_path: Path) -> None:
    path = replaced(tmp_path, "cpu_replicas: 2", "cpu_replicas: 0")
    assert load_error(path, ("train.seed=x",)).startswith(f"{path}:14: strategy.cpu_replicas:")


def test_bad_override_syntax_fails_load(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    assert load_error(path, ("prefetch",)) == "--set prefetch: expected key.path=value (no '=')"


# -------------------------------------------------------------------- apply_overrides


def test_apply_overrides_validates_and_leaves_original() -> None:
    base = RunConfig()
    new = apply_overrides(base, {"data.prefetch": True, "train.accumulation_steps": 4})
    assert new.data.prefetch is True and new.train.accumulation_steps == 4
    assert base.data.prefetch is False and base.train.accumulation_steps == 1


def test_apply_overrides_coerces_text_like_the_file() -> None:
    new = apply_overrides(RunConfig(), {"train.global_batch_size": "512", "data.prefetch": "on"})
    assert new.train.global_batch_size == 512 and new.data.prefetch is True


def test_apply_overrides_unknown_key_names_source() -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(RunConfig(), {"data.prefech": True})
    assert assert_clean(caught.value) == (
        "relaunch: data.prefech: unknown key; did you mean 'prefetch'?"
    )


def test_apply_overrides_out_of_range_with_custom_source() -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(RunConfig(), {"train.global_batch_size": 0}, source="dashboard")
    assert assert_clean(caught.value) == (
        "dashboard: train.global_batch_size: must be at least 1 (got 0)"
    )


def test_apply_overrides_divisibility() -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(RunConfig(), {"train.accumulation_steps": 3})
    assert assert_clean(caught.value) == (
        "relaunch: train.global_batch_size: 256 is not divisible by train.accumulation_steps 3"
    )


def test_apply_overrides_empty_key() -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(RunConfig(), {"": 1})
    assert assert_clean(caught.value).startswith("relaunch: ")


# ------------------------------------------------------------------------ dump_config


def test_dump_round_trips_defaults(tmp_path: Path) -> None:
    config = RunConfig()
    assert load_config(write(tmp_path, dump_config(config))).config == config


def test_dump_round_trips_a_loaded_config(tmp_path: Path) -> None:
    text = GOOD.replace("learning_rate: 1e-3", "learning_rate: 1e-3\n  epochs: 3\n  max_steps: 100")
    text = text.replace("prefetch: off", "prefetch: autotune")
    config = apply_overrides(
        load_config(write(tmp_path, text)).config,
        {"model.kwargs": {"when": "2024-01-01", "on": "yes", "n": [1, 2.5, None]}},
    )
    dumped = dump_config(config)
    again = load_config(write(tmp_path, dumped, "attempt-1.yaml"))
    assert again.config == config
    assert dump_config(again.config) == dumped


def test_dump_has_every_key(tmp_path: Path) -> None:
    data = yaml.safe_load(dump_config(RunConfig()))
    assert set(data) == set(RunConfig.model_fields)
    assert set(data["train"]) == set(type(RunConfig().train).model_fields)


override_values = st.one_of(
    st.booleans(),
    st.integers(min_value=1, max_value=1024),
    st.just("autotune"),
)


@HYPOTHESIS
@given(
    prefetch=override_values,
    accumulation=st.sampled_from([1, 2, 4, 8]),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_dump_round_trips_any_valid_config(
    tmp_path: Path, prefetch: Any, accumulation: int, seed: int
) -> None:
    config = apply_overrides(
        RunConfig(),
        {
            "data.prefetch": prefetch,
            "train.accumulation_steps": accumulation,
            "train.seed": seed,
        },
    )
    assert load_config(write(tmp_path, dump_config(config))).config == config


# ------------------------------------------------------------------ expected_replicas


def fake_nvml(monkeypatch: pytest.MonkeyPatch, count: int, *, init_fails: bool = False) -> None:
    module = types.ModuleType("pynvml")

    def init() -> None:
        if init_fails:
            raise RuntimeError("NVML Shared Library Not Found")

    module.nvmlInit = init  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda index: index  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda handle: f"GPU-{handle}abc"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", module)


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, 4),
        ("0,2", 2),
        ("3", 1),
        ("", 3),  # CUDA hides every GPU: the CPU replicas
        ("-1", 3),
        ("0,9,1", 1),  # CUDA stops at the first device it cannot find
        ("GPU-1,GPU-2", 2),
        ("GPU-nope", 3),
        ("1,1", 3),  # CUDA refuses a device named twice
    ],
)
def test_expected_replicas_honours_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, expected: int
) -> None:
    fake_nvml(monkeypatch, 4)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    config = apply_overrides(RunConfig(), {"strategy.cpu_replicas": 3})
    assert expected_replicas(config) == expected


def test_expected_replicas_without_nvml_uses_cpu_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml(monkeypatch, 4, init_fails=True)
    assert expected_replicas(RunConfig()) == 2


def test_expected_replicas_without_pynvml_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    assert expected_replicas(RunConfig()) == 2


# --------------------------------------------------------- never anything but one line


BAD_INPUTS: list[str | bytes] = [
    "",
    "- 1\n",
    "a: [\n",
    "name: a\nname: b\n",
    "data: {prefetc: 1}\n",
    "train: {global_batch_size: x}\n",
    "train: {global_batch_size: 0}\n",
    "train: {global_batch_size: 10, accumulation_steps: 3}\n",
    "data: {read_latency_ms: -1}\n",
    "model: {name: [1, 2]}\n",
    "model: {kwargs: {? [a] : 1}}\n",
    "'multi\n  line': 1\n",
    "name: 2024-01-01\n",
    b"\xff\xfe",
]


@pytest.mark.parametrize("text", BAD_INPUTS)
def test_messages_are_one_line_without_traceback_or_pydantic_url(
    tmp_path: Path, text: str | bytes
) -> None:
    path = write(tmp_path, text)
    message = load_error(path)
    assert message.startswith(str(path))


# A YAML-ish mapping built from real key names, so generated files reach validation.
SECTION_KEYS = {
    name: [*info.annotation.model_fields, "bogus"]
    for name, info in RunConfig.model_fields.items()
    if isinstance(info.annotation, type) and hasattr(info.annotation, "model_fields")
}
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["autotune", "on", "off", "mlp", "adam", "pkg.mod:fn"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
sections = st.fixed_dictionaries(
    {},
    optional={
        name: st.dictionaries(st.sampled_from(keys), values, max_size=4) | values
        for name, keys in SECTION_KEYS.items()
    },
)


@HYPOTHESIS
@given(data=sections)
def test_load_raises_only_config_error_on_generated_configs(
    tmp_path: Path, data: dict[str, Any]
) -> None:
    path = write(tmp_path, yaml.safe_dump(data))
    try:
        loaded = load_config(path)
    except ConfigError as err:
        assert assert_clean(err).startswith(str(path))
    else:
        assert isinstance(loaded.config, RunConfig)


@HYPOTHESIS
@given(text=st.text(max_size=300))
# Text that says pydantic's words itself, echoed back as a value, a key and a key of an alias.
@example(text="Input should be")
@example(text="Input should be: 1")
@example(text="model: {name: Input should be, factory: Input should be}")
@example(text="Input should be: &loop [*loop]")
@example(text="Traceback:\n  name: x")
def test_load_raises_only_config_error_on_random_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "random.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_config(path)
    except ConfigError as err:
        assert_clean(err)


@HYPOTHESIS
@given(raw=st.binary(max_size=300))
def test_load_raises_only_config_error_on_random_bytes(tmp_path: Path, raw: bytes) -> None:
    path = write(tmp_path, raw)
    try:
        load_config(path)
    except ConfigError as err:
        assert_clean(err)


@HYPOTHESIS
@given(
    key=st.one_of(
        st.text(max_size=20),
        st.sampled_from(["data.prefetch", "train.global_batch_size", "model.hidden_units.0"]),
    ),
    value=st.text(max_size=20),
)
@example(key="Input should be", value="1")
@example(key="train.seed", value="Input should be")
@example(key="Input should be..", value="1")
def test_random_overrides_raise_only_config_error(tmp_path: Path, key: str, value: str) -> None:
    path = write(tmp_path, GOOD)
    try:
        load_config(path, [f"{key}={value}"])
    except ConfigError as err:
        assert_clean(err)
    try:
        parse_override(key + value)
    except ConfigError as err:
        assert_clean(err)


@pytest.mark.parametrize(("text", "key", "read_as"), [
    ("train:\n  max_steps: 1:20\n", "train.max_steps", "int (YAML 1.1 reads it in base 60, as 80"),
    ("train:\n  learning_rate: 1:30.5\n", "train.learning_rate",
     "float (YAML 1.1 reads it in base 60, as 90.5"),
    ("name: 12:30\n", "name", "int (YAML 1.1 reads it in base 60, as 750"),
])
def test_a_base_60_number_is_refused_where_it_is_not_read_as_written(
    tmp_path: Path, text: str, key: str, read_as: str
) -> None:
    # (YAML 1.1 makes `1:20` the number 80: max_steps took 80 without a word.)
    path = write(tmp_path, text)
    value = text.split(": ")[-1].strip()
    assert load_error(path) == (
        f"{path}:{text.count(chr(10))}: {key}: cannot read {value!r} as {read_as}: write the "
        "number itself, or quote it for a string)")
    override = load_error(write(tmp_path, "name: x\n", "plain.yaml"), (f"{key}={value}",))
    assert override.startswith(f"--set {key}={value}: {key}: ") and "base 60" in override
    quoted = load_config(write(tmp_path, "name: '12:30'\n", "quoted.yaml")).config
    assert quoted.name == "12:30"


def test_a_key_missing_from_a_section_only_an_override_made_blames_that_override(
    tmp_path: Path,
) -> None:
    # (It named the file, which has no `command:` at all, and said pydantic's "Field required".)
    path = write(tmp_path, "name: x\n")
    assert load_error(path, ("command.argv=[ls]",)) == (
        "--set command.argv=[ls]: command.cwd: is required here")
    # A section the file does have keeps its own line.
    path = write(tmp_path, "name: x\ncommand:\n  argv: [ls]\n", "with_command.yaml")
    assert load_error(path) == f"{path}:2: command.cwd: is required here"
