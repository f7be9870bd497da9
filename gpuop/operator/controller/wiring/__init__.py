"""Wiring: builds the caches and the units, routes events to work-queue keys and
dispatches each key to its pass."""
