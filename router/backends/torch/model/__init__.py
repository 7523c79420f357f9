"""The DiffusionGemma one-pass read (onepass.py), the per-layer functions it calls
(layer_ops.py, joint_streams.py, compiled.py) and the kernel choice that fixes them once, at
construction (choice.py)."""
