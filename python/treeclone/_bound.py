"""What ``treeclone.jit``'s call path asks of ``jit_partial``'s bound arguments.

``jit.py`` calls these two methods; ``jit_partial.py`` implements them (``_BoundArguments``). The
interface lives here, below both, so that neither module imports the other for it.
"""

from __future__ import annotations

from typing import Any, Protocol


class BoundArguments(Protocol):
    """The first arguments of a call, flattened already (see ``treeclone.jit_partial``)."""

    def join(self, args: tuple, kwargs: dict) -> tuple[list, Any, list]:
        """``flatten_shared((*args, kwargs))``, flattening only the arguments not bound."""
        ...

    def advance(self, next_inputs: Any, leaves: list, outputs: Any) -> None:
        """Follow the call's write-back into the bound arguments."""
        ...
