"""Text generation: the Triton generate convention (field names, the ``variant`` check, the
prompt through the chat template); the wire names the front and the client read live here, so
neither imports the scheduler. The pure parts the ``generate`` model is made of are their own
modules: :mod:`tritonforge.sampling` (sampling parameters, next-token sampling),
:mod:`tritonforge.text_stream` (streamed detokenization with stop strings),
:mod:`tritonforge.kv_batch` and :mod:`tritonforge.scheduler` (the in-flight batch scheduler).

The ``generate`` Triton model is a thin loop over these; the export's fidelity check and the
in-process benchmark drive the same :class:`~tritonforge.scheduler.Scheduler` with an ONNX Runtime
step function, so the served code path is the verified one.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tritonforge.errors import InvalidInputError
from tritonforge.pipelines import VARIANT_PARAMETER

if TYPE_CHECKING:
    import jinja2

# Field names of the Triton generate convention (vLLM / TensorRT-LLM backends, genai-perf).
TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
FINISH_REASON = "finish_reason"
# The request parameter carrying a request's queue priority to a generate model (1 is served
# first; absent or 0: after every level). Triton consumes its own ``priority`` parameter and the
# Python stub cannot read it, so the front sets this one from the tenant (never from the client).
QUEUE_PRIORITY_PARAMETER = "queue_priority"


def queue_priority(values: Mapping[str, Any]) -> int:
    """The :data:`QUEUE_PRIORITY_PARAMETER` of a request's parameters (0 when absent);
    :class:`InvalidInputError` naming it when it is not a whole number >= 0."""
    value = values.get(QUEUE_PRIORITY_PARAMETER, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(
            f"{QUEUE_PRIORITY_PARAMETER} must be a whole number >= 0, got {str(value)[:20]!r}"
        )
    return value


# The request parameter naming a request's prefix-cache namespace (vLLM's ``cache_salt``): a
# prompt goes on only from recent prompts of the same salt. The front puts its tenant in front
# of a client's own (runtime/front/guard.py), so tenants never share the cache.
CACHE_SALT_PARAMETER = "cache_salt"
MAX_CACHE_SALT_CHARS = 512


def cache_salt(values: Mapping[str, Any]) -> str:
    """The :data:`CACHE_SALT_PARAMETER` of a request's parameters ("" when absent: the shared
    namespace); :class:`InvalidInputError` naming it when it is not a string of at most
    :data:`MAX_CACHE_SALT_CHARS` characters."""
    value = values.get(CACHE_SALT_PARAMETER, "")
    if not isinstance(value, str) or len(value) > MAX_CACHE_SALT_CHARS:
        raise InvalidInputError(
            f"{CACHE_SALT_PARAMETER} must be a string of at most {MAX_CACHE_SALT_CHARS} "
            f"characters, got {type(value).__name__} {str(value)[:20]!r}"
        )
    return value


def check_variant(requested: Any, served: str, model: str) -> None:
    """A request's ``variant`` parameter (None: not pinned) against the variant ``model`` serves;
    :class:`InvalidInputError` naming the field on a mismatch (each variant is its own model: a
    request naming another variant is refused, never answered by another decoder)."""
    if requested is None:
        return
    requested = requested.decode() if isinstance(requested, bytes) else str(requested)
    if requested != served:
        raise InvalidInputError(
            f"{VARIANT_PARAMETER}: model {model!r} serves variant {served!r}, not "
            f"{requested!r}; send the request to the model whose tritonforge.variant is "
            f"{requested!r}"
        )


def render_prompt(text: str, template: str | None, use_template: bool) -> str:
    """The prompt the model sees: ``text`` as one user message through the chat template (a
    Jinja template, rendered sandboxed as Hugging Face does), or ``text`` as is."""
    if not use_template or not template:
        return text
    return render_chat([{"role": "user", "content": text}], template)


def with_bos(ids: list[int], bos_id: int | None) -> list[int]:
    """``ids`` starting with ``bos_id`` (the checkpoint's tokenizer adds it to every prompt;
    None: it adds nothing), unless they already do (a chat template that writes it) or are
    empty."""
    if bos_id is None or not ids or ids[0] == bos_id:
        return ids
    return [bos_id, *ids]


def render_chat(messages: Sequence[Mapping[str, str]], template: str) -> str:
    """``messages`` (``role``/``content``) through the chat template with the generation prompt
    appended (the OpenAI ``/v1/chat/completions`` path; one user message is :func:`render_prompt`)."""
    return _compiled(template).render(
        messages=[dict(m) for m in messages], add_generation_prompt=True
    )


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    """``template`` compiled once (a model serves one template; compiling it took ~1.6 ms of every
    request's time, holding the interpreter lock the scheduler thread needs: py-spy of the served
    ``generate`` stub at 16 streams, docs/performance.md). A compiled Jinja template renders
    from any thread."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template)
