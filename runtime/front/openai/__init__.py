"""The OpenAI-compatible ``/v1`` routes of the front: catalog, request parsing, responses and
what goes to Triton."""
