"""The launcher: one tritonserver process (settings, argv, process group, log, repository API,
metrics, planned loads); it builds neither the front nor the supervisor."""
