"""Sleeping that wakes up early on shutdown."""

from __future__ import annotations

import asyncio
import contextlib


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` or until ``stop`` is set, whichever comes first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
