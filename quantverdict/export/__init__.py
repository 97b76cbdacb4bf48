"""Stage 2: torch module → ONNX graph (cached), and reading user ONNX files with named errors."""
from quantverdict.export.torchscript import export_onnx, load_onnx

__all__ = ["export_onnx", "load_onnx"]
