"""Every log line has one format: standard-library records (aiohttp, asyncio,
kubernetes_asyncio) are rendered by structlog as our own lines are."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator

import pytest
import structlog

from gpuop import log


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
    logging.captureWarnings(False)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_a_stdlib_record_is_a_json_line_like_ours(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure("info", "json")
    logging.getLogger("aiohttp.access").info("GET /metrics %s", 200)
    log.get_logger("gpuop.test").info("reconciled", key="cluster")
    library, ours = (json.loads(line) for line in _lines(capsys.readouterr().err))
    assert library["event"] == "GET /metrics 200"
    assert library["level"] == "info"
    assert library["logger_name"] == "aiohttp.access"
    assert set(ours) <= set(library) | {"key"}  # the same keys: event, level, timestamp, ...
    assert {"event", "level", "timestamp", "logger_name"} <= set(library)


def test_a_stdlib_exception_is_inside_the_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure("info", "json")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("asyncio").exception("Task exception was never retrieved")
    (line,) = _lines(capsys.readouterr().err)  # the traceback is not on lines of its own
    record = json.loads(line)
    assert record["level"] == "error"
    assert "RuntimeError: boom" in record["exception"]


def test_a_stdlib_record_is_key_value_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure("debug", "console")
    logging.getLogger("kubernetes_asyncio.client").debug("watch %s", "nodes", extra={"rv": "7"})
    (line,) = _lines(capsys.readouterr().err)
    assert "watch nodes" in line
    assert "[kubernetes_asyncio.client]" in line
    assert "rv=7" in line
    assert not line.startswith("{")


def test_the_level_filters_stdlib_records(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure("warning", "json")
    logging.getLogger("aiohttp").info("hidden")
    logging.getLogger("aiohttp").warning("shown")
    assert [json.loads(line)["event"] for line in _lines(capsys.readouterr().err)] == ["shown"]


def test_configuring_again_replaces_the_handler() -> None:
    log.configure("info", "json")
    log.configure("info", "console")
    ours = [h for h in logging.getLogger().handlers if isinstance(h, log._StdlibHandler)]
    assert len(ours) == 1


def test_a_python_warning_is_a_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure("info", "json")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("old API", DeprecationWarning, stacklevel=1)
    (line,) = _lines(capsys.readouterr().err)
    record = json.loads(line)
    assert record["logger_name"] == "py.warnings"
    assert "DeprecationWarning: old API" in record["event"]
