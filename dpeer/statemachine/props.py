"""Read-only fields of a Store, each served from memory by the owner that keeps it.

Pure (no lmdb): the owners keep these caches equal to what their last committed transaction wrote;
a Field only names where a value lives, so the Store stays a table of its owners.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class Field(Generic[T]):
    """A read-only attribute that reads a dotted path of its instance (e.g. "log.last_index")."""

    def __init__(self, path: str, doc: str) -> None:
        self._get = attrgetter(path)
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Field[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else self._get(obj)

    def __set__(self, obj: object, value: T) -> None:
        raise AttributeError(f"{self._name} is read-only: its owner writes it durably first")
