"""structlog set-up: JSON in a cluster (or when asked), key=value on a terminal.

Every log line has one format: the standard library's ``logging`` (aiohttp, asyncio,
kubernetes_asyncio, transitions) and Python's warnings go through the same structlog processors and
renderer as our own loggers, so a library's line is a JSON object in a pod and
key=value on a terminal too, with ``logger_name`` saying where it came from.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]
#: The levels ``--log-level`` accepts (lower case), least to most severe.
LEVELS = ("debug", "info", "warning", "error")


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is now (test runners swap and close it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _StdlibHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root handler ``configure`` installs (and replaces when called again)."""


def _in_cluster() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ


def _stdlib_logger_name(
    _logger: object, _method: str, event_dict: structlog.types.EventDict
) -> structlog.types.EventDict:
    """``logger_name`` of a standard-library record: its logger's name, as ours carry."""
    record = event_dict.get("_record")
    if isinstance(record, logging.LogRecord):
        event_dict.setdefault("logger_name", record.name)
    return event_dict


def configure(level: str = "info", fmt: LogFormat = "auto") -> None:
    """Configure structlog and stdlib logging once for the whole process.

    ``auto`` picks JSON inside a pod or when stderr is not a terminal, so log
    collectors get one object per line, and key=value for people at a terminal.
    Standard-library records are rendered by the same renderer (see the module doc).
    """
    use_json = fmt == "json" or (fmt == "auto" and (_in_cluster() or not sys.stderr.isatty()))
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = _StdlibHandler(_CurrentStderr())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, _stdlib_logger_name, structlog.stdlib.ExtraAdder()],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.StackInfoRenderer(),
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    # Python's warnings (DeprecationWarning from a library, ...) as records of the
    # `py.warnings` logger, so they come out in the same format rather than as raw text.
    logging.captureWarnings(True)
    # transitions narrates every callback at INFO; our own logs say what matters.
    logging.getLogger("transitions").setLevel(max(numeric, logging.WARNING))
    structlog.configure(
        processors=[
            *shared,
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
