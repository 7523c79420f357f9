"""Deprecated: a cascade is a ``policies.policy.Policy`` of several tiers. ``CascadePolicy``,
``CascadeOptions``, ``Tier`` and ``TierCost`` stay importable from here for one release, each
access warning with ``DeprecationWarning``."""

from policies.deprecated import moved

__getattr__ = moved(__name__, {
    "CascadePolicy": ("policies.policy", "Policy"),
    "CascadeOptions": ("policies.options", "PolicyOptions"),
    "Tier": ("policies.policy", "Tier"),
    "TierCost": ("policies.options", "TierCost"),
})
