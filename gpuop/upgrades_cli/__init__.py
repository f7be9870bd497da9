"""`gpuop upgrade ...`: read-only views of driver upgrades for administrators."""

from __future__ import annotations

import argparse
import os
from typing import Any

from gpuop.operator.controller import DEFAULT_NAMESPACE


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig (default: as kubectl: $KUBECONFIG, else in-cluster, else the"
        " local cluster's)",
    )
    parser.add_argument(
        "--dir",
        default=None,
        help="local cluster directory, read when no other kubeconfig is found (default:"
        " $GPUOP_CLUSTER_DIR, else ~/.local/state/gpuop/cluster)",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        default=os.environ.get("OPERATOR_NAMESPACE", DEFAULT_NAMESPACE),
        help="namespace of the operands (default: $OPERATOR_NAMESPACE, else gpu-operator)",
    )


def add_subcommands(sub: Any) -> None:
    from gpuop.upgrades_cli._commands import cmd_plan, cmd_status

    upgrade = sub.add_parser("upgrade", help="driver upgrades: status and plans (read only)")
    usub = upgrade.add_subparsers(dest="upgrade_command", required=True, metavar="ACTION")
    status = usub.add_parser(
        "status", help="per GPU node its upgrade state; exit code 1 when a node failed"
    )
    _common(status)
    status.add_argument("--watch", "-w", action="store_true", help="redraw as it changes")
    status.add_argument(
        "-o",
        "--output",
        default="text",
        choices=["text", "wide", "json"],
        help="text: a table; wide: also what each node waits for; json: the whole report",
    )
    status.set_defaults(func=cmd_status)
    plan = usub.add_parser(
        "plan", help="the waves, blockers and duration of a rollout, without writing anything"
    )
    _common(plan)
    plan.add_argument(
        "--set",
        action="append",
        metavar="PATH=VALUE",
        help="a proposed policy change under spec, e.g. driver.version=580.95.05",
    )
    plan.add_argument(
        "-o",
        "--output",
        default="text",
        choices=["text", "json"],
        help="text: waves, blockers and duration; json: the whole plan",
    )
    plan.set_defaults(func=cmd_plan)
