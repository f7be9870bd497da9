"""The MIG layouts the MIG manager offers by default (ConfigMap `default-mig-parted-config`).

A node's `nvidia.com/mig.config` label names one of these. `all-<profile>` splits every
GPU into as many `<profile>` instances as it holds (a `+` in the profile becomes `.` in
the name); the rest apply per GPU model, selected by PCI device id.
"""

from __future__ import annotations

from typing import Any

import yaml

_UNIFORM = (
    "1g.5gb:7 1g.5gb+me:1 2g.10gb:3 3g.20gb:2 4g.20gb:1 7g.40gb:1 1g.24gb+gfx:4 "
    "1g.24gb+me.all:1 1g.24gb-me:4 2g.48gb:2 2g.48gb+gfx:2 2g.48gb+me.all:1 2g.48gb-me:2 "
    "4g.96gb:1 4g.96gb+gfx:1 1g.10gb+me:1 1g.20gb:4 1g.23gb:7 1g.23gb+me:1 1g.24gb+me:1 "
    "2g.20gb:3 3g.40gb:2 4g.40gb:1 7g.80gb:1 1g.6gb:4 1g.6gb+me:1 2g.12gb:2 2g.12gb+me:1 "
    "4g.24gb:1 1g.12gb:7 1g.12gb+me:1 1g.24gb:4 1g.45gb:4 1g.47gb:4 2g.24gb:3 2g.45gb:3 "
    "2g.47gb:3 3g.47gb:2 4g.47gb:1 7g.94gb:1 3g.48gb:2 3g.90gb:2 3g.93gb:2 3g.95gb:2 "
    "4g.48gb:1 4g.90gb:1 4g.93gb:1 4g.95gb:1 7g.96gb:1 7g.180gb:1 7g.186gb:1 7g.189gb:1 "
    "1g.18gb:7 1g.18gb+me:1 2g.35gb:3 3g.71gb:2 4g.71gb:1 7g.141gb:1 1g.36gb:4 2g.36gb:3 "
    "3g.72gb:2 4g.72gb:1 7g.144gb:1 1g.34gb:7 1g.34gb+me:1 1g.67gb:4 2g.67gb:3 3g.135gb:2 "
    "4g.135gb:1 7g.269gb:1 1g.35gb+me:1 1g.70gb:4 2g.70gb:3 3g.139gb:2 4g.139gb:1 7g.278gb:1"
)
"""`profile:count` for every layout that is the same on each GPU that supports it."""

_GA100_80GB = ["0x233010DE", "0x233110DE", "0x232210DE", "0x20B210DE", "0x20B510DE",
               "0x20F310DE", "0x20F510DE", "0x232410DE"]  # fmt: skip
_GA100_40GB = ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]

_PER_MODEL: dict[str, list[tuple[list[str] | str, dict[str, int]]]] = {
    "all-1g.10gb": [(_GA100_80GB, {"1g.10gb": 7}), (_GA100_40GB, {"1g.10gb": 4})],
    "all-1g.35gb": [(["0x233510DE"], {"1g.35gb": 4}), (["0x31C210DE"], {"1g.35gb": 7})],
    "all-balanced": [
        (["0x294110DE"], {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1}),
        (["0x2BB510DE"], {"1g.24gb": 2, "2g.48gb": 1}),
        (["0x290110DE"], {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1}),
        (["0x234810DE"], {"1g.18gb": 2, "2g.36gb": 1, "3g.72gb": 1}),
        (["0x233510DE", "0x233B10DE"], {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
        (["0x232110DE", "0x233A10DE"], {"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1}),
        (_GA100_80GB, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        (_GA100_40GB, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
        ("0x20B710DE", {"1g.6gb": 2, "2g.12gb": 1}),
        (
            ["0x234210DE", "0x233D10DE", "0x20B610DE", "0x232910DE"],
            {"1g.12gb": 2, "2g.24gb": 1, "3g.48gb": 1},
        ),
        (["0x318210DE"], {"1g.34gb": 2, "2g.67gb": 1, "3g.135gb": 1}),
        (["0x31C210DE"], {"1g.35gb": 2, "2g.70gb": 1, "3g.139gb": 1}),
    ],
}
"""Layouts whose instance counts depend on the GPU model (PCI device id filters)."""


def layouts() -> dict[str, list[dict[str, Any]]]:
    """Every default layout by name, as mig-parted reads them."""
    result: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    for item in _UNIFORM.split():
        profile, count = item.rsplit(":", 1)
        result[f"all-{profile.replace('+', '.')}"] = [
            {"devices": "all", "mig-enabled": True, "mig-devices": {profile: int(count)}}
        ]
    for name, groups in _PER_MODEL.items():
        result[name] = [
            {"device-filter": ids, "devices": "all", "mig-enabled": True, "mig-devices": devices}
            for ids, devices in groups
        ]
    return result


def config_yaml() -> str:
    return yaml.safe_dump({"version": "v1", "mig-configs": layouts()}, sort_keys=False)


GPU_CLIENTS = (
    "nvsm.service",
    "nvsm-mqtt.service",
    "nvsm-core.service",
    "nvsm-api-gateway.service",
    "nvsm-notifier.service",
    "nv_peer_mem.service",
    "nvidia-dcgm.service",
    "dcgm.service",
    "dcgm-exporter.service",
)
"""Host services holding the GPUs open: stopped while MIG is reconfigured (host drivers)."""


def gpu_clients_yaml() -> str:
    return yaml.safe_dump({"version": "v1", "systemd-services": list(GPU_CLIENTS)}, sort_keys=False)
