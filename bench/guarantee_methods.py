"""The threshold choosers bench/guarantee.py compares on one re-draw, all on the same rows:
slotgate split, slotgate cross-fitted, the naive rule, and MAPIE 1.6's risk controller.

How MAPIE is asked for slotgate's promise ("accepted answers are at least T accurate, with
probability at least 1 - delta"): the question "is the fast answer right?" is a binary problem
whose positive class is "right". The calibrated confidence is the positive-class probability
(``predict_function`` returns ``[1 - c, c]``); "accept" is MAPIE's positive prediction
(``c >= lambda``), so the *precision* of the positive predictions is exactly the accuracy of the
accepted answers. ``BinaryClassificationController(risk=precision, target_level=T,
confidence_level=1 - delta)`` then returns the lambdas whose precision it certifies (Learn then
Test: a Hoeffding-Bentkus p-value per lambda, family-wise error control across lambdas), and
``best_predict_param`` is the one with most recall of right answers, i.e. the lowest certified
lambda (the most coverage). Two MAPIE set-ups are run: its defaults (a 100-point grid
0..0.99, Bonferroni-Holm), and fixed-sequence testing over a 1000-point grid walked from high to
low from the confidence that accepts 100 rows (the same multiple-testing scheme and start as
slotgate, so the difference is the p-value and the grid).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Scored:
    """Confidences on rows that chose a threshold, and the held-back rows' confidences."""

    tune_confidence: FloatArray
    tune_correct: NDArray[np.bool_]
    held_confidence: FloatArray
    held_correct: NDArray[np.bool_]


def fit_lr(features: Any, labels: NDArray[np.int64], n_classes: int, seed: int) -> Any:
    """The fast model of the re-draws. On an embeddings matrix: logistic regression on fixed
    sentence embeddings (the cheap model). On an array of texts: slotgate's TF-IDF pipeline
    (``train --kind tfidf``). It returns a predict function with one column per class of the
    whole pool (zeros for a class this draw never saw), so every split shares one option list."""
    from sklearn.linear_model import LogisticRegression

    if features.dtype.kind in "OU":
        from router.backends.sklearn import build_tfidf_pipeline

        model = build_tfidf_pipeline(seed=seed)
        model.fit(list(features), labels)
    else:
        model = LogisticRegression(C=10.0, max_iter=300, tol=1e-3, random_state=seed)
        model.fit(features, labels)

    def predict(x: Any) -> FloatArray:
        out = np.zeros((len(x), n_classes))
        out[:, model.classes_] = model.predict_proba(list(x) if x.dtype.kind in "OU" else x)
        return out

    return predict


def answers_of(proba: FloatArray, calibrated: FloatArray) -> tuple[NDArray[np.int64], FloatArray]:
    from policies.fitting import answer_confidence

    return answer_confidence(proba, calibrated)


def split_scores(x: FloatArray, y: NDArray[np.int64], labelled: NDArray[np.int64],
                 held: NDArray[np.int64], *, n_classes: int, calibrator: str, seed: int,
                 holdout: float = 0.3) -> Scored:
    """Today's path: the model fits 70% of the labelled rows; of the other 30%, half fit the
    calibrator and half choose the threshold (``Policy.fit``'s split)."""
    from calibration.calibrators import make_calibrator
    from policies.fitting import split_rows

    cut = round((1.0 - holdout) * len(labelled))
    fit_rows, tune_rows = labelled[:cut], labelled[cut:]
    predict = fit_lr(x[fit_rows], y[fit_rows], n_classes, seed)
    proba = predict(x[tune_rows])
    cal, thr = split_rows(len(tune_rows), calibration_fraction=0.5, seed=seed)
    fitted = make_calibrator(calibrator).fit(proba[cal], y[tune_rows][cal])
    answers, conf = answers_of(proba[thr], fitted.transform(proba[thr]))
    held_proba = predict(x[held])
    held_answers, held_conf = answers_of(held_proba, fitted.transform(held_proba))
    return Scored(conf, answers == y[tune_rows][thr], held_conf, held_answers == y[held])


def crossfit_scores(x: FloatArray, y: NDArray[np.int64], labelled: NDArray[np.int64],
                    held: NDArray[np.int64], *, n_classes: int, calibrator: str, seed: int,
                    n_folds: int) -> tuple[Scored, Scored]:
    """The cross-fitted path: out-of-fold reads of every labelled row (as ``train --cv``), the
    calibrator cross-fitted over the same folds (as ``tune`` on such a file), the final model
    and calibrator fit on all labelled rows."""
    from calibration.calibrators import make_calibrator
    from calibration.crossfit import crossfit_calibrated, stratified_folds

    y_lab = y[labelled]
    folds = stratified_folds(y_lab.tolist(), n_folds=n_folds, seed=seed)
    oof = np.zeros((len(labelled), n_classes))
    fold_models = []
    for k in range(n_folds):
        inside = folds == k
        fold_models.append(fit_lr(x[labelled[~inside]], y_lab[~inside], n_classes, seed))
        oof[inside] = fold_models[-1](x[labelled[inside]])
    answers, conf = answers_of(oof, crossfit_calibrated(oof, y_lab, folds, calibrator=calibrator))
    final = fit_lr(x[labelled], y_lab, n_classes, seed)
    fitted = make_calibrator(calibrator).fit(oof, y_lab)
    held_proba = final(x[held])
    held_answers, held_conf = answers_of(held_proba, fitted.transform(held_proba))
    # Diagnostic: the same threshold rows, but fold 0's own model and calibrator serve, i.e. the
    # pipeline that read those rows instead of the final one fit on all of them.
    fold0_cal = make_calibrator(calibrator).fit(oof[folds != 0], y_lab[folds != 0])
    fold0_proba = fold_models[0](x[held])
    fold0_answers, fold0_conf = answers_of(fold0_proba, fold0_cal.transform(fold0_proba))
    return (Scored(conf, answers == y_lab, held_conf, held_answers == y[held]),
            Scored(conf, answers == y_lab, fold0_conf, fold0_answers == y[held]))


def pool_oof(x: Any, y: NDArray[np.int64], *, n_classes: int, seed: int, n_folds: int
             ) -> FloatArray:
    """``--fit-once``: every pool row read by a model fit on the other folds of the whole pool.
    Draws then re-draw which rows tune and which are held back, with no refit: the search and
    its guarantee on exchangeable rows, without the final model's shift (docs/calibration.md)."""
    from calibration.crossfit import stratified_folds

    folds = stratified_folds(y.tolist(), n_folds=n_folds, seed=seed)
    oof = np.zeros((len(y), n_classes))
    for k in range(n_folds):
        inside = folds == k
        oof[inside] = fit_lr(x[~inside], y[~inside], n_classes, seed)(x[inside])
    return oof


def oof_draw(oof: FloatArray, y: NDArray[np.int64], labelled: NDArray[np.int64],
             held: NDArray[np.int64], *, calibrator: str, seed: int, n_folds: int
             ) -> dict[str, Scored]:
    """One ``--fit-once`` draw: cross-fitted (the calibrator cross-fitted over the tuning rows,
    then fit on all of them for the held-back rows) and split (half of 30% of the tuning rows
    fit the calibrator, the other half choose the threshold)."""
    from calibration.calibrators import make_calibrator
    from calibration.crossfit import crossfit_calibrated, stratified_folds
    from policies.fitting import split_rows

    y_lab = y[labelled]
    folds = stratified_folds(y_lab.tolist(), n_folds=n_folds, seed=seed)
    answers, conf = answers_of(oof[labelled], crossfit_calibrated(
        oof[labelled], y_lab, folds, calibrator=calibrator))
    fitted = make_calibrator(calibrator).fit(oof[labelled], y_lab)
    held_answers, held_conf = answers_of(oof[held], fitted.transform(oof[held]))
    crossfit = Scored(conf, answers == y_lab, held_conf, held_answers == y[held])
    tune_rows = labelled[round(0.7 * len(labelled)):]
    cal, thr = split_rows(len(tune_rows), calibration_fraction=0.5, seed=seed)
    split_cal = make_calibrator(calibrator).fit(oof[tune_rows][cal], y[tune_rows][cal])
    answers, conf = answers_of(oof[tune_rows][thr], split_cal.transform(oof[tune_rows][thr]))
    held_answers, held_conf = answers_of(oof[held], split_cal.transform(oof[held]))
    split = Scored(conf, answers == y[tune_rows][thr], held_conf, held_answers == y[held])
    return {"split": split, "cross-fitted": crossfit}


def slotgate_threshold(scored: Scored, *, target: float, delta: float) -> float | None:
    """What ``slotgate tune`` chooses (``calibration.risk.guaranteed_threshold``)."""
    from calibration.risk import guaranteed_threshold

    return guaranteed_threshold(scored.tune_confidence, scored.tune_correct,
                                target_accuracy=target, delta=delta).threshold


def plain_fixed_sequence_threshold(scored: Scored, *, target: float, delta: float
                                   ) -> float | None:
    """The single-walk search (``starts=1``): one fixed-sequence walk over every distinct
    confidence from the top, which stops at the first failure."""
    from calibration.risk import guaranteed_threshold

    return guaranteed_threshold(scored.tune_confidence, scored.tune_correct,
                                target_accuracy=target, delta=delta, starts=1,
                                grid_step=0.0).threshold


def naive_threshold(scored: Scored, *, target: float, delta: float) -> float | None:
    from calibration.risk import naive_threshold as naive

    return naive(scored.tune_confidence, scored.tune_correct, target_accuracy=target)


def mapie_threshold(scored: Scored, *, target: float, delta: float, fixed_sequence: bool = False
                    ) -> float | None:
    """MAPIE's BinaryClassificationController on the same rows (see the module docstring)."""
    from mapie.risk_control import BinaryClassificationController, precision

    if fixed_sequence:
        # High to low, from where 100 rows are accepted: slotgate's walk starts there too (a
        # start above that has too few rows to certify anything, and the walk would end at once).
        start = float(np.sort(scored.tune_confidence)[::-1][min(99, len(scored.tune_confidence) - 1)])
        grid = np.linspace(start, 0.0, 1000)
        options: dict[str, Any] = {"list_predict_params": grid, "fwer_method": "fixed_sequence"}
    else:
        options = {}  # MAPIE's defaults

    def predict_function(conf: Any) -> FloatArray:
        c = np.asarray(conf, dtype=np.float64).reshape(-1)
        return np.column_stack([1.0 - c, c])

    controller = BinaryClassificationController(
        predict_function=predict_function, risk=precision, target_level=target,
        confidence_level=1.0 - delta, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "risk couldn't be controlled" is a result here
        controller.calibrate(scored.tune_confidence, scored.tune_correct.astype(int))
    best = controller.best_predict_param
    return None if best is None or not np.isfinite(best) else float(best)


def outcome(scored: Scored, threshold: float | None, target: float) -> dict[str, Any]:
    """Coverage and accepted accuracy on the held-back rows; a violation is accepted accuracy
    below the target (no threshold: everything escalates, coverage 0, no violation)."""
    if threshold is None:
        return {"threshold": None, "coverage": 0.0, "accepted_accuracy": None, "violated": False,
                "tune_accepted_accuracy": None}
    accepted = scored.held_confidence >= threshold
    accuracy = float(scored.held_correct[accepted].mean()) if accepted.any() else None
    on_tune = scored.tune_confidence >= threshold
    return {"threshold": threshold, "coverage": float(accepted.mean()),
            "accepted_accuracy": accuracy, "violated": accuracy is not None and accuracy < target,
            # what the rows that chose the threshold saw there: held minus this is the optimism
            "tune_accepted_accuracy": float(scored.tune_correct[on_tune].mean())
            if on_tune.any() else None}


# name: (which rows choose the threshold, chooser)
METHODS: dict[str, tuple[str, Callable[..., float | None]]] = {
    "split": ("split", slotgate_threshold),
    "cross-fitted": ("cross-fitted", slotgate_threshold),
    "cross-fitted, plain fixed sequence (one walk)": (
        "cross-fitted", plain_fixed_sequence_threshold),
    "naive (split rows)": ("split", naive_threshold),
    "cross-fitted, fold-0 model serves (diagnostic)": ("fold-0", slotgate_threshold),
    "MAPIE (split rows)": ("split", mapie_threshold),
    "MAPIE (cross-fitted rows)": ("cross-fitted", mapie_threshold),
    "MAPIE fixed-sequence (cross-fitted rows)": (
        "cross-fitted", lambda s, **kw: mapie_threshold(s, fixed_sequence=True, **kw)),
}


def choose_all(scored: dict[str, Scored], *, targets: list[float], delta: float
               ) -> dict[str, dict[str, Any]]:
    """Every method's outcome on one draw, per target ("0.95")."""
    return {f"{target:.2f}": {name: outcome(scored[rows], chooser(scored[rows], target=target,
                                                                  delta=delta), target)
                              for name, (rows, chooser) in METHODS.items() if rows in scored}
            for target in targets}
