"""Exported graphs: writing them and running them.

- :mod:`embforge.onnx.export`: ONNX export of bi-encoders and cross-encoders, with a parity gate against PyTorch
  and an optional int8 copy (``embforge export onnx``).
- :mod:`embforge.onnx.runtime`: :class:`~embforge.onnx.runtime.OnnxEncoder` and
  :class:`~embforge.onnx.runtime.OnnxCrossEncoder`, onnxruntime behind the PyTorch models' API.
- :mod:`embforge.onnx.openvino`: the same export folder compiled by OpenVINO (fp32 or NNCF static int8).
- :mod:`embforge.onnx.backends`: pick and load a runtime for serving (``embforge serve --backend``), exporting on
  the fly into a cache.

Nothing is imported here: ``import embforge.onnx.runtime`` does not pull the exporter.
"""
