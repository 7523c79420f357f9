"""The operator page (``/operator``): each policy's question, promise, live coverage and accuracy
with their confidence sequences, its watch and alarms (with a clear button), and the last
decisions, served by slotgate itself to holders of an admin key (docs/operator.md)."""
