"""A pytest-based accuracy and performance regression harness for quantized models.

Pipeline: model spec → ONNX export → precision recipe → backend (build + run) → compare.
"""

__version__ = "0.1.0"
