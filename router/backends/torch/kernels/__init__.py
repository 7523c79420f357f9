"""Each op the DiffusionGemma read runs, its torch reference beside its Triton or fused form:
attention (attention.py, split_kv.py), the experts (moe.py, triton_moe.py, triton_router.py) and
the row ops (row_ops.py, triton_rows.py). Nothing here knows the model or the serving."""
