"""Watching tuned policies in production: audits, drift and accuracy alarms, and their action."""
