"""The ``gpuop`` command line: one entry point, one sub-command per job."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuop import __version__
from gpuop._local import local_cluster, require_local_cluster
from gpuop.cli_errors import EXPECTED, Parser, report
from gpuop.log import LEVELS
from gpuop.operator.controller import DEFAULT_NAMESPACE, DEFAULT_OPERATOR_IMAGE
from statemachine.preflight import Mode

if TYPE_CHECKING:
    from gpuop.devcluster import LocalCluster

Handler = Callable[[argparse.Namespace], int]

DIR_HELP = (
    "local cluster state directory (default: $GPUOP_CLUSTER_DIR, else ~/.local/state/gpuop/cluster)"
)


def _cluster(args: argparse.Namespace) -> LocalCluster:
    return local_cluster(Path(args.dir) if args.dir else None)


def _workloads(args: argparse.Namespace) -> dict[str, str]:
    """``--workload`` values as node name to workload (checked against the fleet)."""
    from gpuop.devcluster import workload_labels

    return workload_labels(args.workload, args.gpu_nodes)


def _cmd_cluster_up(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    workloads = _workloads(args)
    info = cluster.up(
        nodes=args.nodes,
        gpu_nodes=args.gpu_nodes,
        apiserver_port=args.port,
        dra=args.dra,
        workloads=workloads,
        node_images=args.node_images,
    )
    print(f"cluster up: {info.server} ({args.nodes} nodes, {args.gpu_nodes} with GPUs)")
    for node, workload in sorted(workloads.items()):
        print(f"  {node}: {workload}")
    print(f"kubeconfig: {info.kubeconfig}")
    print(f"  export KUBECONFIG={info.kubeconfig}")
    print("  kubectl get nodes")
    print(f"stop it with: gpuop cluster down --dir {cluster.directory}")
    return 0


def _cmd_cluster_down(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    stopped = cluster.down()
    print(f"cluster down: stopped {', '.join(stopped) if stopped else 'nothing (none running)'}")
    return 0


def _cmd_cluster_status(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    info = cluster.info()
    if info is None:
        print(f"no cluster in {cluster.directory}")
        return 1
    running = set(cluster.running())
    print(f"cluster in {cluster.directory}: {info.server}")
    print(f"kubeconfig: {info.kubeconfig}")
    names = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
    names += [n for n in cluster.recorded() if n == "node-images"]  # when started with it
    for name in names:
        print(f"  {name:<24} {'running' if name in running else 'STOPPED'}")
    return 0 if all(name in running for name in names) else 1


def _cmd_cluster_gpu_health(args: argparse.Namespace) -> int:
    import asyncio

    from gpuop.devcluster._health import mark_gpu_health_with_kubeconfig, verdict_for

    cluster = _cluster(args)
    if cluster.info() is None:
        print(f"no cluster in {cluster.directory}", file=sys.stderr)
        return 1
    verdict = verdict_for(args.status, args.reason, args.message)
    cond = asyncio.run(mark_gpu_health_with_kubeconfig(cluster.kubeconfig, args.node, verdict))
    print(f"{args.node}: GPUHealthy={cond['status']} reason={cond['reason']}: {cond['message']}")
    return 0


def _cmd_cluster_build(args: argparse.Namespace) -> int:
    require_local_cluster()
    from gpuop.devcluster import cache_dir, ensure_binaries
    from gpuop.devcluster._build import ensure_helm, ensure_prometheus, ensure_promtool

    paths = ensure_binaries()
    built = list(paths.all())
    if args.helm:
        built.append(ensure_helm())  # the chart tests run it
    if args.promtool:
        built.append(ensure_promtool())  # the alert rule tests run it
        built.append(ensure_prometheus())  # and the alert integration test this
    if args.registry:
        from gpuop.devcluster._build_registry import ensure_registry

        built.append(ensure_registry())  # the upgrade pre-flight tests run it
    print(f"cache: {cache_dir()}")
    for path in built:
        print(f"  {path}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import asyncio

    from gpuop.operator.app import run_operator
    from gpuop.operator.controller import OperatorConfig

    kubeconfig = Path(args.kubeconfig) if args.kubeconfig else None
    local = args.local or (
        kubeconfig is None
        and "KUBERNETES_SERVICE_HOST" not in os.environ
        and not os.environ.get("KUBECONFIG")
    )
    install = args.install
    host = "0.0.0.0"  # a pod serves on its own IP
    if local:
        cluster = _cluster(args)
        if not cluster.running():
            cluster.up(
                nodes=args.nodes,
                gpu_nodes=args.gpu_nodes,
                workloads=_workloads(args),
                node_images=args.node_images,
            )
        kubeconfig = cluster.kubeconfig
        install = True
        host = "127.0.0.1"
        print(f"local cluster: export KUBECONFIG={kubeconfig}", file=sys.stderr)
    config = OperatorConfig(
        namespace=args.namespace,
        operator_image=args.operator_image,
        operator_image_pull_policy=args.operator_image_pull_policy or None,
        operator_image_pull_secrets=tuple(
            s for s in args.operator_image_pull_secrets.split(",") if s.strip()
        ),
        workers=args.workers,
        metrics_host=host,
        metrics_port=args.metrics_port,
        probe_port=args.probe_port,
        leader_elect=args.leader_elect,
        node_stuck_seconds=args.node_stuck_seconds,
        upgrade_preflight=Mode(args.upgrade_preflight),
    )
    return asyncio.run(
        run_operator(config, kubeconfig, install=install, status_line=sys.stderr.isatty())
    )


def _cmd_crd(args: argparse.Namespace) -> int:
    from crd import render_crd_yaml, render_gc_crd_yaml, render_nvd_crd_yaml

    renders = {"nvidiadrivers": render_nvd_crd_yaml, "gpuclusters": render_gc_crd_yaml}
    sys.stdout.write(renders.get(args.which, render_crd_yaml)())
    return 0


def _cmd_crds(args: argparse.Namespace) -> int:
    """Apply (and wait until served) or delete our CRDs in a cluster: the chart's
    `operator.upgradeCRD` and `operator.cleanupCRD` hooks run this, since Helm installs
    `crds/` once and never upgrades or deletes it."""
    import asyncio

    from gpuop.kube.client import api_client
    from gpuop.kube.kinds import KINDS
    from gpuop.kube.rest import Rest
    from gpuop.operator.install import delete_crds, install_crd

    kubeconfig = Path(args.kubeconfig) if args.kubeconfig else None

    async def run() -> None:
        async with api_client(kubeconfig, user_agent="gpuop-crds") as api:
            rest = Rest(api, KINDS)
            if args.action == "apply":
                print(f"CRDs applied: {', '.join(await install_crd(rest))}")
            else:
                deleted = await delete_crds(rest)
                print(f"CRDs deleted: {', '.join(deleted) or 'none were there'}")

    asyncio.run(run())
    return 0


def _cmd_diagrams(args: argparse.Namespace) -> int:
    from statemachine.diagram import diagrams_markdown

    sys.stdout.write(diagrams_markdown())
    return 0


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"gpuop {__version__}")
    return 0


def _parse_workload(text: str) -> tuple[str, str]:
    from gpuop.devcluster import parse_workload

    try:
        return parse_workload(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--workload ")) from err


def _workload_option(parser: argparse.ArgumentParser, lead: str = "") -> None:
    parser.add_argument(
        "--workload",
        action="append",
        default=[],
        type=_parse_workload,
        metavar="NODE=WORKLOAD",
        help=f"{lead}label GPU node NODE nvidia.com/gpu.workload.config=WORKLOAD"
        " (container, vm-passthrough or vm-vgpu; repeatable), e.g."
        " --workload gpu-node-0001=vm-passthrough: a VM host once the policy enables"
        " sandboxWorkloads",
    )


def _node_images_option(parser: argparse.ArgumentParser, lead: str = "") -> None:
    parser.add_argument(
        "--no-node-images",
        dest="node_images",
        action="store_false",
        help=f"{lead}do not run the node-image simulator (driver manager and status files)",
    )


def _log_level(text: str) -> str:
    """`--log-level` in any case; `warn` is `warning` (argparse then checks the choices)."""
    level = text.strip().lower()
    return "warning" if level == "warn" else level


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gpuop", description=__doc__)
    parser.add_argument(
        "--log-level",
        default="info",
        type=_log_level,
        choices=LEVELS,
        help="least severe level logged: debug (which also prints an error's traceback),"
        " info, warning or error",
    )
    parser.add_argument(
        "--log-format",
        default="auto",
        choices=["auto", "json", "console"],
        help="json: one object per line; console: key=value; auto: json inside a pod or"
        " when stderr is not a terminal, else console",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=_cmd_version)
    run = sub.add_parser(
        "run",
        help="run the operator (against the local simulated cluster unless a kubeconfig, "
        "$KUBECONFIG or in-cluster credentials are given)",
    )
    run.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig of the target cluster (default: $KUBECONFIG, else in-cluster"
        " credentials, else the local simulated cluster)",
    )
    run.add_argument(
        "--local", action="store_true", help="use (and start if needed) the local cluster"
    )
    run.add_argument("--dir", default=None, help=DIR_HELP)
    run.add_argument(
        "--nodes", type=int, default=20, help="local cluster, when it is started: nodes in all"
    )
    run.add_argument(
        "--gpu-nodes",
        type=int,
        default=12,
        help="local cluster, when it is started: how many have GPUs",
    )
    _workload_option(run, "local cluster, when it is started: ")
    _node_images_option(run, "local cluster, when it is started: ")
    run.add_argument(
        "--install",
        action="store_true",
        help="install the CRD, namespace and sample ClusterPolicy first (always when local)",
    )
    run.add_argument(
        "--namespace",
        default=os.environ.get("OPERATOR_NAMESPACE", DEFAULT_NAMESPACE),
        help="namespace of the operands (default: $OPERATOR_NAMESPACE, else gpu-operator)",
    )
    run.add_argument(
        "--operator-image",
        default=os.environ.get("GPUOP_OPERATOR_IMAGE", DEFAULT_OPERATOR_IMAGE),
        help="image of this operator, also run as the validator on each node"
        f" (default: $GPUOP_OPERATOR_IMAGE, else {DEFAULT_OPERATOR_IMAGE})",
    )
    run.add_argument(
        "--operator-image-pull-policy",
        default=os.environ.get("GPUOP_OPERATOR_IMAGE_PULL_POLICY", ""),
        help="pull policy of the operator image on nodes (default:"
        " $GPUOP_OPERATOR_IMAGE_PULL_POLICY, else each section's)",
    )
    run.add_argument(
        "--operator-image-pull-secrets",
        default=os.environ.get("GPUOP_OPERATOR_IMAGE_PULL_SECRETS", ""),
        help="comma-separated Secrets (operator namespace) that pull the operator image on"
        " nodes (default: $GPUOP_OPERATOR_IMAGE_PULL_SECRETS, else none)",
    )
    run.add_argument("--workers", type=int, default=8, help="parallel reconcile workers")
    run.add_argument(
        "--node-stuck-seconds",
        type=float,
        default=600.0,
        help="name a GPU node as stuck once it has waited this long for an operand pod",
    )
    run.add_argument(
        "--upgrade-preflight",
        choices=[m.value for m in Mode],
        default=os.environ.get("GPUOP_UPGRADE_PREFLIGHT", "off"),
        help="before a driver upgrade wave, ask the registry for the pool's images: hold"
        " the pool when one is missing or the registry is unreachable (hold), only when one"
        " is missing (proceed), or ask nothing (off; default: $GPUOP_UPGRADE_PREFLIGHT, else"
        " off; the chart sets hold)",
    )
    run.add_argument(
        "--leader-elect",
        action="store_true",
        help="hold a Lease before acting (needed with more than one replica)",
    )
    run.add_argument(
        "--metrics-port", type=int, default=8080, help="port of /metrics (gpu_operator_*)"
    )
    run.add_argument("--probe-port", type=int, default=8081, help="port of /healthz and /readyz")
    run.set_defaults(func=_cmd_run)

    crd_cmd = sub.add_parser("crd", help="print a CRD generated from the models")
    crd_cmd.add_argument(
        "which",
        nargs="?",
        default="clusterpolicies",
        choices=["clusterpolicies", "nvidiadrivers", "gpuclusters"],
        help="which CRD (default: clusterpolicies)",
    )
    crd_cmd.set_defaults(func=_cmd_crd)

    crds = sub.add_parser(
        "crds", help="apply or delete the CRDs in a cluster (the chart's upgrade hooks)"
    )
    crds.add_argument(
        "action",
        choices=["apply", "delete"],
        help="apply: create or update the CRDs and wait until they are served;"
        " delete: delete them, and with them every ClusterPolicy, NVIDIADriver and GPUCluster",
    )
    crds.add_argument(
        "--kubeconfig", default=None, help="kubeconfig (default: $KUBECONFIG, else in-cluster)"
    )
    crds.set_defaults(func=_cmd_crds)

    cluster = sub.add_parser("cluster", help="a local control plane with simulated GPU nodes")
    csub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    up = csub.add_parser("up", help="build (once) and start the control plane and nodes")
    up.add_argument("--nodes", type=int, default=3, help="simulated nodes in all")
    up.add_argument("--gpu-nodes", type=int, default=2, help="how many have GPUs")
    up.add_argument("--port", type=int, default=None, help="API server port (default: a free one)")
    up.add_argument("--dir", default=None, help=DIR_HELP)
    up.add_argument(
        "--no-dra",
        dest="dra",
        action="store_false",
        help="do not publish the simulated GPUs as DRA devices (ResourceSlices of gpu.nvidia.com)",
    )
    _workload_option(up)
    _node_images_option(up)
    up.set_defaults(func=_cmd_cluster_up)
    down = csub.add_parser("down", help="stop the processes it started and remove its directory")
    down.add_argument("--dir", default=None, help=DIR_HELP)
    down.set_defaults(func=_cmd_cluster_down)
    status = csub.add_parser("status", help="show whether each process runs")
    status.add_argument("--dir", default=None, help=DIR_HELP)
    status.set_defaults(func=_cmd_cluster_status)
    health = csub.add_parser(
        "gpu-health",
        help="set a simulated node's GPUHealthy condition, as its node agent would",
    )
    health.add_argument("node", help="node name, e.g. gpu-node-0001")
    state = health.add_mutually_exclusive_group()
    state.add_argument(
        "--unhealthy",
        dest="status",
        action="store_const",
        const="False",
        default="False",
        help="GPUHealthy=False (the default)",
    )
    state.add_argument(
        "--healthy", dest="status", action="store_const", const="True", help="GPUHealthy=True"
    )
    state.add_argument(
        "--unknown",
        dest="status",
        action="store_const",
        const="Unknown",
        help="GPUHealthy=Unknown (as without NVML)",
    )
    health.add_argument(
        "--reason",
        default=None,
        help="condition reason (default: XidCritical when unhealthy, GpusHealthy when"
        " healthy, NvmlUnavailable when unknown)",
    )
    health.add_argument(
        "--message",
        default=None,
        help="condition message (default: an XID 79 on GPU 0 when unhealthy)",
    )
    health.add_argument("--dir", default=None, help=DIR_HELP)
    health.set_defaults(func=_cmd_cluster_gpu_health)
    build = csub.add_parser("build", help="only build the binaries into the cache")
    build.add_argument(
        "--no-helm",
        dest="helm",
        action="store_false",
        help="skip Helm (built by default: the chart tests need it)",
    )
    build.add_argument(
        "--no-promtool",
        dest="promtool",
        action="store_false",
        help="skip promtool and the Prometheus server (built by default: the alert rule "
        "tests need them)",
    )
    build.add_argument(
        "--no-registry",
        dest="registry",
        action="store_false",
        help="skip the OCI registry (built by default: the upgrade pre-flight tests need it)",
    )
    build.set_defaults(func=_cmd_cluster_build)

    from gpuop.upgrades_cli import add_subcommands as add_upgrade

    add_upgrade(sub)
    from gpuop.admin_cli import add_subcommands as add_admin

    add_admin(sub)
    from gpuop.admin_cli.plan import add_subcommand as add_plan

    add_plan(sub)
    diagrams = sub.add_parser(
        "diagrams", help="print the state machines as Mermaid (docs/state-machines.md)"
    )
    diagrams.set_defaults(func=_cmd_diagrams)

    from gpuop.nodeagent.cli import add_subcommands as add_node_agent

    add_node_agent(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from gpuop import log

    parser = build_parser()
    args = parser.parse_args(argv)
    log.configure(args.log_level, args.log_format)
    func: Handler = args.func
    try:
        return func(args)
    except EXPECTED as err:
        if args.log_level == "debug":
            traceback.print_exc()
        return report(err)
    except KeyboardInterrupt:
        print("gpuop: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
