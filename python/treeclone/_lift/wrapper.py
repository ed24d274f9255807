"""What every lifted transformation's wrapper shares."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

from treeclone.policies import ArgPolicies, Policy


class Wrapper:
    """What every lifted transformation's wrapper shares: it binds as a method, as the function
    it wraps does, and its repr names the transformation (``name``), the function and the
    policy."""

    name = "transformation"
    _fun: Callable[..., Any]
    _policy: Policy | ArgPolicies

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(cast(Callable[..., Any], self), obj)  # subclasses are callable

    def __repr__(self) -> str:
        return f"<treeclone.{self.name} of {self._fun!r} (policy {self._policy!r})>"
