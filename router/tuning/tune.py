"""Tuning a policy from labelled predictions, one file per fast tier: the library behind
``slotgate tune`` (one to n tiers alike), which tests and benchmarks import. Every input is
checked before anything is fit; a problem raises ``TuneError`` naming the flag or the file and
field, and nothing is written.

One tier: out-of-fold predictions (rows carry a fold) are cross-fitted over their folds, with
``cv`` over random folds, else the rows are split. Several tiers: the rows are split (their
folds, if any, are not used). Labels that are the slow model's answers (``export-log
--reference slow``) make the promise agreement with the slow model, and the file says so."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from policies.policy import Policy, TierCost

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from policies.file import PolicyFile
    from policies.scope import Question
    from router.tuning.predictions import Predictions

# The flags only one shape of policy takes (``PolicyOptions.check_shape`` holds the same rule).
ONE_TIER_FLAGS = ("max_escalation", "per_answer_floor", "cv", "model", "report")
CASCADE_FLAGS = ("tier", "slow_cost", "max_slow_share")


class TuneError(ValueError):
    """Why a policy cannot be tuned from these inputs (the message names the flag or field)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneRequest:
    """What ``slotgate tune`` was asked: ``params`` (``PolicyOptions`` fields), the tiers'
    names and costs (several files only), the question (None: the rows' own), the file's name,
    mode and monitoring fields (``watch``: ``on_alarm``, ``audit_boost``; left out, the file's
    defaults), one tier only, the model of an out-of-fold file and ``cv``, and the key that
    signs the file (``policy.signing_key``; None: sealed with its digest only)."""

    params: dict[str, Any]
    name: str
    tiers: list[TierCost] | None = None
    slow_cost: float | None = None
    question: Question | None = None
    shadow: bool | None = None
    audit_rate: float = 0.0
    alarm_alpha: float = 0.05
    watch: dict[str, Any] = field(default_factory=dict)
    model: Path | None = None
    cv: int | None = None
    signing_key: bytes | None = None


@dataclass(frozen=True, slots=True)
class Tuned:
    """A tuned policy: its file (not yet written), the fitted policy, and how many of the
    labelled rows were labelled by the slow model."""

    file: PolicyFile
    fitted: Policy
    n_slow: int
    n_labelled: int


def tune_policy(data: list[Predictions], request: TuneRequest) -> Tuned:
    """The policy ``request`` asks for, fit on ``data`` (one labelled predictions file per
    tier, in read order, the same rows)."""
    from router.tuning.cascade import data_hash_of

    first = data[0]
    question, logged = _question(data, request.question)
    fitter = Policy(**request.params)
    rows, folds = (tuning_rows(first, request, question) if len(data) == 1
                   else (_same_rows(data), None))
    tiers, slow_cost = _tiers(request, len(data))
    try:
        fitter.fit([read.proba[rows] for read in data], first.y_true[rows],
                   options=first.options, folds=folds, tiers=tiers, slow_cost=slow_cost,
                   fingerprints=[one_value(read.fingerprints, "fingerprint", read.path) or "unknown"
                                 for read in data])
    except ValueError as exc:
        raise TuneError(f"{first.path if len(data) == 1 else '--preds'}: {exc}") from exc
    n_slow = sum(ref == "slow" for ref, known in zip(first.references, first.labelled,
                                                       strict=True) if known)
    policy = fitter.to_file(
        name=request.name, data_hash=data_hash_of(data),
        # The scope (policies.scope): the question, else the one logged question the rows came
        # from (export-log), exactly as it was asked.
        question=question, logged_signature=None if question is not None else logged,
        guarantee="agreement_with_slow" if n_slow else "accuracy",
        # Tuned on a shadow log: the policy exists to leave shadow mode, so it says so.
        shadow=False if request.shadow is None and n_slow else request.shadow,
        audit_rate=request.audit_rate, alarm_alpha=request.alarm_alpha,
        signing_key=request.signing_key, **request.watch)
    return Tuned(policy, fitter, n_slow, int(first.labelled.sum()))


def _question(data: list[Predictions], named: Question | None
              ) -> tuple[Question | None, str | None]:
    """The question the policy answers (the rows', or ``named``) and, for rows exported from
    the decision log, their one logged question's signature."""
    for read in data:
        if read.n_novel:
            raise TuneError(f"{read.path}: field 'label': {read.n_novel} rows are labelled with "
                            "none of the options (novel); a policy is tuned on rows of its own "
                            "options only")
    logged = {one_value(read.signatures, "signature", read.path) for read in data} - {None}
    if len(logged) > 1:
        raise TuneError(f"--preds: the files come from {len(logged)} different logged "
                        "questions (field 'signature'); a cascade's tiers read one question")
    asked = {q for q in (question_of_rows(read, named) for read in data) if q is not None}
    if len(asked) > 1:
        raise TuneError("--preds: the files answer different questions (field 'question': "
                        + ", ".join(sorted(q.describe() for q in asked))
                        + "); a cascade's tiers read one question")
    question, signature = (asked.pop() if asked else None), (logged.pop() if logged else None)
    if question is None and signature is None:
        where = data[0].path if len(data) == 1 else "the --preds files"
        raise TuneError(f"--question: {where} records no question and none was named: name "
                        "the question this policy answers (--question, and --instructions, "
                        "--context, --question-kind where it has them), or train with "
                        "`slotgate train --question ...` (docs/calibration.md, \"Scope\")")
    return question, signature


def question_of_rows(data: Predictions, named: Question | None) -> Question | None:
    """The question ``data``'s rows record, or ``named`` (which must be the same)."""
    recorded = data.question
    if named is not None and recorded is not None and named != recorded:
        raise TuneError(f"--question: {data.path} answers question {recorded.describe()}, not "
                        f"{named.describe()}; a policy is tuned on rows of its own question")
    return named or recorded


def _tiers(request: TuneRequest, n_files: int) -> tuple[list[TierCost] | None, float | None]:
    if n_files == 1:
        return None, None
    tiers, slow_cost = request.tiers, request.slow_cost
    if tiers is None or len(tiers) != n_files:
        raise TuneError(f"--tier: a cascade of {n_files} --preds needs one --tier NAME=COST per "
                        f"file, in their order (got {0 if tiers is None else len(tiers)})")
    if slow_cost is None:
        raise TuneError("--slow-cost: a cascade needs the cost of one slow-model call (in "
                        "--tier's unit)")
    if not math.isfinite(slow_cost) or slow_cost < 0:
        raise TuneError(f"--slow-cost: must be a finite number >= 0 (got {slow_cost!r})")
    return tiers, slow_cost


def _same_rows(data: list[Predictions]) -> NDArray[np.bool_]:
    from router.tuning.cascade import check_same_rows
    from router.tuning.predictions import PredictionsError

    try:
        check_same_rows(data)
    except PredictionsError as exc:
        raise TuneError(str(exc)) from exc
    return data[0].labelled  # the same rows in every file (labels checked)


def tuning_rows(data: Predictions, request: TuneRequest, question: Question | None
                ) -> tuple[Any, NDArray[np.int64] | None]:
    """One tier's rows to tune on and their folds (None: split): an out-of-fold file's own
    folds (all its rows, checked against the model), random folds with ``cv``, else the
    labelled rows."""
    from router.tuning.crossfit import check_crossfit_rows
    from router.tuning.predictions import PredictionsError

    try:
        folds = check_crossfit_rows(data)
    except PredictionsError as exc:
        raise TuneError(str(exc)) from exc
    if folds is not None:
        if request.cv is not None:
            raise TuneError(f"--cv: {data.path} is already out-of-fold (its rows carry a "
                            "'fold')")
        check_model(data, request.model, question=question)
        return slice(None), folds
    if request.model is not None:
        raise TuneError(f"--model goes with an out-of-fold --preds file (rows with a 'fold'); "
                        f"{data.path} has none")
    if request.cv is not None:
        from calibration.crossfit import random_folds

        try:
            folds = random_folds(int(data.labelled.sum()), n_folds=request.cv,
                                 seed=int(request.params.get("seed", 0)))
        except ValueError as exc:
            raise TuneError(f"--cv: {str(exc).removeprefix('n_folds ')}") from exc
    return data.labelled, folds


def check_model(data: Predictions, model: Path | None, *, question: Question | None) -> None:
    """An out-of-fold file must come with the model trained with it, and match its rows and
    the question (a policy must not cover a question its model refuses to read)."""
    from router.backends.sklearn import SklearnBackend
    from router.errors import ConfigError
    from router.tuning.crossfit import check_matches_model
    from router.tuning.predictions import PredictionsError

    if model is None:
        raise TuneError(f"{data.path}: rows carry a 'fold' (out-of-fold reads): pass --model, "
                        "the model `train --cv` saved with them, so they can be checked against "
                        "its training rows")
    try:
        backend = SklearnBackend(model)
    except ConfigError as exc:
        raise TuneError(f"--model: {exc}") from exc
    try:
        check_matches_model(data, backend.model.meta, model_name=str(model),
                            model_fingerprint=backend.fingerprint)
    except PredictionsError as exc:
        raise TuneError(str(exc)) from exc
    trained_for = backend.model.question
    if trained_for is not None and question is not None and trained_for != question:
        raise TuneError(f"--model: {model} was trained for question {trained_for.describe()}, "
                        f"not {question.describe()}; it reads no other question")


def one_value(values: list[str | None], what: str, path: Path) -> str | None:
    """The one value every row carries (None: none does)."""
    distinct = {v for v in values if v is not None}
    if len(distinct) > 1:
        raise TuneError(f"{path}: field {what!r}: rows carry {len(distinct)} different values "
                        "(predictions of different backends or questions in one file)")
    return distinct.pop() if distinct else None
