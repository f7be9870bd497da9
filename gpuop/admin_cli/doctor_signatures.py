"""`gpuop doctor`'s rules over what containers say: known lines of NVIDIA's driver
container, driver manager and validator (and of our node agent, which plays the
validator), each mapped to a cause and a fix. Pure.

Sources, read not copied: the driver container's ``nvidia-driver`` script
(NVIDIA/gpu-driver-container: ``_resolve_kernel_version``, ``_install_prerequisites``,
``_load_driver``), the nvidia-installer's and the kernel's messages users report
(NVIDIA/gpu-operator#266, #497, #1142, #1726 for Secure Boot; #8, #206 for nouveau), the
driver manager's ``uninstallDriver`` / ``unloadNouveau`` (NVIDIA/k8s-driver-manager
``cmd/driver-manager/main.go``) and the validator's ``/dev/char`` links
(NVIDIA/gpu-operator ``cmd/nvidia-validator/main.go``; ours: ``gpuop/nodeagent/driver.py``).

These need the containers' logs (a support bundle of a real cluster) or a status
message carrying them; the local cluster's nodes run no container, so its tests write
the lines into a bundle.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpuop.admin_cli.doctor_facts import Excerpt, Finding, Snapshot, excerpts, is_driver_pod


@dataclass(frozen=True)
class Signature:
    rule: str
    patterns: tuple[str, ...]
    cause: str
    """Said of the node (``{node}``) and the first matching line (``{line}``)."""
    fix: str
    driver_only: bool = True
    """Only lines of driver pods count (a network error elsewhere is not missing headers)."""

    def match(self, text: str) -> str | None:
        """The first line of ``text`` matching a pattern, trimmed. Each pattern is
        searched in the lowered text on its own: an alternation, or IGNORECASE, reads
        a log of megabytes many times slower."""
        low = text.lower()
        flags = 0
        if len(low) != len(text):  # a character whose lower case is longer
            low, flags = text, re.IGNORECASE
        starts = [m for p in self.patterns if (m := _compiled(p, flags).search(low))]
        if not starts:
            return None
        first = min(starts, key=lambda m: m.start())
        start = text.rfind("\n", 0, first.start()) + 1
        end = text.find("\n", first.end())
        return " ".join(text[start : end if end >= 0 else len(text)].split())[:160]


@functools.cache
def _compiled(pattern: str, flags: int) -> re.Pattern[str]:
    return re.compile(pattern if flags else pattern.lower(), flags)


SECURE_BOOT = Signature(
    "unsigned-module",
    (
        r"Key was rejected by service",
        r"Required key not available",
        r"not signed by a key that is trusted by the kernel",
        r"Loading of unsigned module is rejected",
        r"unsigned module loading is restricted",
    ),
    "Secure Boot on {node} refuses the driver's unsigned kernel modules ({line})",
    "use signed precompiled drivers (driver.usePrecompiled=true), sign the modules with a"
    " key enrolled in the node's MOK list, or turn Secure Boot off on the node",
)
NOUVEAU = Signature(
    "nouveau-loaded",
    (
        r"failed to unload nouveau",
        r"Kernel driver in use: nouveau",
        r"nouveau kernel driver is currently in use",
        r"NVRM: .*nouveau",
        r"could not insert 'nvidia': No such device",
    ),
    "the NVIDIA module cannot take the GPUs of {node}: the nouveau driver holds them (or"
    " this driver does not support the GPU) ({line})",
    "blacklist nouveau on the node (/etc/modprobe.d: 'blacklist nouveau' and 'options"
    " nouveau modeset=0'), rebuild its initramfs and reboot it",
)
KERNEL_HEADERS = Signature(
    "kernel-headers",
    (
        r"Could not resolve Linux kernel version",
        r"Unable to locate package linux-(?:headers|image|modules)",
        r"Unable to find a match: kernel-(?:headers|devel|core)",
        r"No (?:package|match for argument):? kernel-(?:headers|devel)",
        r"Could not locate Linux kernel version string",
        r"Temporary failure resolving",
        r"Failed to download metadata for repo",
        r"Cannot retrieve repository metadata",
    ),
    "the driver container on {node} cannot install the kernel headers to build its"
    " modules: no package repository reachable (air-gapped?) or none has this kernel's"
    " ({line})",
    "serve a package mirror (driver.repoConfig.configMapName; a proxy through driver.env"
    " HTTPS_PROXY), or use precompiled drivers (driver.usePrecompiled=true), or run a"
    " kernel whose headers the distribution publishes",
)
DEV_CHAR = Signature(
    "dev-char-links",
    (r"Failed to create symlinks under /dev/char", r"cannot link /dev/char"),
    "the driver validation on {node} cannot create the /dev/char links of the NVIDIA"
    " devices, so it never writes driver-ready and every operand waits in Init ({line})",
    "make the host's /dev/char writable to the validator, or skip the links:"
    " validator.driver.env DISABLE_DEV_CHAR_SYMLINK_CREATION=true (containers may lose their"
    " GPUs after a systemctl daemon-reload, NVIDIA/gpu-operator#430)",
    driver_only=False,
)
SIGNATURES = (SECURE_BOOT, NOUVEAU, KERNEL_HEADERS, DEV_CHAR)

DRIVER_IN_USE = (
    r"driver is in use",
    r"module nvidia is in use",
    r"cannot proceed until all GPU pods are drained",
    r"Cleanup could not automatically proceed on node",
    r"still hold GPU resource claims",
)
"""The driver container's and the driver manager's words for a driver it cannot
unload (``_unload_driver``; ``main.go:uninstallDriver`` / ``cleanupOnFailure``)."""


def in_use_lines(snapshot: Snapshot) -> dict[str, str]:
    """Driver pod name to its first line saying the driver is in use."""
    in_use = Signature("driver-in-use", DRIVER_IN_USE, "", "")
    driver_pods = _driver_pods(snapshot)
    found: dict[str, str] = {}
    for ex in excerpts(snapshot):
        if ex.pod in driver_pods and ex.pod not in found:
            line = in_use.match(ex.text)
            if line:
                found[ex.pod] = line
    return found


def _driver_pods(snapshot: Snapshot) -> set[str]:
    names = {p["metadata"]["name"] for p in snapshot.pods or [] if is_driver_pod(p)}
    # A pod gone since (only its log is left) counts by its DaemonSet's name.
    names |= {pod for pod, _ in snapshot.logs if pod.startswith("nvidia-driver-daemonset")}
    return names


def signature_findings(snapshot: Snapshot) -> list[Finding]:
    """One finding per signature and node (or pod, where the node is unknown)."""
    driver_pods = _driver_pods(snapshot)
    seen: dict[tuple[str, str], list[Excerpt]] = {}
    lines: dict[tuple[str, str], str] = {}
    for ex in excerpts(snapshot):
        for sig in SIGNATURES:
            if sig.driver_only and ex.pod not in driver_pods:
                continue
            line = sig.match(ex.text)
            if line is None:
                continue
            key = (sig.rule, ex.node or ex.pod)
            seen.setdefault(key, []).append(ex)
            lines.setdefault(key, line)
    findings = []
    by_rule = {sig.rule: sig for sig in SIGNATURES}
    for (rule, where), found in sorted(seen.items()):
        sig = by_rule[rule]
        node = found[0].node
        objects = ([f"node/{node}"] if node else []) + _pod_objects(snapshot, found)
        cause = sig.cause.format(
            node=f"node {node}" if node else "its node", line=lines[rule, where]
        )
        findings.append(Finding(rule, cause, sig.fix, tuple(objects)))
    return findings


def _pod_objects(snapshot: Snapshot, found: Iterable[Excerpt]) -> list[str]:
    names: list[str] = []
    for ex in found:
        name = f"pod/{snapshot.namespace}/{ex.pod} ({ex.container})"
        if name not in names:
            names.append(name)
    return names
