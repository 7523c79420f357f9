"""Near misses: an unscoped decision whose question differs from a loaded policy's in one field
only (``policies.scope.near_miss``) is counted per policy and field in ``/metrics``
(``slotgate_question_near_miss_total``) and logged once per policy and field per process,
saying what differs: the same question that lost its policy to a small change shows up there.
The routing service counts after every ``route`` call, so both wires (and staged bodies) do."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from policies.file import PolicyFile
from policies.scope import QuestionScope, near_miss
from policies.types import Decision, DecisionRequest
from router.routing.plan import UNSCOPED_POLICY_ID
from router.routing.registry import PolicyRegistry
from router.store.metrics import Metrics

log = logging.getLogger("slotgate")


def tuned_scopes(registry: PolicyRegistry) -> dict[str, QuestionScope]:
    """The scope of every loaded policy that records its question, by policy id (a policy tuned
    on one logged request records none and is matched exactly, never nearly). Built once per
    set of loaded files: a policy's id hashes its whole file, about 0.3 ms a policy."""
    files = tuple(loaded.file for loaded in registry.loaded())
    for seen, scopes in _TUNED:
        if len(seen) == len(files) and all(a is b for a, b in zip(seen, files, strict=True)):
            return scopes
    scopes = {file.policy_id: QuestionScope(file.question.question(), frozenset(file.options))
              for file in files if file.question is not None and file.options}
    _TUNED[:] = [(files, scopes)]
    return scopes


# The last loaded files (held, so no other object takes their ids) and their scopes.
_TUNED: list[tuple[tuple[PolicyFile, ...], dict[str, QuestionScope]]] = []


def count_near_misses(requests: Sequence[DecisionRequest], decisions: Sequence[Decision], *,
                      registry: PolicyRegistry, metrics: Metrics) -> None:
    """Count (and log, once per policy and field) each unscoped decision of ``requests`` that
    nearly matches a loaded policy."""
    unscoped = [r for r, d in zip(requests, decisions, strict=True)
                if d.policy_id == UNSCOPED_POLICY_ID]
    if not unscoped:
        return
    tuned = tuned_scopes(registry)
    for request in unscoped:
        found = near_miss(QuestionScope.of(request), tuned)
        if found is None:
            continue
        policy_id, field, detail = found
        if metrics.question_near_miss(policy_id, field):
            log.warning("question %r is unscoped but differs from policy %s's question in %s "
                        "only (%s); if it is the same question, re-tune the policy on it "
                        "(docs/calibration.md, \"QuestionScope\")", request.question_id, policy_id,
                        field, detail)
