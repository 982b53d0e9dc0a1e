"""Locust users (one base user per protocol with task hooks, :mod:`.base`), the generation and
ramp locustfiles, and the bounded headless runs (a pipeline task's locustfile lives in its folder's
``loadtest``: ``LOCUSTFILE``, ``USERS``). No Locust import here: the bench imports the paths."""

from __future__ import annotations

from pathlib import Path

LOCUST_DIR = Path(__file__).resolve().parent
GENERATE_LOCUSTFILE = LOCUST_DIR / "generate.py"
RAMP_LOCUSTFILE = LOCUST_DIR / "ramp.py"
