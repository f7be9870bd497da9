"""``gpuop node-agent`` argument parsing and the validate entry point."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
from pathlib import Path

import pytest

from gpuop.nodeagent import cli, commands, toolkit


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuop")
    cli.add_subcommands(p.add_subparsers(dest="command", required=True))
    return p


def test_validate_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    monkeypatch.delenv("DRIVER_ROOT", raising=False)
    args = parser().parse_args(["node-agent", "validate"])
    assert args.func.__name__ == "run_validate"
    assert args.node_name == "gpu-node-7"
    assert args.checks == ["driver", "toolkit", "cuda", "plugin"]
    assert args.validations_dir == Path("/run/nvidia/validations")
    assert args.driver_root == Path("/run/nvidia/driver")
    assert args.host_root == Path("/host")
    assert not args.wait


def test_checks_run_in_dependency_order() -> None:
    args = parser().parse_args(["node-agent", "validate", "--checks", "plugin, driver"])
    assert args.checks == ["driver", "plugin"]


def test_unknown_check_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["node-agent", "validate", "--checks", "driver,gpu"])
    assert "unknown check(s) gpu" in capsys.readouterr().err


def test_export_args() -> None:
    args = parser().parse_args(
        ["node-agent", "export", "--port", "9400", "--node-name", "n", "--no-xid-events"]
    )
    assert args.func.__name__ == "run_export"
    assert (args.port, args.node_name, args.xid_events) == (9400, "n", False)


def test_export_reports_health_by_default_and_health_runs_alone() -> None:
    args = parser().parse_args(["node-agent", "export", "--node-name", "n"])
    assert (args.health, args.health_interval) == (True, 10.0)
    args = parser().parse_args(["node-agent", "export", "--no-health"])
    assert args.health is False
    args = parser().parse_args(
        ["node-agent", "health", "--node-name", "n", "--health-interval", "2"]
    )
    assert args.func.__name__ == "run_health"
    assert (args.node_name, args.health_interval) == ("n", 2.0)


def _toolkit_host(root: Path) -> None:
    binary = root / "usr/bin/nvidia-container-runtime"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    config = root / "etc/nvidia-container-runtime/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("")


def _validate_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    return parser().parse_args(
        [
            "node-agent",
            "validate",
            "--checks",
            "toolkit",
            "--host-root",
            str(tmp_path / "host"),
            "--validations-dir",
            str(tmp_path / "validations"),
            *extra,
        ]
    )


async def test_validate_once_exit_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No nvidia-smi to run here (even on a machine with one): the file checks run.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(toolkit, "INJECTED_DIRS", ())
    assert await commands.validate_main(_validate_args(tmp_path)) == 1
    assert not (tmp_path / "validations/toolkit-ready").exists()
    _toolkit_host(tmp_path / "host")
    assert await commands.validate_main(_validate_args(tmp_path)) == 0
    # upstream's file is empty; ours says which check passed
    assert (tmp_path / "validations/toolkit-ready").read_text() == "TOOLKIT_CHECK=files\n"


async def test_validate_needs_a_node_name_for_cluster_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    args = _validate_args(tmp_path, "--checks", "cuda")
    assert await commands.validate_main(args) == 2


async def test_validate_wait_stops_on_sigterm_and_removes_files(tmp_path: Path) -> None:
    _toolkit_host(tmp_path / "host")
    task = asyncio.create_task(commands.validate_main(_validate_args(tmp_path, "--wait")))
    ready = tmp_path / "validations/toolkit-ready"
    async with asyncio.timeout(3):
        for _ in itertools.count():
            if ready.exists():
                break
            await asyncio.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(task, 3) == 0
    assert not ready.exists()


def test_the_operator_parser_leaves_the_node_agent_commands_unimported() -> None:
    """``gpuop run`` builds the parser that lists these subcommands; the commands (NVML,
    the exporter, the checks: about 4 MiB resident) load only when one runs."""
    import subprocess
    import sys

    code = (
        "import sys; from gpuop.cli import build_parser; build_parser(); "
        "print(sorted(m for m in sys.modules if m in "
        "('gpuop.nodeagent.commands', 'gpuop.nodeagent.exporter', 'pynvml')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
