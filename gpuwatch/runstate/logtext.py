"""A run's log as text for a terminal or a pipe (pure): `gpuwatch logs`.

A log holds whatever its program printed (progress bars, colours, anything else a
terminal acts on); it follows the rule a run's text follows everywhere (``printable``):
it reaches the terminal as text. As a stream that may be cut at any byte: colour (SGR)
is kept only when asked (stdout is a terminal), every other escape sequence is dropped
whole; a carriage return ends a line (CR LF is one), so a progress bar redrawn in place
reads as one line per redraw, and a backspace is dropped; any other control character
reads "?" and bytes that are not UTF-8 read U+FFFD. What comes out is the same however
the input is cut into chunks.
"""

from __future__ import annotations

import codecs

ESC = "\x1b"
CSI_FINAL = range(0x40, 0x7F)
# The control strings a terminal swallows up to their end (BEL, or ST: ESC \).
STRING_OPENERS = frozenset("]PX^_")  # OSC, DCS, SOS, PM, APC
# A sequence that runs on past this without its end is not one: what it held is text.
LONGEST_SEQUENCE = 4096
SGR_RESET = ESC + "[0m"

_TEXT, _ESC, _CSI, _STRING, _STRING_ESC, _INTERMEDIATE = range(6)


def _text(char: str) -> str:
    return char if char.isprintable() or char == "\t" else "?"


class LogText:
    """feed(bytes) -> str, then close() -> str: the log as text (the module's rules);
    colour: keep SGR sequences (stdout is a terminal)."""

    def __init__(self, colour: bool = False) -> None:
        self.colour = colour
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._state = _TEXT
        self._held = ""  # the escape sequence read so far
        self._after_cr = False  # the last character was a CR (its LF is the same line end)
        self._coloured = False  # an SGR went out: close() resets it

    def feed(self, data: bytes) -> str:
        return self._run(self._decoder.decode(data))

    def close(self) -> str:
        out = self._run(self._decoder.decode(b"", final=True))
        if self._state != _TEXT:  # a sequence cut off by the end: what it held is text
            out += self._spill()
        if self._coloured:
            out += SGR_RESET
            self._coloured = False
        return out

    def _spill(self) -> str:
        """A held sequence that turned out not to be one (too long, or cut off by the
        end of the log): its characters as text, the ESC as "?"."""
        held, self._held, self._state = self._held, "", _TEXT
        return "".join(_text(c) for c in held)

    def _run(self, text: str) -> str:
        out: list[str] = []
        for char in text:
            state = self._state
            if state == _TEXT:
                self._plain(char, out)
                continue
            self._held += char
            code = ord(char)
            if state == _ESC:
                if char == "[":
                    self._state = _CSI
                elif char in STRING_OPENERS:
                    self._state = _STRING
                elif 0x20 <= code <= 0x2F:
                    self._state = _INTERMEDIATE
                elif 0x30 <= code <= 0x7E:
                    self._drop()
                else:  # not an escape sequence: the ESC alone is a control
                    self._held, self._state = "", _TEXT
                    out.append("?")
                    self._plain(char, out)
                continue
            if state == _CSI:
                if code in CSI_FINAL:
                    if char == "m" and self.colour and self._is_sgr():
                        out.append(self._held)
                        self._coloured = True
                    self._drop()
                elif not 0x20 <= code <= 0x3F:  # not a parameter or intermediate byte
                    out.append("?")  # the ESC; the rest is text again
                    held = self._held[1:-1]
                    self._held, self._state = "", _TEXT
                    out.extend(_text(c) for c in held)
                    self._plain(char, out)
            elif state == _INTERMEDIATE:
                if 0x30 <= code <= 0x7E:
                    self._drop()
                elif not 0x20 <= code <= 0x2F:
                    out.append("?")
                    held = self._held[1:-1]
                    self._held, self._state = "", _TEXT
                    out.extend(_text(c) for c in held)
                    self._plain(char, out)
            elif state == _STRING:
                if char == "\x07":
                    self._drop()
                elif char == ESC:
                    self._state = _STRING_ESC
            elif state == _STRING_ESC:  # ESC \ ends it; another ESC may be the one
                if char == "\\":
                    self._drop()
                elif char != ESC:
                    self._state = _STRING
            if self._state != _TEXT and len(self._held) > LONGEST_SEQUENCE:
                out.append(self._spill())
        return "".join(out)

    def _is_sgr(self) -> bool:
        params = self._held[2:-1]
        return all(c.isdigit() or c in ";:" for c in params)

    def _drop(self) -> None:
        self._held, self._state = "", _TEXT

    def _plain(self, char: str, out: list[str]) -> None:
        after_cr, self._after_cr = self._after_cr, char == "\r"
        if char == "\n":
            if not after_cr:
                out.append("\n")
        elif char == "\r":
            out.append("\n")
        elif char == ESC:
            self._held, self._state = char, _ESC
        elif char != "\b":
            out.append(_text(char))
