"""What a transformation keeps between calls so that JAX finds its traces again: the functions
it hands JAX, per kind of call (:class:`Kept`). JAX keys its trace cache on the function it
is given; a function made anew at every call would be traced (and compiled) anew."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Kept(Generic[T]):
    """The last ``size`` values used, by key, each made once (``make``) and shared by every
    thread; a key that cannot be hashed (a branch that is no dict key), or None, gets a fresh
    value, kept nowhere.

    >>> from treeclone._lift import Kept
    >>> kept: Kept[list] = Kept(size=2)
    >>> first = kept.get("a", list)
    >>> _ = kept.get("b", list), kept.get("c", list)  # "a" was used least recently: it goes
    >>> kept.get("a", list) is first
    False
    """

    def __init__(self, size: int = 256):
        self.size = size
        self._values: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable | None, make: Callable[[], T]) -> T:
        """The value kept for ``key``, made with ``make`` the first time (outside the lock: a
        thread that makes it too gets the value kept first).

        >>> from treeclone._lift import Kept
        >>> kept: Kept[list] = Kept()
        >>> kept.get("a", list) is kept.get("a", list)
        True
        >>> kept.get(None, list) is kept.get(None, list), kept.get([], list) is kept.get([], list)
        (False, False)
        """
        try:
            hash(key)
        except TypeError:
            key = None
        if key is None:
            return make()
        with self._lock:
            found = self._values.get(key)
            if found is not None:
                self._values.move_to_end(key)
                return found
        made = make()
        with self._lock:
            found = self._values.setdefault(key, made)
            while len(self._values) > self.size:
                self._values.popitem(last=False)
        return found
