"""The Grafana dashboard, built from one source: ``components/data/gpu-operator-dashboard.json``
is :func:`render`'s output (``python -m tests.dashboard_file`` writes it, a unit test
checks the committed file equals it).

Pure: a handful of typed panel descriptions (:class:`Stat`, :class:`TimeSeries`,
:class:`Table`) in :class:`Row` s, laid out and numbered by :func:`dashboard`, and PromQL
built by :func:`op` and :func:`agent`, which scope every selector to the dashboard's
variables: ``$cluster`` and ``$namespace`` on every metric, ``$node`` on the node agent's
too (the operator's metrics have no ``node`` label). Each variable offers "All" as ``.*``,
which also matches a label a Prometheus does not set (a single cluster has no ``cluster``
label): the queries return data there too.

Not Grafana's own SDK (``grafana-foundation-sdk``): its wheels are versioned by a build
epoch, so an unpinned install picks its Grafana 10.1 schema, and its output leaves
``refId`` empty and panel ids unset; the few shapes used here are Grafana's stable
dashboard JSON (schema 39).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
DCGM_DASHBOARD_URL = "https://grafana.com/grafana/dashboards/12239"
"""NVIDIA's DCGM exporter dashboard (the DCGM exporter is an operand; its metrics, with
profiling counters this dashboard lacks, are not queried here)."""
WIDTH = 24
"""Grafana's grid is 24 columns wide."""

SCOPE = ('cluster=~"$cluster"', 'namespace=~"$namespace"')
"""Matchers every selector carries."""
NODE_SCOPE = (*SCOPE, 'node=~"$node"')
"""Matchers every selector of a node agent metric carries."""
GPU = "{{node}} GPU {{gpu}}"
"""Legend of a per-GPU series."""


def _selector(metric: str, scope: Sequence[str], matchers: Sequence[str]) -> str:
    return f"{metric}{{{', '.join((*scope, *matchers))}}}"


def op(metric: str, *matchers: str) -> str:
    """A selector of an operator metric, in the chosen clusters and namespaces."""
    return _selector(metric, SCOPE, matchers)


def agent(metric: str, *matchers: str) -> str:
    """A selector of a node agent metric, on the chosen clusters, namespaces and nodes."""
    return _selector(metric, NODE_SCOPE, matchers)


# ----------------------------------------------------------------- the model


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Variable:
    """A query variable: the values of ``label`` on ``metric`` within the variables
    before it."""

    name: str
    label: str
    metric: str
    scope: tuple[str, ...] = ()

    @property
    def query(self) -> str:
        selector = f"{{{', '.join(self.scope)}}}" if self.scope else ""
        return f"label_values({self.metric}{selector}, {self.name})"


@dataclass(frozen=True)
class Mapping:
    value: str
    text: str
    color: str


@dataclass(frozen=True)
class Stat:
    title: str
    description: str
    query: Query
    w: int = 6
    h: int = 5
    mappings: tuple[Mapping, ...] = ()
    thresholds: tuple[tuple[float | None, str], ...] = ()
    """(from value, colour) steps; the first from None."""
    unit: str | None = None


@dataclass(frozen=True)
class TimeSeries:
    title: str
    description: str
    queries: tuple[Query, ...]
    w: int = 12
    h: int = 8
    unit: str | None = None
    decimals: int | None = None
    stacked: bool = False
    max: float | None = None


@dataclass(frozen=True)
class Table:
    """Instant queries shown as a table: one row per series, its labels as columns."""

    title: str
    description: str
    query: Query
    columns: tuple[str, ...]
    w: int = 12
    h: int = 8


Panel = Stat | TimeSeries | Table


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


# ----------------------------------------------------------------- the dashboard

VARIABLES = (
    Variable("cluster", "Cluster", "gpu_operator_reconciliation_status"),
    Variable(
        "namespace",
        "Namespace",
        "gpu_operator_reconciliation_status",
        ('cluster=~"$cluster"',),
    ),
    Variable("node", "Node", "gpu_operator_node_metrics_ready_ts_seconds", SCOPE),
)

YES_NO = (Mapping("1", "yes", "blue"), Mapping("0", "no", "green"))
NONE_GREEN = ((None, "green"), (1.0, "red"))
"""Green at zero, red from one: a count of faults."""


def _operator_max(metric: str, legend: str) -> Query:
    return Query(f"max({op(metric)})", legend)


FLEET = Row(
    "Fleet rollout",
    (
        Stat(
            "ClusterPolicy",
            "gpu_operator_reconciliation_status of the leader (max over replicas).",
            _operator_max("gpu_operator_reconciliation_status", "status"),
            mappings=(
                Mapping("1", "Ready", "green"),
                Mapping("0", "Not ready", "orange"),
                Mapping("-1", "No ClusterPolicy", "blue"),
                Mapping("-2", "Error", "red"),
            ),
        ),
        Stat(
            "GPU nodes",
            "Nodes the operator counts as GPU nodes (NFD's NVIDIA PCI label, or the"
            " nvidia.com/gpu.present label).",
            _operator_max("gpu_operator_gpu_nodes_total", "GPU nodes"),
            thresholds=((None, "blue"),),
        ),
        Stat(
            "GPU nodes unhealthy",
            "GPU nodes whose GPUHealthy condition is False (the node agent reports it).",
            _operator_max("gpu_operator_gpu_health_unhealthy_nodes", "unhealthy"),
            thresholds=NONE_GREEN,
        ),
        Stat(
            "NFD labels found",
            "Whether Node Feature Discovery's PCI labels are on at least one node; without"
            " them only nodes labelled nvidia.com/gpu.present count as GPU nodes.",
            _operator_max("gpu_operator_reconciliation_has_nfd_labels", "nfd"),
            mappings=(Mapping("1", "yes", "green"), Mapping("0", "no", "red")),
        ),
        TimeSeries(
            "Nodes stuck, by component they wait for",
            "GPU nodes waiting longer than --node-stuck-seconds for an operand pod.",
            (Query(f"max by (state) ({op('gpu_operator_nodes_not_ready')})", "{{state}}"),),
            decimals=0,
        ),
        TimeSeries(
            "Nodes validated, per step (node status exporter)",
            "Nodes whose validator wrote each *-ready status file (needs nodeStatusExporter).",
            tuple(
                Query(f"sum({agent(f'gpu_operator_node_{step}_ready')})", step)
                for step in ("driver", "toolkit", "cuda", "plugin")
            ),
            decimals=0,
        ),
    ),
)

UPGRADES = Row(
    "Driver upgrades",
    (
        TimeSeries(
            "Nodes per upgrade state",
            "GPU nodes in each driver upgrade state (in progress counts failed nodes too,"
            " as upstream's metric does).",
            (
                _operator_max("gpu_operator_nodes_upgrades_pending", "pending"),
                _operator_max("gpu_operator_nodes_upgrades_in_progress", "in progress"),
                _operator_max("gpu_operator_nodes_upgrades_done", "done"),
                _operator_max("gpu_operator_nodes_upgrades_failed", "failed"),
            ),
            decimals=0,
            stacked=True,
        ),
        TimeSeries(
            "Upgrade budget",
            "Slots free under maxParallelUpgrades and maxUnavailable; nodes the canary/halt"
            " gate holds back.",
            (
                _operator_max("gpu_operator_nodes_upgrades_available", "free slots"),
                _operator_max("gpu_operator_driver_upgrade_held_nodes", "held by the rollout gate"),
            ),
            decimals=0,
        ),
        Stat(
            "Auto-upgrade",
            "Whether driver.upgradePolicy.autoUpgrade is on.",
            _operator_max("gpu_operator_driver_auto_upgrade_enabled", "auto"),
            h=4,
            mappings=(Mapping("1", "on", "blue"), Mapping("0", "off", "text")),
        ),
        Stat(
            "Canary in progress",
            "1 while the canary nodes upgrade or soak and the other nodes wait.",
            _operator_max("gpu_operator_driver_upgrade_canary_in_progress", "canary"),
            h=4,
            mappings=YES_NO,
        ),
        Stat(
            "Rollout halted",
            "1 while the driver rollout is halted after haltAfterFailures failed nodes.",
            _operator_max("gpu_operator_driver_upgrade_halted", "halted"),
            h=4,
            mappings=(Mapping("1", "HALTED", "red"), Mapping("0", "no", "green")),
        ),
        Stat(
            "Failed nodes this rollout",
            "Nodes that reached upgrade-failed in the current driver rollout.",
            _operator_max("gpu_operator_driver_upgrade_rollout_failed_nodes", "failed"),
            h=4,
            thresholds=NONE_GREEN,
        ),
    ),
)


def _count(selector: str, legend: str) -> Query:
    """How many series match (0, not no data, when none does)."""
    return Query(f"count({selector}) or vector(0)", legend)


def _sum(selector: str, legend: str) -> Query:
    return Query(f"sum({selector}) or vector(0)", legend)


# NVML's throttle reasons that are not a slowdown (an idle GPU, clocks an administrator
# set, the display clock) are left out.
NOT_SLOWDOWN = "gpu_idle|applications_clocks_setting|display_clock_setting"
THROTTLED = agent("gpu_operator_node_gpu_clock_throttle_active", f'reason!~"{NOT_SLOWDOWN}"')
ECC_AGGREGATE = agent("gpu_operator_node_gpu_ecc_errors_total", 'counter="aggregate"')

GPUS = Row(
    "GPUs (node agent)",
    (
        Stat(
            "GPUs",
            "GPUs the node agents' NVML enumerates (gpu_operator_node_gpu_up series)."
            " NVIDIA's DCGM exporter dashboard (the link above) has the DCGM exporter's view.",
            _count(agent("gpu_operator_node_gpu_up"), "GPUs"),
            w=4,
            h=4,
            thresholds=((None, "blue"),),
        ),
        Stat(
            "GPUs lost",
            "GPUs that fell off the bus or stopped answering NVML (gpu_up 0; XID 79 is"
            " the usual cause). The table 'Which GPUs are lost' names them.",
            _count(f"{agent('gpu_operator_node_gpu_up')} == 0", "lost"),
            w=4,
            h=4,
            thresholds=NONE_GREEN,
        ),
        Stat(
            "Uncorrectable ECC errors",
            "Uncorrected ECC errors since each driver load (the volatile counter), over"
            " the chosen GPUs. Any is a reason to drain the GPU.",
            _sum(
                agent(
                    "gpu_operator_node_gpu_ecc_errors_total",
                    'error_type="uncorrected"',
                    'counter="volatile"',
                ),
                "uncorrected",
            ),
            w=4,
            h=4,
            thresholds=NONE_GREEN,
        ),
        Stat(
            "Row remap failures",
            "GPUs whose memory row remap failed (Ampere and later): the GPU needs service.",
            _sum(agent("gpu_operator_node_gpu_remapped_rows_failed"), "failed"),
            w=4,
            h=4,
            thresholds=NONE_GREEN,
        ),
        Stat(
            "GPUs waiting for a reset",
            "GPUs with a row remap (Ampere and later) or a page retirement (earlier GPUs)"
            " that takes effect only at the next GPU reset.",
            _count(
                # One series per GPU, whichever of the two it reports.
                "max by (cluster, namespace, node, gpu) ("
                f"{agent('gpu_operator_node_gpu_remapped_rows_pending')} == 1"
                f" or {agent('gpu_operator_node_gpu_retired_pages_pending')} == 1)",
                "pending",
            ),
            w=4,
            h=4,
            thresholds=((None, "green"), (1.0, "orange")),
        ),
        Stat(
            "Nodes with NVML down",
            "Node agents whose NVML did not initialise or answer at the last scrape (no"
            " driver loaded, a lost GPU, a missing library); the panel 'NVML down, by"
            " reason' says why.",
            _count(f"{agent('gpu_operator_node_nvml_up')} == 0", "down"),
            w=4,
            h=4,
            thresholds=NONE_GREEN,
        ),
        TimeSeries(
            "GPU utilisation",
            "Share of the last sample period a kernel ran on each GPU (NVML's utilisation"
            " rate; DCGM's profiling metrics tell busy SMs apart).",
            (Query(agent("gpu_operator_node_gpu_utilization_ratio"), GPU),),
            w=8,
            unit="percentunit",
            max=1,
        ),
        TimeSeries(
            "GPU memory bandwidth busy",
            "Share of the last sample period each GPU's memory was read or written.",
            (Query(agent("gpu_operator_node_gpu_memory_utilization_ratio"), GPU),),
            w=8,
            unit="percentunit",
            max=1,
        ),
        TimeSeries(
            "GPU memory used",
            "Framebuffer memory in use, as a share of each GPU's framebuffer.",
            (
                Query(
                    f"{agent('gpu_operator_node_gpu_memory_used_bytes')}"
                    f" / {agent('gpu_operator_node_gpu_memory_total_bytes')}",
                    GPU,
                ),
            ),
            w=8,
            unit="percentunit",
            max=1,
        ),
        TimeSeries(
            "GPU temperature",
            "GPU core temperature.",
            (Query(agent("gpu_operator_node_gpu_temperature_celsius"), GPU),),
            w=8,
            unit="celsius",
        ),
        TimeSeries(
            "GPU power draw, share of the limit",
            "Board power draw over the enforced power limit: near 1 the GPU is power"
            " capped (see the throttle reasons).",
            (
                Query(
                    f"{agent('gpu_operator_node_gpu_power_usage_watts')}"
                    f" / {agent('gpu_operator_node_gpu_power_limit_watts')}",
                    GPU,
                ),
            ),
            w=8,
            unit="percentunit",
        ),
        TimeSeries(
            "GPUs with clocks held down, by reason",
            "GPUs whose clocks NVML reports held down, per reason: power cap, thermal or"
            " hardware slowdown, power brake, sync boost (idle GPUs and clocks set by"
            " an administrator are left out).",
            (Query(f"sum by (reason) ({THROTTLED})", "{{reason}}"),),
            w=8,
            decimals=0,
        ),
        TimeSeries(
            "ECC errors (per hour)",
            "ECC errors per GPU and type, from the aggregate counters (they survive a"
            " driver reload). Corrected errors are routine in small numbers; uncorrected"
            " ones are not.",
            (
                Query(
                    f"sum by (node, gpu, error_type) (increase({ECC_AGGREGATE}[1h]))",
                    f"{GPU} {{{{error_type}}}}",
                ),
            ),
            w=8,
        ),
        TimeSeries(
            "Remapped rows and retired pages",
            "Memory rows remapped (Ampere and later), by the error that caused it, and"
            " pages retired (earlier GPUs), by cause. A rising uncorrectable count means"
            " failing memory.",
            (
                Query(
                    "sum by (node, gpu, error_type) ("
                    f"{agent('gpu_operator_node_gpu_remapped_rows')})",
                    f"{GPU} rows {{{{error_type}}}}",
                ),
                Query(
                    f"sum by (node, gpu, cause) ({agent('gpu_operator_node_gpu_retired_pages')})",
                    f"{GPU} pages {{{{cause}}}}",
                ),
            ),
            w=8,
            decimals=0,
        ),
        TimeSeries(
            "XID errors (per hour), per node and XID",
            "Critical XID errors the driver reported, per node and XID code (48: double"
            " bit ECC, 79: GPU fell off the bus).",
            (
                Query(
                    "sum by (node, xid) (increase("
                    f"{agent('gpu_operator_node_gpu_xid_errors_total')}[1h]))",
                    "{{node}} XID {{xid}}",
                ),
            ),
            w=8,
        ),
        TimeSeries(
            "NVML down, by reason",
            "Node agents whose NVML is down, by why: library_not_found, driver_not_loaded,"
            " gpu_lost, not_supported, unknown.",
            (
                Query(
                    f"sum by (reason) ({agent('gpu_operator_node_nvml_failure_info')})",
                    "{{reason}}",
                ),
            ),
            w=6,
            decimals=0,
        ),
        Table(
            "Which GPUs are lost",
            "Each GPU whose gpu_up is 0 now: the node, the GPU index, its UUID and model.",
            Query(f"{agent('gpu_operator_node_gpu_up')} == 0", ""),
            ("cluster", "node", "gpu", "uuid", "model_name"),
            w=6,
        ),
        Table(
            "Driver versions",
            "Nodes per driver version and the highest CUDA version it supports (during a"
            " driver upgrade, two rows).",
            Query(
                "count by (driver_version, cuda_driver_version) ("
                f"{agent('gpu_operator_node_driver_info')})",
                "",
            ),
            ("driver_version", "cuda_driver_version", "Value"),
            w=6,
        ),
        TimeSeries(
            "MIG mode",
            "GPUs with MIG mode on now, and after their next reset (the two differ while"
            " the MIG manager waits to reset a GPU).",
            (
                _sum(agent("gpu_operator_node_gpu_mig_mode_enabled"), "MIG on"),
                _sum(
                    agent("gpu_operator_node_gpu_mig_mode_pending_enabled"),
                    "MIG on after a reset",
                ),
            ),
            w=6,
            decimals=0,
        ),
    ),
)

HEALTH = Row(
    "GPU health and remediation",
    (
        TimeSeries(
            "GPU nodes: unhealthy and quarantined",
            "GPU nodes whose GPUHealthy condition is False, those the operator holds in"
            " quarantine, and (healthRemediation.dryRun) those it would quarantine.",
            (
                _operator_max(
                    "gpu_operator_gpu_health_unhealthy_nodes", "unhealthy (GPUHealthy=False)"
                ),
                _operator_max("gpu_operator_gpu_health_quarantined_nodes", "quarantined"),
                _operator_max(
                    "gpu_operator_gpu_health_dry_run_would_quarantine_nodes",
                    "dry run: would quarantine",
                ),
            ),
            decimals=0,
        ),
        TimeSeries(
            "Quarantines and releases (per hour)",
            "Nodes quarantined, by the action taken (cordon, taint, drain), and"
            " quarantines lifted.",
            (
                Query(
                    "sum by (action) (increase("
                    f"{op('gpu_operator_gpu_health_quarantines_total')}[1h]))",
                    "quarantined: {{action}}",
                ),
                Query(
                    f"sum(increase({op('gpu_operator_gpu_health_releases_total')}[1h]))",
                    "released",
                ),
            ),
            w=8,
        ),
        Stat(
            "Remediation breaker",
            "PAUSED while the circuit breaker holds remediation (too many nodes unhealthy"
            " at once).",
            _operator_max("gpu_operator_gpu_health_remediation_paused", "paused"),
            w=4,
            h=8,
            mappings=(Mapping("1", "PAUSED", "red"), Mapping("0", "armed", "green")),
        ),
        TimeSeries(
            "GPUs exposed by the device plugin, per node",
            "-1: the node could not be read. 0 for 30m fires GPUOperatorNodeDeploymentFailed.",
            (Query(agent("gpu_operator_node_device_plugin_devices_total"), "{{node}}"),),
            w=12,
            decimals=0,
        ),
        TimeSeries(
            "NVIDIA PCI devices vs GPUs NVML sees, per node",
            "NVIDIA devices on each node's PCI bus and the GPUs NVML enumerates there: a"
            " gap is a GPU the driver does not see.",
            (
                Query(agent("gpu_operator_nvidia_pci_devices_total"), "PCI {{node}}"),
                Query(agent("gpu_operator_node_gpu_count"), "NVML {{node}}"),
            ),
            w=12,
            decimals=0,
        ),
    ),
)


def _rate(metric: str) -> str:
    return f"rate({op(metric)}[5m])"


OPERATOR = Row(
    "Operator",
    (
        TimeSeries(
            "Reconciles and failures",
            "ClusterPolicy reconciliations per second, and those that failed.",
            (
                Query(f"sum({_rate('gpu_operator_reconciliation_total')})", "reconciles/s"),
                Query(f"sum({_rate('gpu_operator_reconciliation_failed_total')})", "failed/s"),
            ),
            unit="ops",
        ),
        TimeSeries(
            "CPU per reconcile",
            "CPU of the ClusterPolicy pass, not counting waits on the API server.",
            (
                Query(
                    f"sum({_rate('gpu_operator_reconciliation_cpu_seconds_total')})"
                    f" / sum({_rate('gpu_operator_reconciliation_total')})",
                    "CPU seconds per reconcile",
                ),
            ),
            unit="s",
        ),
        TimeSeries(
            "Reconcile latency by pass",
            "Wall time of one work-queue pass, API waits included: the cluster pass, a"
            " node's pass, the fleet upgrade pass, remediation and NVIDIADrivers.",
            tuple(
                Query(
                    f"histogram_quantile({q}, sum by (le, pass) ("
                    f"{_rate('gpu_operator_reconcile_duration_seconds_bucket')}))",
                    f"p{round(q * 100)} {{{{pass}}}}",
                )
                for q in (0.5, 0.99)
            ),
            unit="s",
        ),
        TimeSeries(
            "API requests by verb",
            "Requests the operator sends to the API server. An idle operator sends none: a"
            " flat non-zero line means something polls.",
            (Query(f"sum by (verb) ({_rate('gpu_operator_api_requests_total')})", "{{verb}}"),),
            unit="reqps",
        ),
    ),
)

ROWS = (FLEET, GPUS, UPGRADES, HEALTH, OPERATOR)


# ----------------------------------------------------------------- JSON


def _target(query: Query, ref: int, *, instant: bool, table: bool = False) -> dict[str, Any]:
    target: dict[str, Any] = {
        "datasource": dict(DATASOURCE),
        "refId": chr(ord("A") + ref),
        "expr": query.expr,
        "legendFormat": query.legend,
    }
    if instant:
        target["instant"] = True
    if table:
        target["format"] = "table"
        del target["legendFormat"]
    return target


def _mappings(mappings: Sequence[Mapping]) -> list[dict[str, Any]]:
    options = {
        m.value: {"text": m.text, "color": m.color, "index": i} for i, m in enumerate(mappings)
    }
    return [{"type": "value", "options": options}]


def _thresholds(steps: Sequence[tuple[float | None, str]]) -> dict[str, Any]:
    return {
        "mode": "absolute",
        "steps": [{"color": color, "value": value} for value, color in steps],
    }


def _stat(panel: Stat) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    if panel.unit:
        defaults["unit"] = panel.unit
    if panel.mappings:
        defaults["mappings"] = _mappings(panel.mappings)
    if panel.thresholds:
        defaults["thresholds"] = _thresholds(panel.thresholds)
        defaults["color"] = {"mode": "thresholds"}
    return {
        "targets": [_target(panel.query, 0, instant=True)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "auto",
        },
    }


def _timeseries(panel: TimeSeries) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    if panel.unit:
        defaults["unit"] = panel.unit
    if panel.decimals is not None:
        defaults["decimals"] = panel.decimals
    if panel.max is not None:
        defaults["min"] = 0
        defaults["max"] = panel.max
    defaults["custom"] = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10,
        "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"},
    }
    return {
        "targets": [_target(q, i, instant=False) for i, q in enumerate(panel.queries)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
    }


def _table(panel: Table) -> dict[str, Any]:
    return {
        "targets": [_target(panel.query, 0, instant=True, table=True)],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [
            {
                "id": "filterFieldsByName",
                "options": {"include": {"names": list(panel.columns)}},
            }
        ],
    }


def _panel(panel: Panel, panel_id: int, grid: dict[str, int]) -> dict[str, Any]:
    body: dict[str, Any]
    if isinstance(panel, Stat):
        kind: Literal["stat", "timeseries", "table"] = "stat"
        body = _stat(panel)
    elif isinstance(panel, TimeSeries):
        kind = "timeseries"
        body = _timeseries(panel)
    else:
        kind = "table"
        body = _table(panel)
    return {
        "type": kind,
        "title": panel.title,
        "id": panel_id,
        "datasource": dict(DATASOURCE),
        "gridPos": grid,
        **body,
        "description": panel.description,
    }


def _variable(var: Variable) -> dict[str, Any]:
    return {
        "name": var.name,
        "label": var.label,
        "type": "query",
        "datasource": dict(DATASOURCE),
        "query": var.query,
        "definition": var.query,
        "refresh": 2,
        "sort": 1,
        "regex": "",
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {},
        "hide": 0,
    }


def _panels(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Rows and their panels, numbered from 1 and laid out left to right, a panel that
    does not fit the line starting the next."""
    out: list[dict[str, Any]] = []
    y = 0
    for row in rows:
        out.append(
            {
                "type": "row",
                "title": row.title,
                "id": len(out) + 1,
                "collapsed": False,
                "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        x = line = 0
        for panel in row.panels:
            if x + panel.w > WIDTH:
                x, y, line = 0, y + line, 0
            grid = {"h": panel.h, "w": panel.w, "x": x, "y": y}
            out.append(_panel(panel, len(out) + 1, grid))
            x += panel.w
            line = max(line, panel.h)
        y += line
    return out


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    return {
        "title": "GPU Operator (gpuop)",
        "uid": "gpuop-overview",
        "description": "Fleet rollout, driver upgrades, the GPUs (from the node agents),"
        " GPU health remediation and the operator itself, from the metrics gpuop's"
        " operator and node agent serve.",
        "tags": ["gpu", "nvidia", "gpuop"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "graphTooltip": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "links": [
            {
                "type": "link",
                "title": "NVIDIA DCGM Exporter dashboard",
                "tooltip": "grafana.com dashboard 12239: the DCGM exporter's GPU metrics",
                "url": DCGM_DASHBOARD_URL,
                "icon": "external link",
                "targetBlank": True,
                "asDropdown": False,
                "includeVars": False,
                "keepTime": False,
                "tags": [],
            }
        ],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                *(_variable(v) for v in VARIABLES),
            ]
        },
        "annotations": {"list": []},
        "panels": _panels(ROWS),
    }


def render() -> str:
    """The dashboard file's text: two-space JSON, as committed."""
    return json.dumps(dashboard(), indent=2) + "\n"
