"""The orders ``bench.watch`` replays its scenarios' rows in: a mix of two pools, one question
repeated, one popular, whole intent blocks, and a novel class arriving after known rows."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from bench.drift_data import Scored

__all__ = ["in_blocks", "mixed", "novel_order", "with_popular", "with_repeats"]


def mixed(rng: np.random.Generator, base: NDArray[np.int64], extra: NDArray[np.int64], *,
          n: int, share: float) -> NDArray[np.int64]:
    """``n`` rows, each from ``extra`` with probability ``share`` (while it lasts), else from
    ``base``; no row twice."""
    k = min(int(rng.binomial(n, share)), len(extra))
    if n - k > len(base):
        raise ValueError(f"n: {n} rows need more than the {len(base)} + {len(extra)} given")
    from_extra = np.zeros(n, dtype=bool)
    from_extra[rng.choice(n, size=k, replace=False)] = True
    order = np.empty(n, dtype=np.int64)
    order[from_extra] = rng.permutation(extra)[:k]
    order[~from_extra] = rng.permutation(base)[:n - k]
    return order


def with_repeats(rng: np.random.Generator, rows: Scored, *, n: int,
                 repeats: int) -> NDArray[np.int64]:
    sure = np.flatnonzero(rows.accepted & rows.correct & (rows.confidence >= 0.99))
    canary = int(rng.choice(sure))
    others = rng.permutation(np.setdiff1d(np.arange(len(rows.texts)), [canary]))[:n - repeats]
    order = np.full(n, canary, dtype=np.int64)
    slots = np.sort(rng.choice(n, size=n - repeats, replace=False))
    order[slots] = others
    return order


def with_popular(rng: np.random.Generator, rows: Scored, *, n: int,
                 share: float) -> NDArray[np.int64]:
    common = np.flatnonzero(rows.accepted & rows.correct & (rows.confidence >= 0.9))
    popular = int(rng.choice(common))
    is_popular = rng.random(n) < share
    others = rng.permutation(np.setdiff1d(np.arange(len(rows.texts)), [popular]))
    order = np.full(n, popular, dtype=np.int64)
    order[~is_popular] = others[:int((~is_popular).sum())]
    return order


def in_blocks(rng: np.random.Generator, labels: list[str]) -> NDArray[np.int64]:
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        by_label.setdefault(label, []).append(i)
    names = sorted(by_label)
    return np.concatenate([rng.permutation(by_label[names[k]])
                           for k in rng.permutation(len(names))]).astype(np.int64)


def novel_order(rng: np.random.Generator, n_known: int, n_novel: int, n_pre: int,
                shares: NDArray[np.float64]) -> NDArray[np.int64]:
    """``n_pre`` known rows, then one row per share: novel with that probability; no row twice."""
    known, novel = rng.permutation(n_known), n_known + rng.permutation(n_novel)
    from_novel = rng.random(len(shares)) < shares
    k = int(from_novel.sum())
    post = np.empty(len(shares), dtype=np.int64)
    post[from_novel] = novel[:k]
    post[~from_novel] = known[n_pre:n_pre + len(shares) - k]
    return np.concatenate([known[:n_pre], post])
