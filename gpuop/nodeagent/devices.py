"""Two counts upstream's node status exporter serves beside its validation gauges: the
GPUs the device plugin advertises in the Node's capacity (polled from the API server,
as upstream polls it), and the NVIDIA devices on the host's PCI bus (read from sysfs at
each scrape: upstream runs ``lspci`` and counts the lines naming NVIDIA, which are the
devices of NVIDIA's PCI vendor id)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from gpuop.log import get_logger
from gpuop.nodeagent.kube import KubeError
from gpuop.nodeagent.plugin import GPU_RESOURCE, MIG_PREFIX

log = get_logger(__name__)

NVIDIA_PCI_VENDOR = "0x10de"
DEFAULT_SYSFS = Path("/sys")
POLL_SECONDS = 30.0
"""Upstream's delay between two reads of the node's GPU capacity."""


def nvidia_pci_devices(sysfs: Path = DEFAULT_SYSFS) -> int:
    """NVIDIA PCI functions (GPUs, their audio and NVSwitch devices); -1 when the bus
    cannot be read, as upstream reports a failed ``lspci``."""
    count = 0
    try:
        for device in (sysfs / "bus" / "pci" / "devices").iterdir():
            with contextlib.suppress(OSError):
                if (device / "vendor").read_text().strip().lower() == NVIDIA_PCI_VENDOR:
                    count += 1
    except OSError:
        return -1
    return count


def gpu_capacity(capacity: Mapping[str, str]) -> int:
    """Every ``nvidia.com/gpu`` and ``nvidia.com/mig-*`` device in a node's capacity."""
    total = 0
    for resource, quantity in capacity.items():
        if resource == GPU_RESOURCE or resource.startswith(MIG_PREFIX):
            with contextlib.suppress(ValueError):
                total += int(quantity)
    return total


class NodeCapacityApi(Protocol):
    async def get_node_capacity(self, name: str) -> Mapping[str, str] | None:
        """``status.capacity`` of the node, or None when the node does not exist."""
        ...


class DevicePluginDevices:
    """The device plugin's GPU count on this node, kept by :meth:`run` for the
    collector: ``count`` is None before the first read and -1 while the node cannot be
    read; ``last_success`` is when GPUs were last found (Unix seconds)."""

    def __init__(self, api: NodeCapacityApi, node: str, *, interval_s: float = POLL_SECONDS):
        self.api = api
        self.node = node
        self.interval_s = interval_s
        self.count: int | None = None
        self.last_success: float | None = None

    async def read(self) -> None:
        """One read of the node's capacity."""
        try:
            capacity = await self.api.get_node_capacity(self.node)
        except KubeError as exc:
            capacity, error = None, str(exc)
        else:
            error = "node not found" if capacity is None else ""
        count = -1 if capacity is None else gpu_capacity(capacity)
        if count != self.count:
            log.info("device plugin GPUs", node=self.node, count=count, error=error or None)
        self.count = count
        if count > 0:
            self.last_success = time.time()

    async def run(self, stop: asyncio.Event) -> None:
        """Read until ``stop`` is set."""
        while not stop.is_set():
            await self.read()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
