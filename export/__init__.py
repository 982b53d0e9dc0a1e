"""Export stage: PyTorch -> verified ONNX (fp32, int8 QDQ) and TorchScript in the model repository.

``python -m tritonforge.export minilm --format all --quantize int8`` (see docs/export.md).
"""
