"""Serving the reads: the readers (diffusion.py, causal.py, masked.py), the reader built from the
options (build.py), the coalescer, the CUDA graphs, the warm-up and the prompt and prefix caches."""
