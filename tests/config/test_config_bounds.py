"""Bounded config loading: no file, `--set` value or relaunch mapping costs over 1 s or 100 MB.

Each hostile input is loaded in a fresh interpreter that reports the CPU time of the load
call alone and its peak memory (ru_maxrss) just before and just after, so interpreter
start-up, imports and building the input are not counted and nothing else is. The second
is CPU time (the process's, which loads on one thread): what the load costs, whatever else
the box runs meanwhile, so these tests run beside the rest of the suite; its wall time is
bounded too, loosely (WALL_LIMIT_S), so a load that blocks instead of computing still fails.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.config import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_VALUES,
    MAX_NESTING_DEPTH,
    MAX_TEXT_CHARS,
    ConfigError,
    apply_overrides,
    dump_config,
    load_config,
    parse_override,
)
from tests.conftest import gpuwatch
from trainer_runtime.schema import RunConfig

ROOT = Path(__file__).resolve().parents[2]
TIME_LIMIT_S = 1.0  # CPU seconds of the load
# Wall seconds of the load: only a load that waits on something (it never should) comes
# near it; a 2-core box shared by the suite's workers stretches 1 CPU-second to a few.
WALL_LIMIT_S = 10.0
MEMORY_LIMIT_MB = 100.0

# Runs in a fresh interpreter: builds the input, then measures the one call that loads it.
PROBE = r"""
import json, resource, sys, time

from gpuwatch.config import ConfigError, apply_overrides, load_config, parse_override
from trainer_runtime.schema import RunConfig


def nested_mapping(levels):
    value = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def shared_lists(levels, width):  # width references to width references to ...: a DAG
    value = [1]
    for _ in range(levels):
        value = [value] * width
    return value


def self_containing_list():
    loop = []
    loop.append(loop)
    return loop


SETTINGS = {
    "nested_100000": lambda: {"model.kwargs": nested_mapping(100_000)},
    "shared_9_by_9": lambda: {"model.kwargs": {"x": shared_lists(9, 9)}},
    "self_containing": lambda: {"model.kwargs": {"x": self_containing_list()}},
    "million_keys": lambda: {f"model.kwargs.k{i}": i for i in range(1_000_000)},
}

kind, arg, overrides = json.loads(sys.stdin.read())
if kind == "file":
    call = lambda: load_config(arg, overrides)
elif kind == "set":
    call = lambda: parse_override(arg)
else:
    settings = SETTINGS[arg]()
    call = lambda: apply_overrides(RunConfig(), settings)


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


before_mb = peak_mb()
start, start_cpu = time.perf_counter(), time.process_time()
try:
    call()
    outcome, message = "loaded", ""
except ConfigError as err:
    outcome, message = "error", str(err)
cpu_s, wall_s = time.process_time() - start_cpu, time.perf_counter() - start
extra_mb = peak_mb() - before_mb
print(json.dumps({"outcome": outcome, "message": message, "cpu_s": cpu_s, "wall_s": wall_s,
                  "extra_mb": extra_mb}))
"""


@dataclass(frozen=True)
class Measured:
    outcome: str  # "loaded" or "error"
    message: str
    cpu_s: float  # the load call's CPU time
    wall_s: float  # and its wall time
    extra_mb: float


def measure(kind: str, arg: str, overrides: tuple[str, ...] = ()) -> Measured:
    """Load in a fresh interpreter; the CPU time, wall time and memory of the load call."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        input=json.dumps([kind, arg, list(overrides)]),  # stdin: argv has a length limit
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = Measured(**json.loads(proc.stdout.strip().splitlines()[-1]))
    assert result.cpu_s < TIME_LIMIT_S and result.wall_s < WALL_LIMIT_S, result
    assert result.extra_mb < MEMORY_LIMIT_MB, result
    return result


def one_line(message: str) -> str:
    assert message and "\n" not in message and "\r" not in message
    assert message == message.strip() and "Traceback" not in message
    assert len(message) < 300, message  # long keys and values are shortened
    return message


# ----------------------------------------------------------------------- hostile files


def laughs(levels: int = 9, width: int = 9, indent: str = "") -> str:
    """The billion laughs: each line a list of `width` aliases of the line before."""
    names = [chr(ord("a") + i) if levels <= 26 else f"l{i}" for i in range(levels)]
    lines = [f'{indent}{names[0]}: &{names[0]} "lol"']
    for prev, name in itertools.pairwise(names):
        lines.append(f"{indent}{name}: &{name} [" + ", ".join([f"*{prev}"] * width) + "]")
    return "\n".join(lines) + "\n"


def filled(unit: str, head: str = "", tail: str = "", size: int = MAX_CONFIG_BYTES) -> str:
    """head + unit repeated + tail, as close to `size` bytes as units allow, never over."""
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


@dataclass(frozen=True)
class Hostile:
    text: Callable[[], str]
    needle: str  # what the error says ("" when the file loads)
    line: int | None = None  # the line the error names; None: checked only to be a number
    has_line: bool = True


HOSTILE_FILES: dict[str, Hostile] = {
    # FACTS.md: 9 lines, 9^8 leaves; took 24 s and 3.5 GB before the bound.
    "billion_laughs_9_levels": Hostile(
        laughs, "e: has more than 5,000 keys and values once YAML aliases are expanded", 5
    ),
    "deeper_alias_bomb_40_levels_of_2": Hostile(
        lambda: laughs(levels=40, width=2), "once YAML aliases are expanded"
    ),
    "wider_alias_bomb_3_levels_of_100": Hostile(
        lambda: laughs(levels=3, width=100), "c: has more than 5,000 keys and values once", 3
    ),
    "alias_bomb_deeper_than_the_depth_limit": Hostile(
        lambda: "".join(
            f"l{i}: &l{i} [[[[[[[[*l{i - 1}]]]]]]]]\n" if i else "l0: &l0 [x]\n" for i in range(8)
        ),
        "l4[0][0][0][0][0][0][0][0]: is nested more than 32 levels deep once YAML aliases are",
        5,
    ),
    "bomb_under_a_known_key": Hostile(
        lambda: "model:\n  kwargs:\n" + laughs(indent="    "),
        "model.kwargs.e: has more than 5,000 keys and values once YAML aliases",
        7,
    ),
    "bomb_under_an_unknown_key": Hostile(
        lambda: "bogus:\n  kwargs:\n" + laughs(indent="    "),
        "bogus.kwargs.e: has more than 5,000 keys and values once YAML aliases",
        7,
    ),
    "merge_key_bomb": Hostile(
        lambda: (
            "m0: &m0 {a: 1, b: 2}\n"
            + "".join(
                f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}]}}\n" for i in range(1, 9)
            )
        ),
        "has more than 5,000 keys and values once YAML aliases are expanded",
    ),
    "100000_levels_of_brackets": Hostile(
        lambda: "model: {kwargs: {a: " + "[" * 100_000 + "]" * 100_000 + "}}\n",
        "too large for a config",
        has_line=False,
    ),
    "60000_levels_of_brackets_within_the_size_limit": Hostile(
        lambda: "model: {kwargs: {a: " + "[" * 60_000 + "]" * 60_000 + "}}\n",
        "the config is nested more than 32 levels deep",
        1,
    ),
    "100000_levels_of_flow_mappings": Hostile(
        lambda: "x: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n",
        "too large for a config",
        has_line=False,
    ),
    "25000_levels_of_flow_mappings_within_the_size_limit": Hostile(
        lambda: "x: " + "{a: " * 25_000 + "1" + "}" * 25_000 + "\n",
        "the config is nested more than 32 levels deep",
        1,
    ),
    "mixed_flow_nesting": Hostile(
        lambda: "x: " + "[{a: " * 18_000 + "1" + "}]" * 18_000 + "\n",
        "the config is nested more than 32 levels deep",
        1,
    ),
    "mixed_block_nesting": Hostile(
        lambda: "".join(
            "  " * level + ("- " if level % 2 else "") + "k:\n" for level in range(300)
        ),
        "the config is nested more than 32 levels deep",
    ),
    "one_byte_over_the_size_limit": Hostile(
        lambda: filled("#", "name: x\n", "\n", MAX_CONFIG_BYTES + 1),
        f"too large for a config ({MAX_CONFIG_BYTES + 1:,} bytes; the limit is "
        f"{MAX_CONFIG_BYTES:,})",
        has_line=False,
    ),
    "many_block_items_just_under_the_size_limit": Hostile(
        lambda: filled("- a\n", "x:\n"), "the config has more than 5,000 keys and values"
    ),
    "many_flow_items_just_under_the_size_limit": Hostile(
        lambda: filled("a,", "model: {kwargs: {x: [", "]}}\n"),
        "the config has more than 5,000 keys and values",
        1,
    ),
    "many_keys_just_under_the_size_limit": Hostile(
        lambda: (
            "model:\n  kwargs:\n"
            + "".join(f"    k{i}: 1\n" for i in range((MAX_CONFIG_BYTES - 20) // 13))
        ),
        "the config has more than 5,000 keys and values",
    ),
    "many_aliases_just_under_the_size_limit": Hostile(
        lambda: filled("*a,", "x: [&a a,", "]\n"), "the config has more than 5,000 keys"
    ),
    "very_long_scalar": Hostile(
        lambda: filled("a", "name: ", "\n"), "the config has more than 65,536 characters of text", 1
    ),
    # Under the text limit as read, over it once written with the defaults. In kwargs, since
    # the run name has a length limit of its own (trainer_runtime.schema.MAX_NAME_CHARS).
    "very_long_folded_scalar": Hostile(
        lambda: filled("a\n  ", "model: {kwargs: {t: ", "}}\n"),
        "65,536 characters of text",
        has_line=False,
    ),
    "comments_just_under_the_size_limit": Hostile(
        lambda: filled("# a comment line\n", "", "name: comments\n"), ""
    ),
    "long_base_60_number": Hostile(
        lambda: "name: 1:" + ":".join(["59"] * 40_000) + "\n",
        "name: is a number written with more than 100 characters",
        1,
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE_FILES))
def test_hostile_file_fails_or_loads_within_a_second_and_100_mb(tmp_path: Path, name: str) -> None:
    case = HOSTILE_FILES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(case.text(), encoding="utf-8")
    result = measure("file", str(path))
    if not case.needle:
        assert result.outcome == "loaded", result
        return
    assert result.outcome == "error", result
    message = one_line(result.message)
    assert case.needle in message
    if case.line is not None:
        assert message.startswith(f"{path}:{case.line}: "), message
    elif case.has_line:
        assert re.match(rf"{re.escape(str(path))}:\d+: ", message), message
    else:
        assert message.startswith(f"{path}: "), message


def test_the_largest_configs_that_load_take_under_a_second_and_load_again_once_written(
    tmp_path: Path,
) -> None:
    # The most values a config may have, nested as deep as allowed: written out in block
    # style its indentation alone would pass the size limit, so dump_config uses flow style.
    depth = MAX_NESTING_DEPTH - 3  # the top mapping, model, kwargs
    items = MAX_CONFIG_VALUES - 200  # room for the defaults every dump carries
    nested = "model:\n  kwargs:\n" + "".join("  " * (i + 2) + "a:\n" for i in range(depth - 1))
    flat = "model:\n  kwargs:\n    k: [" + ",".join(["1"] * items) + "]\n"
    texts = {
        "deep": nested + "  " * (depth + 1) + "x: [" + ",".join(["1"] * items) + "]\n",
        "flat": flat,
        "keys": "model:\n  kwargs:\n" + "".join(f"    k{i}: {i}\n" for i in range(items // 2)),
        "long_text": "model:\n  kwargs:\n    text: " + "a" * (MAX_TEXT_CHARS - 1000) + "\n",
    }
    for name, text in texts.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        result = measure("file", str(path))
        assert result.outcome == "loaded", (name, result)
        loaded = load_config(path)
        written = dump_config(loaded.config)
        assert len(written.encode()) <= MAX_CONFIG_BYTES
        again = tmp_path / f"{name}-written.yaml"
        again.write_text(written, encoding="utf-8")
        assert load_config(again).config == loaded.config


# ------------------------------------------------------------------------- --set values


def flow_laughs(levels: int = 9, width: int = 9) -> str:
    items = ["&a0 lol"]
    for level in range(1, levels):
        items.append(f"&a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "[" + ", ".join(items) + "]"


def test_set_value_bomb_fails_within_a_second_and_100_mb() -> None:
    text = "model.kwargs=" + flow_laughs()
    result = measure("set", text)
    assert result.outcome == "error"
    message = one_line(result.message)
    assert message.startswith("--set model.kwargs=[&a0 lol, ")
    assert "model.kwargs[4]: has more than 5,000 keys and values once YAML aliases" in message


def test_set_value_bomb_fails_the_load_within_a_second(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("name: fine\n")
    result = measure("file", str(path), ("model.kwargs=" + flow_laughs(),))
    assert result.outcome == "error"
    assert one_line(result.message).startswith("--set model.kwargs=")


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("[" * 30_000 + "]" * 30_000, "model.kwargs: is nested more than 32 levels deep"),
        ("[" * 100_000 + "]" * 100_000, "the value is longer than 65,536 characters"),
        ("[" + "a," * 30_000 + "]", "model.kwargs: has more than 5,000 keys and values"),
        ("&a [*a]", "model.kwargs[0]: a YAML alias refers to a node that contains it"),
    ],
    ids=["30000_brackets", "100000_brackets", "30000_items", "self_alias"],
)
def test_hostile_set_values_fail_within_a_second(value: str, needle: str) -> None:
    result = measure("set", f"model.kwargs={value}")
    assert result.outcome == "error"
    message = one_line(result.message)
    assert message.startswith("--set model.kwargs=") and needle in message


def test_many_set_values_share_one_budget(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("name: fine\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["name=x"] * (MAX_CONFIG_VALUES + 1))
    assert str(caught.value) == (
        "--set name=x: name: has more than 5,000 keys and values (counting the --set values)"
    )


def test_set_key_path_longer_than_the_depth_limit() -> None:
    key = ".".join(["a"] * (MAX_NESTING_DEPTH + 1))
    with pytest.raises(ConfigError) as caught:
        parse_override(f"{key}=1")
    assert one_line(str(caught.value)).endswith(": a key path of more than 32 names")


# -------------------------------------------------------------------- apply_overrides


@pytest.mark.parametrize(
    ("settings_name", "needle"),
    [
        ("nested_100000", "relaunch: model.kwargs.a.a.a."),
        ("shared_9_by_9", "relaunch: the mapping of settings has more than 5,000 keys"),
        ("self_containing", "relaunch: model.kwargs.x[0][0]"),
        ("million_keys", "relaunch: the mapping of settings has more than 5,000 keys"),
    ],
)
def test_hostile_relaunch_settings_fail_within_a_second_and_100_mb(
    settings_name: str, needle: str
) -> None:
    result = measure("apply", settings_name)
    assert result.outcome == "error"
    message = one_line(result.message)
    assert message.startswith(needle), message
    if "nested" in settings_name or "self" in settings_name:
        assert message.endswith("is nested more than 32 levels deep")


def test_relaunch_settings_that_push_the_config_over_the_limit() -> None:
    big = {f"k{i}": i for i in range(MAX_CONFIG_VALUES // 2 - 10)}
    with pytest.raises(ConfigError) as caught:
        apply_overrides(RunConfig(), {"model.kwargs": big})
    assert str(caught.value) == (
        "relaunch: the config, with its defaults, has more than 5,000 keys and values"
    )


def test_relaunch_number_too_long() -> None:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(RunConfig(), {"train.seed": 10**200})
    assert str(caught.value) == "relaunch: train.seed: is a number of more than 100 digits"


# -------------------------------------------------------------------- other bounded ends


def test_an_endless_device_is_refused_after_the_size_limit() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config("/dev/zero")
    assert str(caught.value) == "/dev/zero: too large for a config (more than 131,072 bytes)"


def test_a_merge_key_that_contains_itself(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  kwargs: &a\n    x: 1\n    <<: *a\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}:4: model.kwargs.<<: a YAML alias refers to a node that contains it"
    )


def test_a_normal_config_with_aliases_is_unaffected(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "model:\n  kwargs: &base {width: 3, layers: [1, 2, 3]}\n"
        "data:\n  kwargs: {<<: *base, depth: 2, again: *base}\n"
    )
    config = load_config(path).config
    assert config.data.kwargs == {
        "width": 3,
        "layers": [1, 2, 3],
        "depth": 2,
        "again": {"width": 3, "layers": [1, 2, 3]},
    }


def test_gpuwatch_train_refuses_a_bomb_with_one_line_and_exit_2(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(laughs())
    proc = gpuwatch("train", str(path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"gpuwatch: {path}:5: e: has more than 5,000 keys and values once YAML aliases are expanded"
    )
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


# ---------------------------------------------------------------- generated hostile YAML

# Where generated anchors are used: known keys of several types, and an unknown one.
# (model.kwargs holds the definitions; train is set last; no section is written twice.)
PLACES = [
    "data.kwargs", "data.input_shape", "name", "checkpoint.every_steps", "strategy.replicas",
    "command.argv", "command.cwd", "bogus.x",
]


@st.composite
def hostile_yaml(draw: st.DrawFn) -> str:
    """A config built from anchors, aliases of aliases, deep nesting and long scalars."""
    anchors: list[str] = []
    definitions: list[str] = []
    for index in range(draw(st.integers(0, 10))):
        shape = draw(st.sampled_from(["scalar", "long", "aliases", "nest", "map", "merge"]))
        if shape == "scalar" or (not anchors and shape in ("aliases", "map", "merge")):
            body = draw(st.sampled_from(["1", "lol", "true", "1:2:3", "-1.5", "null", "''"]))
        elif shape == "long":
            body = "x" * draw(st.integers(1, MAX_TEXT_CHARS + 100))
        elif shape == "aliases":
            width = draw(st.integers(1, 40))
            body = "[" + ", ".join(f"*{draw(st.sampled_from(anchors))}" for _ in range(width))
            body += "]"
        elif shape == "nest":
            levels = draw(st.integers(1, 3 * MAX_NESTING_DEPTH))
            inner = f"*{draw(st.sampled_from(anchors))}" if anchors else "1"
            body = "[" * levels + inner + "]" * levels
        elif shape == "map":
            width = draw(st.integers(1, 20))
            pairs = (f"k{i}: *{draw(st.sampled_from(anchors))}" for i in range(width))
            body = "{" + ", ".join(pairs) + "}"
        else:
            merged = draw(st.lists(st.sampled_from(anchors), min_size=1, max_size=9))
            body = "{<<: [" + ", ".join(f"*{name}" for name in merged) + "], extra: 1}"
        definitions.append(f"    d{index}: &n{index} {body}\n")
        anchors.append(f"n{index}")
    sections: dict[str, list[str]] = {}
    if anchors:
        for place in draw(st.lists(st.sampled_from(PLACES), max_size=4, unique=True)):
            section, _, key = place.partition(".")
            sections.setdefault(section, []).append(f"  {key}: *{draw(st.sampled_from(anchors))}\n")
    text = "model:\n  kwargs:\n" + "".join(definitions) if definitions else ""
    text += "".join(f"{section}:\n" + "".join(keys) for section, keys in sections.items())
    if draw(st.booleans()) or not text:
        text += f"train: {{global_batch_size: {draw(st.sampled_from([8, 0, 'x']))}}}\n"
    return text


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=hostile_yaml())
def test_generated_hostile_yaml_loads_or_fails_in_one_line_within_a_second(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(text, encoding="utf-8")
    # This thread's CPU time (the load runs on it), and its wall time, loosely.
    start, start_cpu = time.perf_counter(), time.thread_time()
    try:
        loaded = load_config(path)
    except ConfigError as err:
        cpu_s, wall_s = time.thread_time() - start_cpu, time.perf_counter() - start
        assert one_line(str(err)).startswith(str(path))
    else:
        cpu_s, wall_s = time.thread_time() - start_cpu, time.perf_counter() - start
        assert isinstance(loaded.config, RunConfig)
    assert cpu_s < TIME_LIMIT_S and wall_s < WALL_LIMIT_S, (cpu_s, wall_s, text[:300])


def test_a_base_60_key_is_refused_before_it_is_built(tmp_path: Path) -> None:
    path = tmp_path / "key.yaml"
    path.write_text("name: x\n? 1" + ":1" * 40_000 + "\n: 1\n")
    result = measure("file", str(path))
    assert result.outcome == "error" and result.cpu_s < TIME_LIMIT_S, result
    assert "a key is a number written with more than 100 characters" in result.message
