"""The verdict's colour is its tone (Advice.tone): an ungraded bottleneck is never green."""

from __future__ import annotations

from rich.color import Color
from textual.app import App, ComposeResult

from gpuwatch.advisor import advise
from gpuwatch.app.widgets.advice import AdvicePanel
from gpuwatch.runstate import step_figures
from tests.advisor.test_advisor_share_intervals import SETTINGS, noisy_steps, step


class OnePanel(App[None]):
    def compose(self) -> ComposeResult:
        yield AdvicePanel()


async def verdict_colour(advice: object) -> tuple[int, int, int]:
    app = OnePanel()
    async with app.run_test(size=(80, 6)) as pilot:
        panel = app.query_one(AdvicePanel)
        panel.show_advice(advice)  # type: ignore[arg-type]
        await pilot.pause()
        first = next(seg for seg in panel.render_line(0) if seg.text.strip())
        assert first.style is not None and first.style.color is not None
        return tuple(first.style.color.get_truecolor())


def named(colour: str) -> tuple[int, int, int]:
    return tuple(Color.parse(colour).get_truecolor())


async def test_an_unsure_input_verdict_is_yellow_and_a_compute_bound_one_green() -> None:
    unsure = advise(step_figures(noisy_steps(seed=3, share=0.06, spread=0.05)), SETTINGS,
                    replicas=2)
    assert unsure.tone == "unsure"
    assert await verdict_colour(unsure) == named("yellow")
    clear = advise(step_figures([step(i, 0.5, 90.0) for i in range(20)]), SETTINGS,
                   replicas=2)
    assert clear.tone == "none"
    assert await verdict_colour(clear) == named("green")
