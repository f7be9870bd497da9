"""`gpuop doctor`: known problems of a cluster, one line each with cause, objects and fix.

It reads what `gpuop support-bundle` would collect: from a live cluster (collected
into memory by the bundle's own reader, with the logs of troubled containers only) or
from a bundle already written
(``--bundle``: the archive, or a directory it was unpacked into). The rules are pure
(``doctor_rules``); this is only the reading and the printing. Exit status 0 when no
rule matched, 1 when one did.
"""

from __future__ import annotations

import argparse
import asyncio
import tarfile
from pathlib import Path

from gpuop.admin_cli.bundle import Bundle, collect
from gpuop.admin_cli.doctor_facts import Finding, snapshot_from_files, troubled
from gpuop.admin_cli.doctor_rules import diagnose
from gpuop.kube.client import api_client
from gpuop.progress import Progress
from gpuop.upgrades_cli._commands import kubeconfig_for

MANIFEST = "manifest.json"


def _from_archive(path: Path) -> dict[str, bytes]:
    """The archive's files, relative to its one top directory."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar.getmembers():
                data = tar.extractfile(member) if member.isfile() else None
                if data is not None and "/" in member.name:
                    files[member.name.split("/", 1)[1]] = data.read()
    except tarfile.TarError as err:
        raise ValueError(f"--bundle {path}: not a support bundle archive ({err})") from None
    return files


def _from_directory(path: Path) -> dict[str, bytes]:
    """A directory holding manifest.json, or the one directory under it that does."""
    root = path
    if not (root / MANIFEST).is_file():
        inner = [d for d in path.iterdir() if (d / MANIFEST).is_file()]
        if len(inner) != 1:
            raise ValueError(f"--bundle {path}: no {MANIFEST} here or in one directory below")
        root = inner[0]
    return {
        str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()
    }


def read_bundle(path: Path) -> dict[str, bytes]:
    """A written support bundle's files, relative to its root."""
    if path.is_dir():
        files = _from_directory(path)
    elif path.is_file():
        files = _from_archive(path)
    else:
        raise ValueError(f"--bundle {path}: no such file or directory")
    if MANIFEST not in files:
        raise ValueError(f"--bundle {path}: no {MANIFEST}, not a gpuop support bundle")
    return files


async def read_cluster(args: argparse.Namespace) -> dict[str, bytes]:
    """What a support bundle of the cluster would hold, kept in memory."""
    bundle = Bundle("doctor")
    kubeconfig = kubeconfig_for(args)  # no cluster to read: the one error line, no progress
    progress = Progress("doctor", total=1)
    async with api_client(kubeconfig, user_agent="gpuop-doctor") as api:
        try:
            await collect(api, args.namespace, args.since, bundle, progress, logs_of=troubled)
        except BaseException:
            progress.finish("failed")
            raise
    progress.finish(f"read {len(bundle.files)} files")
    bundle.json(MANIFEST, {"namespace": args.namespace})
    return bundle.files


def report(findings: list[Finding]) -> int:
    for finding in findings:
        print(finding.line())
    if not findings:
        print("doctor: no known problem found")
    return 1 if findings else 0


def cmd_doctor(args: argparse.Namespace) -> int:
    files = read_bundle(Path(args.bundle)) if args.bundle else asyncio.run(read_cluster(args))
    return report(diagnose(snapshot_from_files(files)))
