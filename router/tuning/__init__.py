"""Tuning from labelled data, as a library: the predictions file format, cross-fitting, paired
comparison and the decision-log export. The ``slotgate`` commands around it are in router/cli."""
