"""Tuning from labelled data: the CLI, the predictions file format, and the decision-log export."""
