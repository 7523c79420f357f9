"""A fitted scikit-learn pipeline's digest: a sha256 over what it computes (each estimator's
class, its parameters and its fitted attributes, in a canonical order), so two models fit alike
share it whatever their pickles' bytes (a timestamp, a set's iteration order) say."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np


def fitted_digest(estimator: Any) -> str:
    """sha256 hex of ``estimator``'s class, parameters (nested estimators included) and fitted
    attributes (public names ending in ``_``, and estimators held privately, as a TF-IDF
    vectorizer holds its idf weights); arrays by dtype, shape and bytes, dicts and sets in sorted
    order. Other private state (a lazily loaded encoder, an object id cached for a warning) is
    left out: it does not change what the model computes."""
    digest = hashlib.sha256()
    _feed(digest, estimator)
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    from scipy import sparse
    from sklearn.base import BaseEstimator

    def tag(kind: bytes, size: int = 0) -> None:
        digest.update(kind + struct.pack("<q", size))

    if value is None or isinstance(value, bool | int | float | complex):
        text = repr(value).encode()
        tag(b"n", len(text))
        digest.update(text)
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        tag(b"s", len(data))
        digest.update(data)
    elif isinstance(value, bytes):
        tag(b"b", len(value))
        digest.update(value)
    elif isinstance(value, np.ndarray):
        tag(b"a", value.ndim)
        _feed(digest, [value.dtype.str, list(value.shape)])
        if value.dtype.hasobject:
            for item in value.ravel():
                _feed(digest, item)
        else:
            digest.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, np.generic):
        _feed(digest, np.asarray(value))
    elif sparse.issparse(value):
        csr = sparse.csr_matrix(value, copy=True)
        csr.sort_indices()
        tag(b"m")
        _feed(digest, [list(csr.shape), csr.data, csr.indices, csr.indptr])
    elif isinstance(value, dict):
        tag(b"d", len(value))
        for key in sorted(value, key=repr):
            _feed(digest, key)
            _feed(digest, value[key])
    elif isinstance(value, set | frozenset):
        tag(b"t", len(value))
        for item in sorted(value, key=repr):
            _feed(digest, item)
    elif isinstance(value, list | tuple):
        tag(b"l", len(value))
        for item in value:
            _feed(digest, item)
    elif isinstance(value, type):
        _feed(digest, f"type:{value.__module__}.{value.__qualname__}")
    elif isinstance(value, BaseEstimator):
        kind = type(value)
        _feed(digest, f"estimator:{kind.__module__}.{kind.__qualname__}")
        _feed(digest, value.get_params(deep=False))
        _feed(digest, {name: attribute for name, attribute in vars(value).items()
                       if (name.endswith("_") and not name.startswith("_"))
                       or isinstance(attribute, BaseEstimator)})
    elif callable(value):  # a tokenizer or preprocessor passed by reference
        _feed(digest, f"callable:{getattr(value, '__module__', '')}."
                      f"{getattr(value, '__qualname__', type(value).__qualname__)}")
    else:
        raise TypeError(f"cannot digest a fitted model holding {type(value).__qualname__}")
