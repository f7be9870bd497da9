"""structlog set-up: JSON in a cluster (or when asked), key=value on a terminal."""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is now (test runners swap and close it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _in_cluster() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ


def configure(level: str = "info", fmt: LogFormat = "auto") -> None:
    """Configure structlog and stdlib logging once for the whole process.

    ``auto`` picks JSON inside a pod or when stderr is not a terminal, so log
    collectors get one object per line, and key=value for people at a terminal.
    """
    use_json = fmt == "json" or (fmt == "auto" and (_in_cluster() or not sys.stderr.isatty()))
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s")
    # transitions narrates every callback at INFO; our own logs say what matters.
    logging.getLogger("transitions").setLevel(max(numeric, logging.WARNING))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        # Not cached, so structlog.testing.capture_logs() sees every logger.
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A lazy logger with ``logger_name=<name>`` so every line says where it came from.

    Lazy (no ``bind`` here) so the configuration in force when it logs applies,
    including ``structlog.testing.capture_logs`` in tests.
    """
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(logger_name=name)
    return logger
