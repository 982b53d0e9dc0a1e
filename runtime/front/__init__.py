"""The front: the public HTTP and gRPC relays in front of Triton's private sockets (body and
header guards, SSE, stream admission) and the OpenAI ``/v1`` routes (:mod:`.openai`)."""
