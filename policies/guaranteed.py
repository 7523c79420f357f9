"""Deprecated: the one-tier policy is ``policies.policy.Policy``, which serves one to n tiers.
``GuaranteedPolicy`` and the option models stay importable from here for one release, each
access warning with ``DeprecationWarning``."""

from policies.deprecated import moved

__getattr__ = moved(__name__, {
    "GuaranteedPolicy": ("policies.policy", "Policy"),
    "TuneOptions": ("policies.options", "PolicyOptions"),
    "GuaranteeOptions": ("policies.options", "PolicyOptions"),
    "answer_confidence": ("policies.fitting", "answer_confidence"),
    "split_rows": ("policies.fitting", "split_rows"),
})
