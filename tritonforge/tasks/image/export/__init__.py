"""The image task's export layer: a torchvision-style CNN -> verified ONNX (:mod:`.graph`) and
the int8 measurement (:mod:`.int8`)."""
