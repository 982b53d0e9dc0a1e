"""The chaos run (``make chaos``, ``tritonforge chaos``): :mod:`.outcomes` (what was observed, the
gates), :mod:`.probes` (the requests), :mod:`.injector` (traffic + faults), :mod:`.cli`."""
