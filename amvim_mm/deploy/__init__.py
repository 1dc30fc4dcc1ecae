"""Deployment: ONNX export (:mod:`.export`), ONNX Runtime sessions and comparisons
(:mod:`.ort`) and the whole-task modules the deploy tools export (:mod:`.tasks`, imported on
use: it needs the OpenMMLab libraries). onnx / onnxruntime are optional extras
(``requirements/deploy.txt``), imported only when a function needs them."""
from .export import MIN_OPSET, export_mode, export_onnx
from .ort import compare_onnx, ort_session, run_onnx

__all__ = ['MIN_OPSET', 'export_mode', 'export_onnx', 'compare_onnx', 'ort_session',
           'run_onnx']
