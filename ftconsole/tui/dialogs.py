"""Small modal dialogs: confirm, ask for a value, choose one of a few, and submit a job file.

Each returns its answer through `dismiss` (None when cancelled with esc). The submit dialog validates the
YAML file with the same code as `ftconsole submit`, shows the file with every problem at its line, and asks
the scheduler for its queue prediction before the job is sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input, Label, OptionList, Static

from ftconsole.scheduler.errors import ConfigError, FtError
from ftconsole.tui import rows as R

DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{ width: 90; max-width: 95%; height: auto; max-height: 90%; border: thick $primary;
    background: $surface; padding: 1 2; }}
{name} .hint {{ color: $text-muted; margin-top: 1; }}
{name} .error {{ color: $error; text-style: bold; }}
"""


class ConfirmDialog(ModalScreen[bool]):
    """Destructive actions ask first: y or enter confirms, n or esc cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y,enter", "dismiss(True)", "Yes", priority=True),
        Binding("n,escape", "dismiss(False)", "No", priority=True),
    ]
    DEFAULT_CSS = DIALOG_CSS.format(name="ConfirmDialog") + "ConfirmDialog > Vertical { border: thick $error; }"

    def __init__(self, question: str, detail: str = "") -> None:
        super().__init__()
        self.question = question
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.question, style="bold"))
            if self.detail:
                yield Static(Text(self.detail))
            yield Label("y / enter: yes    n / esc: no", classes="hint")


class PromptDialog(ModalScreen[str | None]):
    """One line of text; `check` returns a problem to show in place (the dialog stays open), or None."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = DIALOG_CSS.format(name="PromptDialog")

    def __init__(
        self,
        question: str,
        *,
        placeholder: str = "",
        value: str = "",
        check: Callable[[str], str | None] | None = None,
        suggestions: Sequence[str] = (),
    ) -> None:
        super().__init__()
        self.question = question
        self.placeholder = placeholder
        self.value = value
        self.check = check
        self.suggestions = list(suggestions)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.question))
            suggester = SuggestFromList(self.suggestions, case_sensitive=False) if self.suggestions else None
            yield Input(value=self.value, placeholder=self.placeholder, suggester=suggester, id="answer")
            yield Label("", classes="error", id="problem")
            yield Label("enter: ok    esc: cancel", classes="hint")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        problem = self.check(value) if self.check else (None if value else "give a value")
        if problem:
            self.query_one("#problem", Label).update(Text(problem))
            return
        self.dismiss(value)


class ChoiceDialog(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = DIALOG_CSS.format(name="ChoiceDialog") + "ChoiceDialog OptionList { height: auto; }"

    def __init__(self, question: str, choices: Sequence[str], current: str | None = None) -> None:
        super().__init__()
        self.question = question
        self.choices = list(choices)
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.question))
            yield OptionList(*self.choices, id="choices")
            yield Label("enter: choose    esc: cancel", classes="hint")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        if self.current in self.choices:
            options.highlighted = self.choices.index(self.current)

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.choices[event.option_index])


Predict = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class SubmitDialog(ModalScreen[dict[str, Any] | None]):
    """Pick a job file; see its problems in place, or the queue prediction; enter again submits.

    Returns the validated spec (as JSON) to submit, or None.
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = (
        DIALOG_CSS.format(name="SubmitDialog")
        + """
    SubmitDialog > Vertical { width: 110; }
    SubmitDialog #report { height: auto; max-height: 30; }
    """
    )

    def __init__(self, predict: Predict, *, start: Path | None = None) -> None:
        super().__init__()
        self.predict = predict
        self.start = start or Path.cwd()
        self.ready: dict[str, Any] | None = None  # the spec that passed validation and was predicted
        self.problems: list[str] = []

    def compose(self) -> ComposeResult:
        files = sorted(str(p) for p in self.start.glob("*.y*ml")) + sorted(str(p) for p in self.start.glob("*/*.y*ml"))
        with Vertical():
            yield Label("Submit a job: the job file (YAML, see docs/jobs.md)")
            yield Input(placeholder="path/to/job.yaml", suggester=SuggestFromList(files), id="path")
            with VerticalScroll(id="report"):
                yield Static("", id="result")
            yield Label("enter: check the file, then enter again to submit    esc: cancel", classes="hint", id="hint")

    @on(Input.Changed, "#path")
    def changed(self) -> None:
        self.ready = None

    @on(Input.Submitted, "#path")
    def submitted(self, event: Input.Submitted) -> None:
        if self.ready is not None:
            self.dismiss(self.ready)
            return
        self.check_file(event.value.strip())

    @work(exclusive=True, group="submit-check", exit_on_error=False)
    async def check_file(self, value: str) -> None:
        from ftconsole.scheduler.spec.jobspec import load_jobspec

        result = self.query_one("#result", Static)
        if not value:
            result.update(Text("give the path of a job file", style=R.style("bad")))
            return
        path = Path(value).expanduser()
        try:
            spec = load_jobspec(path)
        except ConfigError as exc:
            self.problems = [str(p) for p in exc.problems]
            result.update(problems_in_place(path, exc))
            return
        except FtError as exc:
            self.problems = [str(exc)]
            result.update(Text(str(exc), style=R.style("bad")))
            return
        self.problems = []
        doc = spec.to_json()
        try:
            decision = await self.predict(doc)
        except FtError as exc:
            result.update(Text(f"the scheduler refuses it: {exc}", style=R.style("bad")))
            return
        result.update(prediction_text(spec.name, decision))
        self.ready = doc
        self.query_one("#hint", Label).update("enter: submit    esc: cancel    (edit the path to check another file)")


def problems_in_place(path: Path, error: ConfigError) -> Text:
    """The file with line numbers, each problem under the line it is about; problems without a line first."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    by_line: dict[int, list[str]] = {}
    loose: list[str] = []
    for p in error.problems:
        message = f"{p.path}: {p.message}" if p.path else p.message
        if p.line and 1 <= p.line <= len(lines):
            by_line.setdefault(p.line, []).append(message)
        else:
            loose.append(message)
    out = Text()
    out.append(f"{len(error.problems)} problem(s) in {path}\n", style=R.style("bad"))
    for message in loose:
        out.append(f"  ✗ {message}\n", style=R.style("bad"))
    for number, line in enumerate(lines, 1):
        bad = number in by_line
        out.append(f"{number:4} ", style=R.style("bad" if bad else "muted"))
        out.append(f"{line}\n", style="bold" if bad else "")
        for message in by_line.get(number, []):
            out.append(f"     ^ {message}\n", style=R.style("bad"))
    return out


def prediction_text(name: str, decision: dict[str, Any]) -> Text:
    if decision.get("starts_now"):
        where = ", ".join(f"{n['node']} GPUs {','.join(map(str, n['gpus']))}" for n in decision.get("nodes", []))
        return Text.assemble(("✓ ", R.style("ok")), (name, "bold"), " is valid and would start now on ", where)
    out = Text.assemble(("✓ ", R.style("ok")), (name, "bold"), " is valid; it would wait")
    if decision.get("position") is not None:
        out.append(f" at position {decision['position']} in the queue")
    out.append(f": {decision.get('reason')}")
    if decision.get("ahead"):
        out.append(f"\n  ahead of it: {', '.join(map(str, decision['ahead'][:10]))}")
    return out
