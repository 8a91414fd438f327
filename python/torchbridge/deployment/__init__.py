"""Exporting models for deployment: torch.export programs, AOTInductor packages, TorchScript, ONNX
and safetensors.

Every export is verified before it returns: the written file is loaded back (an exported program
through ``torch.export.load``, an AOTInductor package through ``aoti_load_package``, TorchScript
through ``torch.jit.load``, ONNX through onnxruntime, safetensors through TorchBridge's reader) and its
outputs or tensors are compared with the original model's. A mismatch raises
:class:`ExportVerificationError`. Each function returns an :class:`ExportResult`, which is
``os.PathLike`` (``str(result)`` and ``open(result)`` give the written file) and carries the
measured maximum absolute error. Programs, packages, TorchScript and ONNX files are written
beside their target and moved over it only once verified, so a failed export leaves an earlier
file at that path as it was.

Models are exported in eval mode (dropout off, batch norm on running statistics); a model that
was training is put back in training mode afterwards.
"""

from ._result import ExportResult, ExportVerificationError
from ._exported import export_to_aoti, export_to_exported_program
from ._safetensors import export_to_safetensors
from ._torchscript import export_to_torchscript
from ._onnx import export_to_onnx

__all__ = ["ExportResult", "ExportVerificationError", "export_to_aoti", "export_to_exported_program", "export_to_onnx",
           "export_to_safetensors", "export_to_torchscript"]
