"""How the command line reports an error it expects: one `gpuop: error: ...` line, exit 2.

Expected errors are those a user's input or environment causes (a bad flag or value, no
kubeconfig, an API server that is down or refuses): they get one line naming the
problem, never a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

import aiohttp
import yaml
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from gpuop._local import LocalClusterMissing, cluster_errors

EXIT_ERROR = 2

#: The local cluster's errors, where this install has it (the operator image has not).
CLUSTER_ERRORS = cluster_errors()

EXPECTED: tuple[type[BaseException], ...] = (
    *CLUSTER_ERRORS,
    LocalClusterMissing,
    ValueError,  # bad input: PlanError, KubeconfigError, model and budget checks
    OSError,  # files, ports, connections (aiohttp's connection errors are OSErrors too)
    aiohttp.ClientError,
    ConfigException,
    ApiException,
    yaml.YAMLError,
)


def describe(err: BaseException) -> str:
    """The error as one line: an API refusal by its status and the server's message."""
    if isinstance(err, ApiException):
        text = f"the API server answered {err.status} {err.reason or ''}".rstrip()
        message = _status_message(err.body)
        if message:
            text += f": {message}"
    elif isinstance(err, yaml.MarkedYAMLError) and err.problem:
        text = f"invalid YAML: {err.problem}"
    else:
        text = str(err) or type(err).__name__
    return " ".join(text.split())


def _status_message(body: object) -> str:
    """`message` of a Kubernetes `Status` body, if the body is one."""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if not isinstance(body, str):
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return body
    return str(status.get("message") or "") if isinstance(status, dict) else ""


def report(err: BaseException) -> int:
    """Print `err` as the one error line; returns the exit status."""
    # A progress line on a terminal may be unfinished: start the error on a line of its own.
    lead = "\n" if isinstance(err, CLUSTER_ERRORS) and sys.stderr.isatty() else ""
    print(f"{lead}gpuop: error: {describe(err)}", file=sys.stderr)
    return EXIT_ERROR


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already names it.

    A flag (no value) is ``off`` unless given; a value option shows its default value,
    ``none`` when there is none.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or "default" in text
            or action.default is argparse.SUPPRESS
            or isinstance(action, argparse._HelpAction | argparse._VersionAction)
        ):
            return text
        if action.nargs == 0:  # store_true/false/const: the flag is not given by default
            shown = "off"
        elif action.default is None or action.default in ("", []):
            shown = "none"
        elif isinstance(action.default, list | tuple):
            shown = ",".join(str(v) for v in action.default)
        else:
            shown = str(action.default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """argparse with usage errors as one line (argparse prints the usage first), and
    every option's default in its help (`HelpFormatter`); sub-parsers are Parsers too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"gpuop: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_ERROR)
