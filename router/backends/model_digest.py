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
    """Feed one value, tagged by its kind so that values of different kinds never feed the same
    bytes. The kinds are tried in this order, which decides ties: a numpy float is a float, a
    class is a type before it is callable."""
    if not (_feed_scalar(digest, value) or _feed_array(digest, value)
            or _feed_collection(digest, value) or _feed_code(digest, value)):
        raise TypeError(f"cannot digest a fitted model holding {type(value).__qualname__}")


def _tag(digest: Any, kind: bytes, size: int = 0) -> None:
    digest.update(kind + struct.pack("<q", size))


def _feed_scalar(digest: Any, value: Any) -> bool:
    """None, a number (numpy's float and int subclasses included: by repr), text or bytes."""
    if value is None or isinstance(value, bool | int | float | complex):
        data = repr(value).encode()
        kind = b"n"
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        kind = b"s"
    elif isinstance(value, bytes):
        data, kind = value, b"b"
    else:
        return False
    _tag(digest, kind, len(data))
    digest.update(data)
    return True


def _feed_array(digest: Any, value: Any) -> bool:
    """A numpy array (dtype, shape, then bytes, or each item of an object array), a numpy
    scalar (as a 0-d array) or a scipy sparse matrix (as CSR with sorted indices)."""
    from scipy import sparse

    if isinstance(value, np.ndarray):
        _tag(digest, b"a", value.ndim)
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
        _tag(digest, b"m")
        _feed(digest, [list(csr.shape), csr.data, csr.indices, csr.indptr])
    else:
        return False
    return True


def _feed_collection(digest: Any, value: Any) -> bool:
    """A dict or set in sorted order (by repr), a list or tuple in its own."""
    if isinstance(value, dict):
        _tag(digest, b"d", len(value))
        for key in sorted(value, key=repr):
            _feed(digest, key)
            _feed(digest, value[key])
    elif isinstance(value, set | frozenset):
        _tag(digest, b"t", len(value))
        for item in sorted(value, key=repr):
            _feed(digest, item)
    elif isinstance(value, list | tuple):
        _tag(digest, b"l", len(value))
        for item in value:
            _feed(digest, item)
    else:
        return False
    return True


def _feed_code(digest: Any, value: Any) -> bool:
    """A class or callable by its qualified name; an estimator by its class, its parameters and
    its fitted state (``fitted_digest``)."""
    from sklearn.base import BaseEstimator

    if isinstance(value, type):
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
        return False
    return True
