"""Trackers a run logs to besides its CSV files (docs/tracking.md)."""
