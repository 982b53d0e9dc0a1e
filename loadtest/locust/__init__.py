"""Locust users (one base user per protocol with task hooks, :mod:`.base`), one locustfile per
task, and the bounded headless runs. No Locust import here: the bench imports the paths."""

from __future__ import annotations

from pathlib import Path

LOCUST_DIR = Path(__file__).resolve().parent
EMBED_LOCUSTFILE = LOCUST_DIR / "embed.py"
CLASSIFY_LOCUSTFILE = LOCUST_DIR / "classify.py"
GENERATE_LOCUSTFILE = LOCUST_DIR / "generate.py"
RAMP_LOCUSTFILE = LOCUST_DIR / "ramp.py"
