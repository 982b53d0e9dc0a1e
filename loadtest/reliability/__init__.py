"""Reliability runs: leak soaks, chaos, the ramp past capacity."""
