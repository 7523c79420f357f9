"""What slotgate keeps: the read/answer cache, the decision log, and Prometheus metrics."""
