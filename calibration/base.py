"""The calibrator contract: ``fit(proba, y_true) -> self``, ``transform(proba)`` returning rows
that sum to 1, and a JSON form (``to_dict`` / ``from_dict``) reproducing ``transform`` exactly."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.exceptions import NotFittedError

from calibration.validation import check_labels, check_proba

FloatArray = NDArray[np.float64]


class Calibrator(ABC):
    """Maps fast-read probabilities to probabilities that mean what they say.

    Subclasses store keyword-only options in ``__init__`` (named in ``option_names``), learn in
    ``_fit`` into trailing-underscore attributes (named in ``state_names``: floats or 1-D float
    arrays, so the JSON form is generic) and map in ``_transform``. Inputs are validated here,
    once, and rows are renormalised so that rounding in stored probabilities does not leak through.
    """

    kind: ClassVar[str]
    option_names: ClassVar[tuple[str, ...]] = ()
    state_names: ClassVar[tuple[str, ...]] = ()

    def fit(self, proba: ArrayLike, y_true: ArrayLike) -> Self:
        array = _normalised(check_proba(proba))
        labels = check_labels(y_true, n_samples=array.shape[0], n_options=array.shape[1])
        self._fit(array, labels)
        return self

    def transform(self, proba: ArrayLike) -> FloatArray:
        self._check_fitted()
        out = self._transform(_normalised(check_proba(proba)))
        return _normalised(out)

    def fit_transform(self, proba: ArrayLike, y_true: ArrayLike) -> FloatArray:
        return self.fit(proba, y_true).transform(proba)

    @property
    def is_fitted(self) -> bool:
        return all(hasattr(self, name) for name in self.state_names)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: ``{"kind", "options", "state"}``; floats survive JSON exactly."""
        self._check_fitted()
        state: dict[str, Any] = {}
        for name in self.state_names:
            value = getattr(self, name)
            state[name] = value.tolist() if isinstance(value, np.ndarray) else float(value)
        options = {name: getattr(self, name) for name in self.option_names}
        return {"kind": self.kind, "options": options, "state": state}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        if not isinstance(data, dict) or data.get("kind") != cls.kind:
            found = data.get("kind") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"calibrator dict has kind {found!r}, expected {cls.kind!r}")
        options = data.get("options", {})
        state = data.get("state", {})
        unknown = sorted(set(options) - set(cls.option_names))
        if unknown:
            raise ValueError(f"calibrator dict of kind {cls.kind!r} has unknown options {unknown}")
        missing = [name for name in cls.state_names if name not in state]
        if missing:
            raise ValueError(f"calibrator dict of kind {cls.kind!r} lacks state {missing}")
        calibrator = cls(**options)
        for name in cls.state_names:
            value = state[name]
            is_array = isinstance(value, list)
            setattr(calibrator, name,
                    np.asarray(value, dtype=np.float64) if is_array else float(value))
        return calibrator

    def __repr__(self) -> str:
        options = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.option_names)
        return f"{type(self).__name__}({options})"

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError(
                f"{type(self).__name__} is not fitted yet: call fit(proba, y_true) first"
            )

    @abstractmethod
    def _fit(self, proba: FloatArray, y_true: NDArray[np.int64]) -> None: ...

    @abstractmethod
    def _transform(self, proba: FloatArray) -> FloatArray: ...


def _normalised(proba: FloatArray) -> FloatArray:
    result: FloatArray = proba / proba.sum(axis=1, keepdims=True)
    return result
