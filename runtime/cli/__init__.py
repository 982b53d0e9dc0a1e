"""The runtime's command line: ``serve``, ``demo``, ``lint``, ``front``; it composes the launcher,
the front and the supervisor."""
