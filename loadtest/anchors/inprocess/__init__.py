"""In-process limits (no server), one module per task."""
