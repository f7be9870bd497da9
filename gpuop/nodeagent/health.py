"""GPU health on the node: NVML faults become the node condition `GPUHealthy`.

The operator's remediation (``spec.healthRemediation``) acts on this condition, so what
counts as a fault is decided here, in one place: :data:`CRITICAL_XIDS` and
:func:`read_faults`. A node whose NVML cannot be loaded at all (no driver yet, a driver
being upgraded) reports ``Unknown``, never ``False``: that says nothing about the GPUs.

The condition is patched onto the Node's status (strategic merge, keyed by type, so the
kubelet's own conditions are untouched) only when status, reason or message change.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from gpuop.log import get_logger
from gpuop.nodeagent.driver import nvml_failure
from gpuop.nodeagent.nvml import GpuLost, NotSupported, Nvml, NvmlError, ThrottleReason
from gpuop.nodeagent.xid import XidCounts

log = get_logger(__name__)
T = TypeVar("T")

CONDITION_TYPE = "GPUHealthy"

#: XIDs after which a GPU must not take new work until it is reset or serviced, and
#: why. Other XIDs (application faults such as 13, 31, 43) stay metrics only.
CRITICAL_XIDS: Mapping[int, str] = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping event: the GPU needs a reset",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error: the GPU needs a reset",
    95: "uncontained ECC error: the GPU needs a reset",
}


class FaultKind(enum.StrEnum):
    """Condition reasons, most severe first (the condition names the worst)."""

    GPU_LOST = "GpuLost"
    XID_CRITICAL = "XidCritical"
    ECC_UNCORRECTABLE = "EccUncorrectable"
    ROW_REMAP_FAILURE = "RowRemapFailure"
    RESET_REQUIRED = "GpuResetRequired"
    THERMAL_SLOWDOWN = "ThermalSlowdown"


_SEVERITY = {kind: rank for rank, kind in enumerate(FaultKind)}
REASON_HEALTHY = "GpusHealthy"
REASON_NVML_UNAVAILABLE = "NvmlUnavailable"


@dataclass(frozen=True, slots=True)
class Fault:
    gpu: int
    uuid: str
    kind: FaultKind
    detail: str

    def describe(self) -> str:
        who = f"GPU {self.gpu}" + (f" ({self.uuid})" if self.uuid else "")
        return f"{who}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The condition's status, reason and message (what is compared before a write)."""

    status: str
    reason: str
    message: str


def read_faults(nvml: Nvml, xids: Mapping[tuple[int, int], int]) -> list[Fault] | None:
    """The faults of every GPU now; None when NVML is unavailable. Blocks (NVML)."""
    try:
        nvml.init()
    except NvmlError as exc:
        log.debug("gpu health unknown", reason=nvml_failure(exc))
        return None
    try:
        count = nvml.device_count()
    except NvmlError as exc:
        log.debug("gpu health unknown", reason=nvml_failure(exc))
        with contextlib.suppress(NvmlError):
            nvml.shutdown()
        return None
    try:
        faults: list[Fault] = []
        uuids: dict[int, str] = {}
        for index in range(count):
            uuids[index], found = _gpu_faults(nvml, index)
            faults.extend(found)
        for (index, xid), seen in sorted(xids.items()):
            if xid in CRITICAL_XIDS and seen > 0:
                detail = f"XID {xid} ({CRITICAL_XIDS[xid]})"
                faults.append(Fault(index, uuids.get(index, ""), FaultKind.XID_CRITICAL, detail))
        return faults
    finally:
        with contextlib.suppress(NvmlError):
            nvml.shutdown()


def _gpu_faults(nvml: Nvml, index: int) -> tuple[str, list[Fault]]:
    """The GPU's UUID (empty when it cannot say) and its faults."""
    try:
        uuid = nvml.device_uuid(index)
    except GpuLost:
        return "", [Fault(index, "", FaultKind.GPU_LOST, "GPU is lost (fell off the bus)")]
    except NvmlError as exc:
        return "", [Fault(index, "", FaultKind.GPU_LOST, f"GPU does not answer: {exc}")]
    faults: list[Fault] = []

    def fault(kind: FaultKind, detail: str) -> None:
        faults.append(Fault(index, uuid, kind, detail))

    try:
        ecc = _optional(nvml.device_ecc_errors, index)
        if ecc is not None and ecc.volatile_uncorrected > 0:
            fault(
                FaultKind.ECC_UNCORRECTABLE,
                f"{ecc.volatile_uncorrected} uncorrectable ECC errors since the driver loaded",
            )
        rows = _optional(nvml.device_remapped_rows, index)
        if rows is not None and rows.failure:
            fault(FaultKind.ROW_REMAP_FAILURE, "row remapping failed")
        elif rows is not None and rows.pending:
            fault(FaultKind.RESET_REQUIRED, "a row remap is pending")
        pages = _optional(nvml.device_retired_pages, index)
        if pages is not None and pages.pending:
            fault(FaultKind.RESET_REQUIRED, "a page retirement is pending")
        throttle = _optional(nvml.device_throttle_reasons, index)
        if throttle is not None and ThrottleReason.HW_THERMAL_SLOWDOWN in throttle:
            # No temperature in the message: it would change (and be written) every read.
            fault(
                FaultKind.THERMAL_SLOWDOWN,
                "hardware thermal slowdown: slowdown temperature reached",
            )
    except GpuLost:
        return uuid, [Fault(index, uuid, FaultKind.GPU_LOST, "GPU is lost (fell off the bus)")]
    return uuid, faults


def _optional(read: Callable[[int], T], index: int) -> T | None:
    """A query this GPU may not support; GpuLost goes up, other errors skip the check."""
    try:
        return read(index)
    except GpuLost:
        raise
    except NotSupported:
        return None
    except NvmlError as exc:
        log.debug("gpu health field unreadable", gpu=index, error=str(exc))
        return None


def verdict(faults: Sequence[Fault] | None) -> Verdict:
    """The condition for these faults: the worst one is the reason, all are named."""
    if faults is None:
        return Verdict("Unknown", REASON_NVML_UNAVAILABLE, "NVML is not available on this node")
    if not faults:
        return Verdict("True", REASON_HEALTHY, "no GPU faults")
    ordered = sorted(faults, key=lambda f: (_SEVERITY[f.kind], f.gpu))
    message = "; ".join(f.describe() for f in ordered)
    return Verdict("False", ordered[0].kind.value, message[:4096])


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(new: Verdict, previous: Mapping[str, Any] | None, now: datetime) -> dict[str, str]:
    """The node condition; lastTransitionTime moves only when the status does (the
    operator's settle time is measured from it)."""
    since = format_time(now)
    if previous is not None and previous.get("status") == new.status:
        since = str(previous.get("lastTransitionTime") or since)
    return {
        "type": CONDITION_TYPE,
        "status": new.status,
        "reason": new.reason,
        "message": new.message,
        "lastHeartbeatTime": format_time(now),
        "lastTransitionTime": since,
    }


def status_patch(cond: Mapping[str, str]) -> dict[str, Any]:
    """A strategic merge patch for ``nodes/status`` touching only this condition."""
    return {"status": {"conditions": [dict(cond)]}}


class NodeStatusApi(Protocol):
    async def node_condition(self, node: str, type_: str) -> Mapping[str, Any] | None:
        """The node's condition of that type, or None."""
        ...

    async def patch_node_status(self, node: str, patch: Mapping[str, Any]) -> None: ...


class KubernetesNodeStatus:
    """:class:`NodeStatusApi` over ``kubernetes_asyncio`` (needs ``get nodes`` and
    ``patch nodes/status``, which the chart grants the node agent; its admission policy
    admits only this condition, only on the node named in the pod's token)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes_asyncio import client

        self._client = api_client
        self._core = client.CoreV1Api(api_client)

    async def node_condition(self, node: str, type_: str) -> Mapping[str, Any] | None:
        obj = await self._core.read_node(node)
        data: Mapping[str, Any] = self._client.sanitize_for_serialization(obj)
        for cond in (data.get("status") or {}).get("conditions") or []:
            if cond.get("type") == type_:
                return dict(cond)
        return None

    async def patch_node_status(self, node: str, patch: Mapping[str, Any]) -> None:
        core: Any = self._core  # the generated stubs omit _content_type
        await core.patch_node_status(
            node, dict(patch), _content_type="application/strategic-merge-patch+json"
        )


class HealthReporter:
    """Reads faults every ``interval_s`` (and at once when woken, e.g. by an XID) and
    patches `GPUHealthy` when it changes. API failures are logged and retried."""

    def __init__(
        self,
        nvml: Nvml,
        api: NodeStatusApi,
        node: str,
        xids: XidCounts,
        *,
        interval_s: float = 10.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.nvml = nvml
        self.api = api
        self.node = node
        self.xids = xids
        self.interval_s = interval_s
        self.clock = clock
        self.wake = asyncio.Event()
        self._written: Verdict | None = None
        self._previous: Mapping[str, Any] | None = None

    async def check_once(self) -> Verdict:
        """One read and, if it changed, one patch. Returns what the node reports."""
        faults = await asyncio.to_thread(read_faults, self.nvml, self.xids.snapshot())
        new = verdict(faults)
        if new == self._written:
            return new
        if self._written is None:
            self._previous = await self.api.node_condition(self.node, CONDITION_TYPE)
        cond = condition(new, self._previous, self.clock())
        await self.api.patch_node_status(self.node, status_patch(cond))
        log.info(
            "gpu health", node=self.node, status=new.status, reason=new.reason, message=new.message
        )
        self._written, self._previous = new, cond
        return new

    async def run(self, stop: asyncio.Event) -> None:
        async def relay() -> None:
            await stop.wait()
            self.wake.set()

        relay_task = asyncio.create_task(relay())
        try:
            while not stop.is_set():
                self.wake.clear()
                try:
                    await self.check_once()
                except Exception as exc:  # the API may be briefly unreachable; try again
                    log.warning("gpu health not reported", node=self.node, error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=self.interval_s)
        finally:
            relay_task.cancel()
