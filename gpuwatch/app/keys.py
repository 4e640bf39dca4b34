"""The dashboard's keys: one declaration each (key, action, words, id, tooltip).

The footer, the keys screen (?) and the pending bar's hints are all made from these
lists; gpuwatch.app.app.GpuwatchApp takes them as its class bindings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from textual.binding import Binding, BindingType

from trainer_runtime.changes import ACCUMULATION_REFUSAL, BATCH_REFUSAL, LIVE_KEYS

# How the app shows a key ("p", "?", "ctrl+c"): App.get_key_display.
Display = Callable[[Binding], str]

_ACCUMULATION = Binding.Group("accum", compact=True)
_BATCH = Binding.Group("batch", compact=True)


def joined(descriptions: list[str]) -> str:
    """One label for a group of keys: "batch ×2", "batch ÷2" -> "batch ×2/÷2"."""
    heads = {text.rpartition(" ")[0] for text in descriptions}
    if len(descriptions) > 1 and len(heads) == 1 and "" not in heads:
        return f"{heads.pop()} " + "/".join(text.rpartition(" ")[2] for text in descriptions)
    return "/".join(descriptions)


def key_rows(bindings: Sequence[BindingType], display: Display) -> list[tuple[str, str]]:
    """(key, what it does) for every binding: the keys screen (?)."""
    return [
        (display(binding), binding.tooltip or binding.description)
        for binding in bindings
        if isinstance(binding, Binding)
    ]


def settings_hint(bindings: Sequence[Binding], display: Display) -> str:
    """'p prefetch · a/A accumulation ×2/÷2 · ...': the keys that change a setting."""
    groups: list[list[Binding]] = []
    for binding in bindings:
        if groups and binding.group is not None and groups[-1][0].group is binding.group:
            groups[-1].append(binding)
        else:
            groups.append([binding])
    return " · ".join(
        "/".join(display(b) for b in group) + " " + joined([b.description for b in group])
        for group in groups
    )


def pending_hint(
    bindings: Sequence[Binding], display: Display, *, live: bool = False, short: bool = False
) -> str:
    """'press r to relaunch, c to discard': what to do with pending settings. live: r
    applies them in the running trainer ('apply live'); short: 'r apply live · c discard'."""

    def words(binding: Binding) -> str:
        return "apply live" if live and binding.id == "relaunch" else binding.description

    if short:
        return " · ".join(f"{display(b)} {words(b)}" for b in bindings)
    return "press " + ", ".join(f"{display(b)} to {words(b)}" for b in bindings)


def _applied(what: str, key: str) -> str:
    """A setting key's tooltip: what it does, and when r applies it (trainer_runtime.changes
    says which settings a running trainer takes live; the pending bar says it the same way)."""
    if key in LIVE_KEYS:
        return f"{what}: pending until r (live while the trainer runs, else a relaunch)"
    return f"{what}: pending until r relaunches with it"


# The keys that change a pending setting; the pending bar's hint lists them.
SETTING_BINDINGS: list[Binding] = [
    Binding(
        "p",
        "toggle_prefetch",
        "prefetch",
        id="prefetch",
        tooltip=_applied("Flip data.prefetch off/on", "data.prefetch"),
    ),
    Binding(
        "a",
        "accumulation(True)",
        "accumulation ×2",
        id="accumulation.up",
        group=_ACCUMULATION,
        tooltip=_applied("Double accumulation steps", "train.accumulation_steps"),
    ),
    Binding(
        "A",
        "accumulation(False)",
        "accumulation ÷2",
        id="accumulation.down",
        group=_ACCUMULATION,
        tooltip=_applied("Halve accumulation steps", "train.accumulation_steps"),
    ),
    Binding(
        "b",
        "batch(True)",
        "batch ×2",
        id="batch.up",
        group=_BATCH,
        tooltip=_applied("Double the global batch", "train.global_batch_size"),
    ),
    Binding(
        "B",
        "batch(False)",
        "batch ÷2",
        id="batch.down",
        group=_BATCH,
        tooltip=_applied("Halve the global batch", "train.global_batch_size"),
    ),
]
# The settings screen: every setting that changes live, typed in (not in the pending bar's
# hint nor the footer, which keep to one line at 80 columns; the keys screen lists it).
EDIT_BINDING = Binding(
    "e",
    "edit_settings",
    "edit settings",
    id="settings",
    show=False,
    tooltip=(
        "Edit every setting that changes live (parallel calls, read latency, ...) and "
        "steps per execution, jit compile, precision (r relaunches for those)"
    ),
)
# What to do with the pending settings; the pending bar says "press r to relaunch, ...".
PENDING_BINDINGS: list[Binding] = [
    Binding(
        "r",
        "relaunch",
        "relaunch",
        id="relaunch",
        tooltip=(
            "Apply the pending settings: in the running trainer when they can change live,"
            " else relaunch (resumes from checkpoint)"
        ),
    ),
    Binding(
        "c",
        "discard",
        "discard",
        id="discard",
        show=False,
        tooltip="Forget the pending settings",
    ),
]
# Every key, in the footer's order; the keys screen (?) lists them with their tooltips.
BINDINGS: list[BindingType] = [
    *SETTING_BINDINGS,
    EDIT_BINDING,
    *PENDING_BINDINGS,
    Binding(
        "R",
        "relaunch(False)",
        "full relaunch",
        id="relaunch.full",
        show=False,
        tooltip=(
            "Relaunch in a new trainer: with the pending settings even if they can apply "
            "live, or as it is when none is pending"
        ),
    ),
    Binding("s", "stop_run", "stop", id="stop", tooltip="Stop training (asks first)"),
    Binding("l", "runs", "runs", id="runs", tooltip="List the live runs and switch to one"),
    Binding(
        "g",
        "plots",
        "plots",
        id="plots",
        tooltip=(
            "Charts of the whole run against step: examples/s, input wait, step time and"
            " loss, one colour per attempt; t there: where each step's time went (g or Esc"
            " goes back)"
        ),
    ),
    Binding(
        "question_mark", "keys", "keys", id="keys", key_display="?", tooltip="List every key"
    ),
    Binding(
        "q",
        "quit_dashboard",
        "quit",
        id="quit",
        tooltip="Close the dashboard: detach (training goes on) or stop",
    ),
    Binding(
        "ctrl+c",
        "quit_dashboard",
        "quit",
        id="quit.ctrl_c",
        show=False,
        tooltip="Same as q",
        priority=True,
    ),
]


# What the keys a person's own command (gpuwatch run) does not take say instead, on the keys
# screen (?): each one's reason. r runs the command again.
COMMAND_SETTINGS_REFUSAL = (
    "a script's settings are its own code's: p toggles the prefetch its hook applies; "
    "gpuwatch run --set data.prefetch=... or train.max_steps=N at the start"
)
_FOR_COMMAND = {
    "accumulation.up": f"Not for a command: {ACCUMULATION_REFUSAL}",
    "accumulation.down": f"Not for a command: {ACCUMULATION_REFUSAL}",
    "batch.up": f"Not for a command: {BATCH_REFUSAL}",
    "batch.down": f"Not for a command: {BATCH_REFUSAL}",
    "settings": f"Not for a command: {COMMAND_SETTINGS_REFUSAL}",
    "prefetch": "Flip data.prefetch off/on (the hook applies it) for the next run of the command",
    "relaunch": "Run the command again as the next attempt, with the pending settings",
    "relaunch.full": "Run the command again as the next attempt (the same as r)",
}


def for_command(bindings: Sequence[BindingType]) -> list[BindingType]:
    """The bindings as a person's own command (gpuwatch run) takes them: the ones it does
    not take say why (their tooltips), r says it runs the command again."""
    return [
        replace(binding, tooltip=_FOR_COMMAND[binding.id])
        if isinstance(binding, Binding) and binding.id in _FOR_COMMAND else binding
        for binding in bindings
    ]
