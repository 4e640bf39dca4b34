"""Every command's --help ends with examples, and every example is a command line the
parser takes as that command (as the README's own examples are, in test_readme.py)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from gpuwatch.cli import parse_words
from gpuwatch.cli.parser import EXAMPLES, build_parser


def _subcommands() -> list[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return sorted(sub.choices)  # type: ignore[arg-type]


def test_every_command_and_the_top_level_have_examples():
    assert sorted(EXAMPLES) == sorted(["gpuwatch", *_subcommands()])
    assert all(EXAMPLES[name] for name in EXAMPLES)


@pytest.mark.parametrize(
    ("command", "line"),
    [(command, line) for command, examples in EXAMPLES.items() for line, _ in examples],
)
def test_each_example_parses_as_its_command(command, line):
    words = shlex.split(line)
    assert words[0] == "gpuwatch"
    args = parse_words(build_parser(), words[1:])
    assert args.command == (words[1] if command == "gpuwatch" else command)
    if args.command == "run":  # the script is everything after --, never an option of ours
        assert args.argv == words[words.index("--") + 1 :] and args.argv[0] == "python"


@pytest.mark.parametrize("command", ["gpuwatch", "train", "run", "export"])
def test_help_shows_the_examples_line_by_line(command):
    argv = [sys.executable, "-m", "gpuwatch"] + ([] if command == "gpuwatch" else [command])
    shown = subprocess.run([*argv, "--help"], capture_output=True, text=True, check=True)
    text = shown.stdout
    assert "\nexamples:\n" in text
    for line, what in EXAMPLES[command]:
        assert f"\n  {line}\n      {what}\n" in text or text.endswith(f"\n  {line}\n      {what}\n")


def test_the_description_still_wraps_to_the_terminal():
    text = build_parser()._subparsers._group_actions[0].choices["scale"].format_help()  # type: ignore[union-attr]
    assert max(len(line) for line in text.splitlines()) <= 100
