"""A tiny progress bar on stderr (no dependency).

On a terminal it redraws one line; elsewhere (CI logs, pipes) it prints a line each time the
label changes or another tenth of the work is done, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, width: int = 24) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.label = ""
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self._last_tenth = -1
        self._last_label = None

    def advance(self, n: int = 1, label: str | None = None) -> None:
        self.done = min(self.done + n, self.total)
        if label is not None:
            self.label = label
        self._draw()

    def set_label(self, label: str) -> None:
        self.label = label
        self._draw()

    def note(self, message: str) -> None:
        """A message on a line of its own, above the bar."""
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(message + "\n")
        self.stream.flush()
        if self.tty:
            self._draw()

    def close(self) -> None:
        self.done = self.total
        self._draw(force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _line(self) -> str:
        frac = self.done / self.total
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        return f"[{bar}] {100 * frac:3.0f}% {elapsed:6.1f}s {self.label}"

    def _draw(self, force: bool = False) -> None:
        if self.tty:
            cols = 120
            self.stream.write("\r\033[K" + self._line()[:cols])
            self.stream.flush()
            return
        tenth = int(10 * self.done / self.total)
        if force or tenth != self._last_tenth or self.label != self._last_label:
            self._last_tenth, self._last_label = tenth, self.label
            self.stream.write(self._line() + "\n")
            self.stream.flush()
