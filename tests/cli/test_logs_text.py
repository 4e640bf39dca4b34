"""`gpuwatch logs` shows a run's log as text: colour at most, on a terminal; never another
control sequence; nothing raw in a pipe (gpuwatch/runstate/logtext.py)."""

from __future__ import annotations

import itertools
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.runstate.logtext import SGR_RESET, LogText
from tests.cli.test_run_folder_input import RUN_ID, ended_run
from tests.conftest import ROOT, gpuwatch

SGR = re.compile(r"\x1b\[[0-9;:]*m")
# What Keras' progress bar writes on a terminal (keras/src/utils/progbar.py): backspaces
# over the last bar, a carriage return, bold step counts, then the bar at the epoch's end.
KERAS_BAR = (b"Epoch 1/2\n"
             b"\x1b[1m 1/10\x1b[0m \x1b[32m\xe2\x94\x81\xe2\x94\x81\x1b[0m\x1b[37m\x1b[0m"
             b" \x1b[1m0s\x1b[0m 3ms/step - loss: 2.3"
             + b"\b" * 40 + b"\r"
             b"\x1b[1m10/10\x1b[0m \x1b[32m\xe2\x94\x81\xe2\x94\x81\x1b[0m\x1b[37m\x1b[0m"
             b" \x1b[1m0s\x1b[0m 3ms/step - loss: 2.1\n")
# Sequences a terminal acts on that are not colour: a window title (OSC, BEL- and
# ST-ended), clearing the screen, moving the cursor, a character set, a DCS string, the
# 8-bit CSI, a bell.
HOSTILE = (b"\x1b]0;owned\x07\x1b]2;also\x1b\\\x1b[2J\x1b[H\x1b[5;10H\x1b(0\x1bPq#0\x1b\\"
           b"\xc2\x9b31m\x07")

# Bytes a log may hold, weighted to what makes escape sequences and line ends.
PIECES = st.one_of(
    st.binary(max_size=8),
    st.sampled_from([b"\x1b", b"[", b"]", b"m", b";", b"1", b"\x07", b"\\", b"\r", b"\n",
                     b"\b", b"\t", b"P", b"(", b"\xc2\x9b", b"\xe2\x94\x81", b"\xe2\x80\xa8"]),
)
LOGS = st.lists(PIECES, max_size=60).map(b"".join)


def as_text(data: bytes, colour: bool, cuts: list[int] | None = None) -> str:
    text = LogText(colour=colour)
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts or [])})
    out = [text.feed(data[a:b]) for a, b in itertools.pairwise(bounds)]
    return "".join(out) + text.close()


def inert(text: str) -> bool:
    """Nothing in text that a terminal acts on, but a line end and a tab."""
    return all(c.isprintable() or c in "\n\t" for c in text)


@given(LOGS, st.lists(st.integers(min_value=0), max_size=6), st.booleans())
def test_any_log_cut_anywhere_reads_the_same_and_only_colour_is_ever_kept(
    data: bytes, cuts: list[int], colour: bool
) -> None:
    whole = as_text(data, colour)
    assert as_text(data, colour, cuts) == whole
    if colour:
        assert inert(SGR.sub("", whole)), repr(whole)
    else:
        assert inert(whole), repr(whole)
    assert whole.count("\n") >= data.count(b"\n")  # no line end lost


@given(st.text(st.characters().filter(str.isprintable) | st.sampled_from("\n\t")))
def test_text_with_nothing_a_terminal_acts_on_passes_unchanged(text: str) -> None:
    assert as_text(text.encode(), colour=False) == text
    assert as_text(text.encode(), colour=True) == text


def test_a_keras_progress_bar_reads_as_its_lines_and_keeps_its_colour_on_a_terminal() -> None:
    assert as_text(KERAS_BAR, colour=False) == (
        "Epoch 1/2\n 1/10 ━━ 0s 3ms/step - loss: 2.3\n10/10 ━━ 0s 3ms/step - loss: 2.1\n")
    coloured = as_text(KERAS_BAR, colour=True)
    assert "\x1b[1m10/10\x1b[0m" in coloured and coloured.endswith(SGR_RESET)
    assert "\b" not in coloured and "\r" not in coloured


def test_hostile_sequences_are_dropped_and_a_cut_off_one_is_text() -> None:
    # All dropped but the 8-bit CSI and the bell, which read "?" (and "31m" after it, text).
    assert as_text(HOSTILE + b"after\n", colour=True) == "?31m?after\n"
    # An escape sequence the log ends inside of, or one far too long to be one: text.
    assert as_text(b"tail \x1b[12", colour=False) == "tail ?[12"
    assert as_text(b"\x1b]" + b"x" * 5000 + b"\nnext\n", colour=False).endswith("x\nnext\n")
    assert as_text(b"a\r\nb\rc\n", colour=False) == "a\nb\nc\n"


def test_logs_in_a_pipe_are_text_and_on_a_terminal_keep_only_colour(home: Path) -> None:
    run_dir = ended_run(home)
    (run_dir / "trainer.log").write_bytes(KERAS_BAR + HOSTILE + b"end\n")
    piped = gpuwatch("logs", RUN_ID, check=True).stdout
    assert "\x1b" not in piped and inert(piped), repr(piped)
    assert piped.startswith("Epoch 1/2\n 1/10 ━━ 0s") and piped.endswith("end\n")

    # The same command on a real terminal (a pty): the bar's colour, nothing else.
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gpuwatch", "logs", RUN_ID], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                            env={k: v for k, v in os.environ.items() if k != "NO_COLOR"})
    os.close(follower)
    seen = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        assert ready, f"no output in 60 s: {seen!r}"
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the pty's other end closed: all read
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0, seen
    shown = seen.decode().replace("\r\n", "\n")  # the pty's own line ends
    assert "\x1b[1m10/10\x1b[0m" in shown
    assert "owned" not in shown and "\x1b]" not in shown and "\x1b[2J" not in shown
    assert inert(SGR.sub("", shown)), repr(shown)
    assert shown.endswith("end\n" + SGR_RESET)
