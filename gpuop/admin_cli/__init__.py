"""`gpuop validate` (offline checks of files), `gpuop support-bundle` (one archive of
what a bug report needs) and `gpuop doctor` (known problems, with their fixes): commands
for administrators, outside the operator."""

from __future__ import annotations

import argparse
import os
from typing import Any

from gpuop.operator.controller import DEFAULT_NAMESPACE


def _parse_since(text: str) -> float:
    from gpuop.admin_cli.bundle import parse_duration

    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_subcommands(sub: Any) -> None:
    from gpuop.admin_cli.bundle import cmd_support_bundle
    from gpuop.admin_cli.validate import cmd_validate

    validate = sub.add_parser(
        "validate",
        help="check ClusterPolicy, NVIDIADriver, GPUCluster or chart values files offline;"
        " exit code 1 on a problem",
    )
    validate.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="YAML files, several documents each; - reads standard input",
    )
    validate.add_argument(
        "--chart",
        default=None,
        help="chart that renders values files (default: deploy/helm/gpu-operator of this"
        " source tree)",
    )
    validate.add_argument(
        "--no-warnings",
        dest="warnings",
        action="store_false",
        help="leave out fields the operator accepts but does not act on",
    )
    validate.set_defaults(func=cmd_validate)

    bundle = sub.add_parser(
        "support-bundle",
        help="collect policies, operand objects, nodes, Events and logs into one archive",
    )
    bundle.add_argument(
        "-o",
        "--output",
        default=None,
        help="archive to write (default: gpuop-support-<UTC time>.tar.gz here)",
    )
    bundle.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig (default: as kubectl: $KUBECONFIG, else in-cluster, else the"
        " local cluster's)",
    )
    bundle.add_argument(
        "--dir",
        default=None,
        help="local cluster directory, read when no other kubeconfig is found (default:"
        " $GPUOP_CLUSTER_DIR, else ~/.local/state/gpuop/cluster)",
    )
    bundle.add_argument(
        "-n",
        "--namespace",
        default=os.environ.get("OPERATOR_NAMESPACE", DEFAULT_NAMESPACE),
        help="namespace of the operator and operands (default: $OPERATOR_NAMESPACE, else"
        " gpu-operator)",
    )
    bundle.add_argument(
        "--since",
        type=_parse_since,
        default="1h",
        metavar="DURATION",
        help="logs of this recent past, e.g. 30m, 2h, 1h30m, 90s",
    )
    bundle.set_defaults(func=cmd_support_bundle)
    _add_doctor(sub)


def _add_doctor(sub: Any) -> None:
    from gpuop.admin_cli.doctor import cmd_doctor

    doctor = sub.add_parser(
        "doctor",
        help="known problems of the cluster (or of a support bundle), one line each with"
        " cause, objects and fix; exit code 1 when there is one",
    )
    doctor.add_argument(
        "--bundle",
        default=None,
        metavar="PATH",
        help="read a support bundle (the archive, or the directory it was unpacked into)"
        " instead of the cluster; only a bundle of a real cluster has the nodes' logs",
    )
    doctor.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig (default: as kubectl: $KUBECONFIG, else in-cluster, else the"
        " local cluster's)",
    )
    doctor.add_argument(
        "--dir",
        default=None,
        help="local cluster directory, read when no other kubeconfig is found (default:"
        " $GPUOP_CLUSTER_DIR, else ~/.local/state/gpuop/cluster)",
    )
    doctor.add_argument(
        "-n",
        "--namespace",
        default=os.environ.get("OPERATOR_NAMESPACE", DEFAULT_NAMESPACE),
        help="namespace of the operator and operands (default: $OPERATOR_NAMESPACE, else"
        " gpu-operator)",
    )
    doctor.add_argument(
        "--since",
        type=_parse_since,
        default="1h",
        metavar="DURATION",
        help="logs of this recent past, e.g. 30m, 2h, 1h30m, 90s",
    )
    doctor.set_defaults(func=cmd_doctor)
