"""The advice panel: the advisor's verdict and what to try."""

from __future__ import annotations

from rich.text import Text

from gpuwatch.advisor import Advice
from gpuwatch.app.widgets.state_panel import StatePanel

# By Advice.tone: "unsure" names a part its interval could not grade, never the green all-clear.
TONE_STYLE = {"high": "bold red", "moderate": "bold yellow", "unsure": "yellow", "none": "green",
              "unknown": "dim"}


class AdvicePanel(StatePanel):
    """The advisor's verdict (TF Profiler thresholds) and what to try."""

    def show_advice(self, advice: Advice) -> None:
        text = Text()
        text.append(advice.verdict, style=TONE_STYLE.get(advice.tone, ""))
        for rec in advice.recommendations:
            text.append("\n• ")
            text.append(rec)
        self.set_text(text)
