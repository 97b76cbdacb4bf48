"""Timing: the timing loops (``bench``), speedup floors (``speedup``) and the GPU lane (``gpu_lane``)."""
