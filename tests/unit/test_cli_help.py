"""Every `gpuop` option has help text that shows its default, and `--log-level` is
checked: a bad level is one error line and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gpuop.cli import build_parser
from gpuop.cli_errors import HelpFormatter


def _parsers(
    parser: argparse.ArgumentParser, path: str = "gpuop"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def _arguments() -> Iterator[tuple[str, argparse.Action]]:
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            yield f"{path} {'/'.join(action.option_strings) or action.dest}", action


def test_every_argument_has_help() -> None:
    missing = [name for name, action in _arguments() if not (action.help or "").strip()]
    assert not missing, f"arguments without help: {missing}"


def test_every_option_shows_its_default() -> None:
    formatter = HelpFormatter("gpuop")
    hidden = [
        name
        for name, action in _arguments()
        if action.option_strings
        and "default" not in (formatter._get_help_string(action) or "").lower()
    ]
    assert not hidden, f"options whose help shows no default: {hidden}"


def test_every_sub_command_parser_uses_the_formatter() -> None:
    for path, parser in _parsers(build_parser()):
        assert parser.formatter_class is HelpFormatter, path


def test_help_renders_defaults() -> None:
    text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()  # type: ignore[union-attr]
    assert "(default: 8)" in " ".join(text.split())  # --workers
    assert "(default: off)" in text  # a flag


@pytest.mark.parametrize(
    ("level", "parsed"),
    [
        ("debug", "debug"),
        ("info", "info"),
        ("warning", "warning"),
        ("error", "error"),
        ("INFO", "info"),
        ("warn", "warning"),
    ],
)
def test_log_level_accepts_the_levels(level: str, parsed: str) -> None:
    args = build_parser().parse_args(["--log-level", level, "version"])
    assert args.log_level == parsed


def test_a_bad_log_level_is_one_line_and_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuop", "--log-level", "loud", "version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpuop: error: argument --log-level: invalid choice: 'loud'")
    assert "Traceback" not in result.stderr
