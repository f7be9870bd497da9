"""The operator's Prometheus metrics, with the upstream names dashboards expect."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "gpu_operator_"

#: ``reconciliation_status`` values, as upstream defines them.
STATUS_READY = 1
STATUS_NOT_READY = 0
STATUS_NO_POLICY = -1
STATUS_ERROR = -2


class OperatorMetrics:
    """All metrics on one private registry (tests run several operators per process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.gpu_nodes_total = Gauge(
            f"{PREFIX}gpu_nodes_total", "Number of nodes with GPUs", registry=r
        )
        self.nodes_not_ready = Gauge(
            f"{PREFIX}nodes_not_ready",
            "GPU nodes stuck in the rollout (waiting longer than --node-stuck-seconds for"
            " an operand pod), by the component each waits for",
            ["state"],
            registry=r,
        )
        self.reconciliation_status = Gauge(
            f"{PREFIX}reconciliation_status",
            "1 ready, 0 not ready, -1 no ClusterPolicy, -2 error",
            registry=r,
        )
        self.reconciliation_total = Counter(
            f"{PREFIX}reconciliation", "ClusterPolicy reconciliations", registry=r
        )
        self.reconciliation_cpu_seconds_total = Counter(
            f"{PREFIX}reconciliation_cpu_seconds",
            "CPU seconds the operator's ClusterPolicy reconciliations took (not counting "
            "waits on the API server): with gpu_operator_reconciliation_total, what one costs",
            registry=r,
        )
        self.reconcile_duration_seconds = Histogram(
            f"{PREFIX}reconcile_duration_seconds",
            "Wall time of one pass of the operator's work queue, waits on the API server"
            " included, by pass (cluster, node, upgrades, remediation, nvidiadrivers)",
            ["pass"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.pod_events_total = Counter(
            f"{PREFIX}pod_events",
            "Operand pod watch events by what became of them: unchanged (nothing the pods"
            " cache keeps changed: taken at intake, no pass), woke (queued a pass), idle"
            " (told, woke none)",
            ["outcome"],
            registry=r,
        )
        self.api_requests_total = Counter(
            f"{PREFIX}api_requests",
            "Requests the operator made to the API server, by verb and resource"
            " (an idle operator makes none)",
            ["verb", "resource"],
            registry=r,
        )
        self.reconciliation_failed_total = Counter(
            f"{PREFIX}reconciliation_failed",
            "ClusterPolicy reconciliations that failed",
            registry=r,
        )
        self.reconciliation_last_success = Gauge(
            f"{PREFIX}reconciliation_last_success_ts_seconds",
            "Time of the last successful reconciliation (unix seconds)",
            registry=r,
        )
        self.reconciliation_has_nfd_labels = Gauge(
            f"{PREFIX}reconciliation_has_nfd_labels",
            "1 when NFD's PCI labels were found on at least one node",
            registry=r,
        )
        self.driver_auto_upgrade_enabled = Gauge(
            f"{PREFIX}driver_auto_upgrade_enabled", "1 when driver auto-upgrade is on", registry=r
        )
        self.upgrades_in_progress = Gauge(
            f"{PREFIX}nodes_upgrades_in_progress",
            "Nodes in a driver upgrade (failed ones included, as upstream)",
            registry=r,
        )
        self.upgrades_done = Gauge(
            f"{PREFIX}nodes_upgrades_done", "Nodes whose driver upgrade is done", registry=r
        )
        self.upgrades_failed = Gauge(
            f"{PREFIX}nodes_upgrades_failed", "Nodes whose driver upgrade failed", registry=r
        )
        self.upgrades_available = Gauge(
            f"{PREFIX}nodes_upgrades_available",
            "Upgrade slots free under maxParallelUpgrades and maxUnavailable",
            registry=r,
        )
        self.upgrades_pending = Gauge(
            f"{PREFIX}nodes_upgrades_pending", "Nodes waiting for a driver upgrade", registry=r
        )
        # Driver rollout gate (a gpuop extension: upgradePolicy.canary, haltAfterFailures).
        self.upgrade_halted = Gauge(
            f"{PREFIX}driver_upgrade_halted",
            "1 while the driver rollout is halted after haltAfterFailures failed nodes",
            registry=r,
        )
        self.upgrade_rolled_back = Gauge(
            f"{PREFIX}driver_upgrade_rolled_back",
            "1 while the driver is rolled back after a halt (upgradePolicy.rollbackOnHalt)",
            registry=r,
        )
        self.upgrade_canary = Gauge(
            f"{PREFIX}driver_upgrade_canary_in_progress",
            "1 while canary nodes upgrade or soak and the other nodes wait",
            registry=r,
        )
        self.upgrade_held = Gauge(
            f"{PREFIX}driver_upgrade_held_nodes",
            "Nodes waiting for a driver upgrade that the rollout gate holds back",
            registry=r,
        )
        self.upgrade_rollout_failures = Gauge(
            f"{PREFIX}driver_upgrade_rollout_failed_nodes",
            "Nodes that reached upgrade-failed in the current driver rollout",
            registry=r,
        )
        # GPU health remediation (a gpuop extension, spec.healthRemediation).
        self.health_unhealthy = Gauge(
            f"{PREFIX}gpu_health_unhealthy_nodes",
            "GPU nodes whose GPUHealthy condition is False",
            registry=r,
        )
        self.health_quarantined = Gauge(
            f"{PREFIX}gpu_health_quarantined_nodes",
            "GPU nodes the operator holds in quarantine",
            registry=r,
        )
        self.health_would_quarantine = Gauge(
            f"{PREFIX}gpu_health_dry_run_would_quarantine_nodes",
            "Dry run: GPU nodes the operator would quarantine now",
            registry=r,
        )
        self.health_paused = Gauge(
            f"{PREFIX}gpu_health_remediation_paused",
            "1 while the circuit breaker holds remediation",
            registry=r,
        )
        self.health_quarantines = Counter(
            f"{PREFIX}gpu_health_quarantines",
            "Nodes quarantined for unhealthy GPUs, by action",
            ["action"],
            registry=r,
        )
        self.health_releases = Counter(
            f"{PREFIX}gpu_health_releases", "Quarantines lifted", registry=r
        )
