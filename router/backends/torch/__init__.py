"""In-process torch reads (extra torch): DiffusionGemma one-step, causal-LM and masked-LM slot reads."""
