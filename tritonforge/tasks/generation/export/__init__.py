"""Export of causal language models with a KV cache (the generation pipeline).

The encoder exporter (:mod:`export.encoder`) handles one forward pass per request; a decoder is
called once per generated token with its past keys/values, so it gets its own spec type
(:class:`tasks.generation.export.spec.DecoderSpec`), graph wrapper, verification grid and quality gates.
"""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"  # held-out prompts and passages
