"""The supervisor: stub and process liveness, canary readiness, reloads and the pipeline health
endpoint."""
