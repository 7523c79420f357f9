"""Immutability the one-pass read and the readers share: their kernels and settings are fixed
when they are built, never swapped while serving."""

from __future__ import annotations


class Frozen:
    """Attributes are set in ``__init__``, which ends with ``self._seal()``, and never again."""

    _sealed = False

    def _seal(self) -> None:
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name: str, value: object) -> None:
        if self._sealed:
            raise AttributeError(f"{type(self).__name__} is immutable once built "
                                 f"(its kernels are chosen at construction): {name}")
        object.__setattr__(self, name, value)
