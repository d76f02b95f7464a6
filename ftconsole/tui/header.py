"""The console's header: Textual's, with a title that changes in place.

The title carries the count of open alerts, so it changes whenever an alert opens or closes. Setting `App.title`
repaints the whole screen, and Textual's header title lays the whole screen out again at each change, which
draws every widget (10 to 15 ms at 200x50); the header is one line of the screen's width, so nothing else can
move: the app sets its title without its watchers and the header shows it (`show_title`)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.visual import VisualType
from textual.widgets import Header
from textual.widgets._header import HeaderClockSpace, HeaderIcon, HeaderTitle  # textual is pinned


class _Title(HeaderTitle):
    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        super().update(content, layout=False)


class ConsoleHeader(Header):
    def show_title(self) -> None:
        """The app's title, set without its watchers (`App.title`'s repaint the whole screen)."""
        self.query_one(_Title).update(self.format_title())

    def compose(self) -> ComposeResult:
        yield HeaderIcon().data_bind(Header.icon)
        yield _Title()
        yield HeaderClockSpace()
