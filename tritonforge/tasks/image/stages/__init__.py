"""The image task's Triton Python models (copied into the model repository as ``model.py``)."""
