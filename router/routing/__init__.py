"""Routing: the service (fast read, calibrated policy, escalation), policy registry, backpressure, slow path."""
