"""`gpuop plan -f policy.yaml`: what applying a ClusterPolicy would roll, per operand and
node, read from the live cluster and written nowhere.

Both the live policy and the proposed one are rendered with the same context (the
cluster's GPU nodes, its site ConfigMaps, which monitoring APIs it serves) by the
operator's own render; :mod:`statemachine.change_plan` compares them and the driver's
waves come from :func:`statemachine.fleet_plan.plan_upgrade` under the proposed
upgradePolicy, as the upgrade machine would take them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from components import RenderContext
from components.context import node_facts
from components.driver_config import referenced_config_maps
from components.kinds import PROMETHEUS_RULE, SERVICE_MONITOR
from components.labels import any_mig_capable, is_gpu_node
from components.registry import desired_objects
from crd import ClusterPolicySpec, parse_policy
from gpuop.admin_cli.validate import SOURCE_CHART, Doc, _is_values, _render
from gpuop.kube.client import api_client
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller import DEFAULT_NAMESPACE
from gpuop.upgrades_cli._commands import kubeconfig_for
from gpuop.upgrades_cli._render import plan_json
from gpuop.upgrades_cli._snapshot import Objects, PlanError, list_objects, snapshot
from statemachine.change_plan import (
    DRIVER_COMPONENT,
    ChangePlan,
    driver_changed,
    driver_digest,
    plan_change,
)
from statemachine.fleet_plan import plan_upgrade
from statemachine.fleet_report import selector_matches
from statemachine.rollout_gate import GatePolicy

CONFIG_MAP = by_kind("v1", "ConfigMap")
VALIDATOR_DS = "nvidia-operator-validator"
DEFAULT_OPERATOR_IMAGE = "gpuop:plan"
"""Only when no operand of ours runs yet: both renders use the same image either way."""


def read_policy(path: str, chart: Path = SOURCE_CHART) -> dict[str, Any]:
    """The one ClusterPolicy in ``path`` (``-``: standard input), or the one the chart
    renders from ``path`` when it holds chart values; PlanError otherwise."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        docs = [d for d in yaml.safe_load_all(text) if d]
    except OSError as err:
        raise PlanError(f"{path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise PlanError(f"{path}: not YAML ({getattr(err, 'problem', None) or err})") from None
    if len(docs) == 1 and _is_values(docs[0]):
        rendered, refused = _render(Doc(path, dict(docs[0])), chart)
        if refused:
            raise PlanError(str(refused[0]))
        docs = [d.obj for d in rendered]
    policies = [d for d in docs if isinstance(d, dict) and d.get("kind") == "ClusterPolicy"]
    if len(policies) != 1:
        raise PlanError(f"{path}: expected one ClusterPolicy, found {len(policies)}")
    raw = policies[0]
    model, problems = parse_policy(raw)
    if model is None or problems:
        raise PlanError(
            f"{path}: invalid ClusterPolicy: "
            + "; ".join(f"{p.path}: {p.message}" for p in problems)
        )
    return raw


async def _context(
    rest: Rest, objects: Objects, specs: list[ClusterPolicySpec], ns: str
) -> RenderContext:
    gpu = sorted(
        (n for n in objects.nodes if is_gpu_node(n["metadata"].get("labels") or {})),
        key=lambda n: str(n["metadata"]["name"]),
    )
    names = sorted({name for spec in specs for name in referenced_config_maps(spec)})
    keys: dict[str, tuple[str, ...]] = {}
    for name in names:
        cm = await rest.get(CONFIG_MAP, name, ns)
        if cm is not None:
            keys[name] = tuple(sorted(cm.get("data") or {}))
    image = DEFAULT_OPERATOR_IMAGE
    for ds in objects.daemonsets:
        if ds["metadata"]["name"] == VALIDATOR_DS:
            image = str(ds["spec"]["template"]["spec"]["containers"][0]["image"])
    return RenderContext(
        namespace=ns,
        operator_image=image,
        mig_capable=any_mig_capable(n["metadata"].get("labels") or {} for n in gpu),
        service_monitor_crd=await _served(rest, SERVICE_MONITOR),
        prometheus_rule_crd=await _served(rest, PROMETHEUS_RULE),
        gpu_nodes=tuple(node_facts(n) for n in gpu),
        config_map_keys=keys,
    )


async def _served(rest: Rest, kind: Any) -> bool:
    return bool(await rest.api_resource_exists(kind.api_version, kind.plural))


async def compute(rest: Rest, path: str, ns: str, chart: Path = SOURCE_CHART) -> ChangePlan:
    """The plan for the policy in ``path`` (or chart values) over the cluster ``rest``
    reads."""
    proposed = read_policy(path, chart)
    objects = await list_objects(rest, ns)
    live = snapshot(objects, ns)  # raises PlanError without a ClusterPolicy
    current = sorted(
        objects.policies,
        key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
    )[0]
    # The proposal takes the live policy's place: its identity, the file's spec.
    merged = {**current, "spec": proposed.get("spec") or {}}
    new = snapshot(dataclasses.replace(objects, policies=[merged]), ns)
    ctx = await _context(rest, objects, [live.spec, new.spec], ns)
    before = desired_objects(live.spec, ctx)
    after = desired_objects(new.spec, ctx)
    driver_plan = None
    if new.spec.driver.upgrade_policy.auto_upgrade and driver_changed(before, after):
        pools = [o for o in after.get(DRIVER_COMPONENT, ()) if o["kind"] == "DaemonSet"]

        def digest_for(labels: Any) -> str:
            for ds in pools:
                selector = ds["spec"]["template"]["spec"].get("nodeSelector") or {}
                if selector_matches({"matchLabels": selector}, labels):
                    return driver_digest(ds)
            return ""

        facts = [
            dataclasses.replace(f, target="proposed", template_digest=digest_for(f.labels))
            for f in new.nodes
        ]
        canary = new.spec.driver.upgrade_policy.canary
        gate = GatePolicy(
            canary_nodes=canary.nodes if canary else 0,
            soak_seconds=canary.soak_seconds if canary else 0,
        )
        driver_plan = plan_upgrade(
            facts,
            new.policy,
            gate,
            new.rules,
            new.pdbs,
            namespace=ns,
            target="proposed",
            template_digest="",
            proposed=False,
        )
    return plan_change(
        before,
        after,
        objects.nodes,
        objects.pods,
        max_unavailable=new.spec.daemonsets.rolling_update.max_unavailable,
        driver_plan=driver_plan,
        namespace=ns,
    )


def plan_dict(plan: ChangePlan) -> dict[str, Any]:
    return {
        "operands": [
            {
                "component": o.component,
                "daemonset": o.daemonset,
                "action": o.action,
                "nodes": list(o.nodes),
                "restartOnly": list(o.restart_only),
                "reinstall": list(o.reinstall),
                "gpuPods": {n: list(p) for n, p in o.gpu_pods.items()},
                "containerRuntimeRestart": o.runtime_restart,
                "steps": o.steps,
            }
            for o in plan.operands
        ],
        "objects": list(plan.objects),
        "maxUnavailable": plan.max_unavailable,
        "driver": plan_json(plan.driver) if plan.driver is not None else None,
    }


def render_text(plan: ChangePlan) -> str:
    lines: list[str] = []
    rolling = plan.rolling
    if not rolling:
        lines.append("No operand pod changes: applying this policy restarts nothing.")
    for o in rolling:
        where = f"{len(o.nodes)} node(s)"
        if o.action == "upgrade":
            lines.append(
                f"{o.component} ({o.daemonset}): driver upgrade, {o.steps} wave(s):"
                f" {len(o.reinstall)} reinstall (cordon, drain), {len(o.restart_only)}"
                " pod restart only"
            )
            for node in o.reinstall:
                pods = o.gpu_pods.get(node) or ()
                evicted = ", ".join(pods) if pods else "none"
                lines.append(f"  {node}: reinstall; GPU pods removed: {evicted}")
            for node in o.restart_only:
                lines.append(f"  {node}: driver pod restart, installed driver kept")
        elif o.action == "restart":
            step = f", {o.steps} step(s) of {plan.max_unavailable}" if o.steps else ""
            runtime = "; container runtime restarts on each" if o.runtime_restart else ""
            lines.append(f"{o.component} ({o.daemonset}): pods restart on {where}{step}{runtime}")
        else:
            lines.append(f"{o.component} ({o.daemonset}): {o.action} on {where}")
    if plan.driver is not None and plan.driver.estimate_seconds is not None:
        lines.append(f"Driver upgrade bound: {plan.driver.estimate_seconds} s")
    elif plan.driver is not None:
        lines.append("Driver upgrade bound: none (" + ", ".join(plan.driver.unbounded) + ")")
    if plan.objects:
        lines.append("Other objects created, changed or deleted: " + ", ".join(plan.objects))
    return "\n".join(lines) + "\n"


async def _main(args: argparse.Namespace) -> int:
    chart = Path(args.chart) if args.chart else SOURCE_CHART
    read_policy(args.file, chart)  # a bad file is named before any cluster is read
    async with api_client(kubeconfig_for(args)) as api:
        plan = await compute(Rest(api, KINDS), args.file, args.namespace, chart)
    if args.output == "json":
        print(json.dumps(plan_dict(plan), indent=2, sort_keys=True))
    else:
        sys.stdout.write(render_text(plan))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    code: int = asyncio.run(_main(args))
    return code


def add_subcommand(sub: Any) -> None:
    plan = sub.add_parser(
        "plan",
        help="what applying a ClusterPolicy would roll, per operand and node (writes nothing)",
    )
    plan.add_argument(
        "-f",
        "--file",
        required=True,
        help="a ClusterPolicy, or chart values (rendered with --chart); - reads stdin",
    )
    plan.add_argument(
        "--chart",
        default=None,
        help="chart that renders values files (default: deploy/helm/gpu-operator of this"
        " source tree)",
    )
    plan.add_argument(
        "-o",
        "--output",
        default="text",
        choices=["text", "json"],
        help="text: per operand what restarts where; json: the whole plan",
    )
    plan.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig (default: as kubectl: $KUBECONFIG, else in-cluster, else the"
        " local cluster's)",
    )
    plan.add_argument(
        "--dir",
        default=None,
        help="local cluster directory, read when no other kubeconfig is found",
    )
    plan.add_argument(
        "-n",
        "--namespace",
        default=os.environ.get("OPERATOR_NAMESPACE", DEFAULT_NAMESPACE),
        help="namespace of the operands (default: $OPERATOR_NAMESPACE, else gpu-operator)",
    )
    plan.set_defaults(func=cmd_plan)
