"""The answers behind bench/auditor_evidence.py: the README policy's fast reads of BANKING77's
test.csv with their answers and true labels, and the answers of independently trained
classifiers standing in for the slow model that audits them (each trained on train.csv once,
its test.csv answers cached in ``work``: delete ``auditor-<name>.json`` there to retrain); and
what those answers show: agreement against accuracy, and each audit's error as the two-phase
estimates read it."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.break_power import Reads, build_reads
from bench.common import finite
from calibration.weighted_audits import RISK_EDGES, AuditDesign

TRAIN_AUDIT_RATE = 0.25  # the audit rate bench.break_power's policy is tuned with
PROFILES = ("low", "even")
BANDS = (0.0, 0.01, 0.04, 0.16, 1.0)  # of calibrated risk, for agreement and calibrated audits
CALIBRATION_PRIOR = 2.0  # reads' worth of the band's mean risk in ``audit_errors``' shares


def _knn(seed: int) -> Any:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline

    del seed  # deterministic
    return make_pipeline(TfidfVectorizer(sublinear_tf=True),
                         KNeighborsClassifier(n_neighbors=10, metric="cosine", weights="distance"))


def _embedding(kind: str) -> Callable[[int], Any]:
    def build(seed: int) -> Any:
        from router.backends.encoders import build_embedding_pipeline

        return build_embedding_pipeline(kind, seed=seed)
    return build


# name -> (what it is, the unfitted pipeline): none shares the fast tier's features; wordllama
# is docs/cascade.md's first tier.
AUDITORS: dict[str, tuple[str, Callable[[int], Any]]] = {
    "knn": ("10-nearest neighbours (cosine, distance-weighted) on word TF-IDF", _knn),
    "wordllama": ("wordllama embeddings + logistic regression (slotgate train --kind wordllama)",
                  _embedding("wordllama")),
    "minilm": ("all-MiniLM-L6-v2 embeddings + logistic regression (slotgate train --kind minilm)",
               _embedding("minilm")),
}


@dataclass(frozen=True)
class Answers:
    """Each test read: the policy's view (``reads``), the fast answer, the true label and each
    auditor's answer."""

    reads: Reads
    fast: NDArray[np.str_]
    truth: NDArray[np.str_]
    auditors: dict[str, NDArray[np.str_]]

    @property
    def wrong(self) -> NDArray[np.bool_]:
        return np.asarray(self.fast != self.truth)

    def disagrees(self, auditor: str) -> NDArray[np.bool_]:
        """Where the auditor's answer differs from the fast one: the audit's "wrong"."""
        return np.asarray(self.fast != self.auditors[auditor])


def fast_answers(data: Path, work: Path, *, target: float) -> tuple[Reads, list[str], list[str]]:
    """``bench.break_power.build_reads`` (the README policy, built once into ``work``), with the
    fast answers and true labels of the same test reads (``bench.watch_data.score``)."""
    from bench.watch_data import crossfit, read_csv, score

    reads = build_reads(data, work, target=target)
    built = crossfit(work, "banking77", data / "train.csv", target=target,
                     audit_rate=TRAIN_AUDIT_RATE)
    scored = score(built, read_csv(data / "test.csv"))
    if not (np.array_equal(scored.accepted, reads.accepted)
            and np.allclose(scored.confidence, reads.confidence)):
        raise RuntimeError("the scored test rows differ from build_reads' reads")
    return reads, scored.answers, scored.labels


def auditor_answers(name: str, data: Path, work: Path, *, seed: int = 0) -> list[str]:
    """Auditor ``name``'s answers on test.csv: trained on train.csv (once; cached in
    ``work``)."""
    from bench.watch_data import read_csv

    if name not in AUDITORS:
        raise ValueError(f"auditor must be one of {sorted(AUDITORS)}, got {name!r}")
    test = read_csv(data / "test.csv")
    cache = work / f"auditor-{name}.json"
    if cache.is_file():
        kept = json.loads(cache.read_text())
        if kept.get("texts") == len(test):
            return [str(a) for a in kept["answers"]]
    train = read_csv(data / "train.csv")
    model = AUDITORS[name][1](seed).fit([t for t, _ in train], [label for _, label in train])
    answers = [str(a) for a in model.predict([t for t, _ in test])]
    work.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"auditor": name, "texts": len(test), "answers": answers}))
    return answers


def build_answers(data: Path, work: Path, *, target: float,
                  auditors: tuple[str, ...]) -> Answers:
    reads, fast, truth = fast_answers(data, work, target=target)
    return Answers(reads, np.array(fast), np.array(truth),
                   {name: np.array(auditor_answers(name, data, work)) for name in auditors})


def agreement(answers: Answers, mask: NDArray[np.bool_],
              weights: NDArray[np.float64] | None = None) -> dict[str, Any]:
    """On the reads in ``mask`` (weighted): the fast tier's accuracy and, per auditor, its
    agreement with the fast answers, the bias (agreement - accuracy), the fast errors it
    repeats (``hidden``: counted right) and the right answers it contradicts (``false_wrong``),
    its errors given the fast one's, and its ``mismatch`` (share where audit and truth judge the
    fast answer differently)."""
    w = (np.ones(mask.size) if weights is None else weights) * mask
    total = float(w.sum())
    e = answers.wrong.astype(np.float64)
    error = float((w * e).sum() / total)
    out: dict[str, Any] = {"n": int(mask.sum()), "accuracy": finite(1.0 - error, 4)}
    for name, said in answers.auditors.items():
        d = answers.disagrees(name).astype(np.float64)
        wrong_too = (said != answers.truth).astype(np.float64)
        hidden, false_wrong = (w * e * (1 - d)).sum() / total, (w * (1 - e) * d).sum() / total
        out[name] = {
            "agreement": finite(1.0 - float((w * d).sum() / total), 4),
            "bias": finite(error - float((w * d).sum() / total), 4),
            "hidden": finite(float(hidden), 4), "false_wrong": finite(float(false_wrong), 4),
            "confirmed_errors": finite(float(hidden) / error if error else math.nan, 4),
            "auditor_accuracy": finite(1.0 - float((w * wrong_too).sum() / total), 4),
            "auditor_wrong_if_fast_wrong": finite(_share(w * e, wrong_too), 4),
            "auditor_wrong_if_fast_right": finite(_share(w * (1 - e), wrong_too), 4),
            "mismatch": finite(float(hidden + false_wrong), 4)}
    return out


def _share(weights: NDArray[np.float64], x: NDArray[np.float64]) -> float:
    total = float(weights.sum())
    return float((weights * x).sum()) / total if total else math.nan


def by_band(answers: Answers) -> list[dict[str, Any]]:
    """``agreement`` on the accepted reads in each band of calibrated risk (``BANDS``)."""
    risk = 1.0 - answers.reads.confidence
    out = []
    for lo, hi in itertools.pairwise(BANDS):
        mask = answers.reads.accepted & (risk >= lo) & (risk < hi)
        if mask.any():
            out.append({"risk": [lo, hi], **agreement(answers, mask)})
    return out


def audit_errors(answers: Answers) -> tuple[dict[str, NDArray[np.float64]],
                                             dict[str, NDArray[np.float64]]]:
    """Per read, each estimate's audit error and the largest it could have been before the
    audit (what caps the stake): ``audit:<a>`` and ``two_phase:<a>`` the disagreement ``d``
    (0/1; at most 1); ``calibrated:<a>`` ``P(e = 1 | band, d)`` over the accepted reads
    of the read's band of risk (``BANDS``) and disagreement, shrunk towards the band's mean risk
    by ``CALIBRATION_PRIOR`` reads (what a first batch of trusted labels of audits would show:
    measured on the same reads the streams draw from, so its power is an in-sample one;
    validity does not depend on it)."""
    accepted, e = answers.reads.accepted, answers.wrong
    risk = np.clip(1.0 - answers.reads.confidence, 0.0, 1.0)
    band = np.clip(np.searchsorted(BANDS, risk, side="right") - 1, 0, len(BANDS) - 2)
    out: dict[str, NDArray[np.float64]] = {}
    most: dict[str, NDArray[np.float64]] = {}
    for a in answers.auditors:
        d = answers.disagrees(a)
        f, f_most = np.zeros(d.size), np.zeros(d.size)
        for b in range(len(BANDS) - 1):
            for said in (False, True):
                cell = (band == b) & (d == said)
                seen = cell & accepted
                prior = float(risk[band == b].mean()) if (band == b).any() else 0.0
                f[cell] = (float(e[seen].sum()) + CALIBRATION_PRIOR * prior) / (
                    float(seen.sum()) + CALIBRATION_PRIOR)
            f_most[band == b] = f[band == b].max(initial=0.0)
        out[f"audit:{a}"] = out[f"two_phase:{a}"] = d.astype(np.float64)
        most[f"audit:{a}"] = most[f"two_phase:{a}"] = np.ones(d.size)
        out[f"calibrated:{a}"], most[f"calibrated:{a}"] = f, f_most
    return out, most


def stratum_mismatch(answers: Answers) -> tuple[dict[str, list[float]],
                                                 dict[str, list[float]]]:
    """Per ``kind:auditor`` and stratum of ``RISK_EDGES``: the mean of ``(e - d)^2`` over the
    accepted reads (an empty stratum takes the mean over all of them), which sizes the
    stakes, and the largest audit error the stratum's decisions can get (its band's, 1 where
    the band has no read), which sets the loss bound (``two_phase_scale``)."""
    accepted, e = answers.reads.accepted, answers.wrong.astype(np.float64)
    strata = np.array([AuditDesign.stratum(c) for c in answers.reads.confidence])
    errors, most = audit_errors(answers)
    mismatch, largest = {}, {}
    for name, d in errors.items():
        if name.startswith("audit:"):
            continue
        square = (e - d) ** 2
        overall = float(square[accepted].mean())
        mismatch[name] = [float(square[accepted & (strata == b)].mean())
                          if (accepted & (strata == b)).any() else overall
                          for b in range(len(RISK_EDGES) - 1)]
        largest[name] = [float(most[name][strata == b].max()) if (strata == b).any() else 1.0
                         for b in range(len(RISK_EDGES) - 1)]
    return mismatch, largest
