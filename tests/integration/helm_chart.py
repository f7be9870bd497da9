"""Shared helpers of the chart tests: the cached Helm binary, rendering, the plain
manifests. Run as ``python -m tests.integration.helm_chart`` to regenerate
deploy/manifests/, the chart's files/ and values.schema.json after a chart change."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from components import rbac
from components.registry import COMPONENTS
from gpuop.devcluster._build import ensure_helm
from tests.integration.values_schema import render_values_schema

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpu-operator"
MANIFESTS = ROOT / "deploy" / "manifests" / "gpu-operator.yaml"
DRA_RBAC_MANIFESTS = ROOT / "deploy" / "manifests" / "gpu-operator-dra-rbac.yaml"
CHART_FILES = CHART / "files"
"""Copies of components/data that the chart ships (rules, dashboard): plain files, not
links, so Helm prints no symlink warning; kept equal by tests/integration/test_helm.py.
Beside them, the operand ClusterRoles generated from the registry (`CHART_ROLES`)."""
CHART_ROLES = ROOT / rbac.CHART_ROLES_FILE
"""Kept equal to `rbac.chart_roles_yaml(COMPONENTS)` by tests/unit/test_registry.py."""
VALUES_SCHEMA = CHART / "values.schema.json"
"""Generated from values.yaml (tests/integration/values_schema.py); kept equal by a test."""
DATA_FILES = (
    "gpu-operator.rules.yaml",
    "gpu-operator-down.rules.yaml",
    "gpu-operator-dashboard.json",
)
DATA = ROOT / "tests" / "data"
RELEASE = "gpu-operator"
NAMESPACE = "gpu-operator"

_MANIFEST_HEADER = f"""\
# gpuop for `kubectl apply`, without Helm: the chart in deploy/helm/gpu-operator
# rendered with its default values (release {RELEASE!r}, namespace {NAMESPACE!r}),
# CRDs included, Helm hooks left out. Generated -- do not edit; regenerate with
#   python -m tests.integration.helm_chart
# Apply with `kubectl apply --server-side -f deploy/manifests/gpu-operator.yaml`.
---
apiVersion: v1
kind: Namespace
metadata:
  name: {NAMESPACE}
"""


def helm(*args: str, kubeconfig: Path | None = None, check: bool = True) -> str:
    """Run the cached Helm binary; on failure the assertion carries its output."""
    env_args = ["--kubeconfig", str(kubeconfig)] if kubeconfig else []
    proc = subprocess.run(
        [str(ensure_helm()), *args, *env_args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}{proc.stdout}"
    return proc.stdout + proc.stderr if not check else proc.stdout


def template(
    *args: str, values: Sequence[Path] = (), release: str = RELEASE, namespace: str = NAMESPACE
) -> str:
    files = [a for v in values for a in ("--values", str(v))]
    return helm("template", release, str(CHART), "--namespace", namespace, *files, *args)


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


_DRA_RBAC_HEADER = f"""\
# What a GPUCluster (the DRA stack) needs of gpuop, for `kubectl apply` without Helm:
# the chart's templates/dra-rbac.yaml with gpuCluster.rbac=true (release {RELEASE!r},
# namespace {NAMESPACE!r}). Apply it after gpu-operator.yaml, only if you create a
# GPUCluster. Generated -- do not edit; regenerate with
#   python -m tests.integration.helm_chart
"""


def render_dra_rbac_manifests() -> str:
    """What deploy/manifests/gpu-operator-dra-rbac.yaml must hold."""
    return _DRA_RBAC_HEADER + template(
        "--set", "gpuCluster.rbac=true", "--show-only", "templates/dra-rbac.yaml"
    )


def render_manifests() -> str:
    """What deploy/manifests/gpu-operator.yaml must hold."""
    # Without Helm's hooks: `kubectl apply` of this file installs the CRDs itself, and
    # has no upgrade or uninstall to hook into.
    return _MANIFEST_HEADER + template("--include-crds", "--no-hooks")


if __name__ == "__main__":
    MANIFESTS.parent.mkdir(parents=True, exist_ok=True)
    for name in DATA_FILES:
        target = CHART_FILES / name
        target.unlink(missing_ok=True)
        target.write_bytes((ROOT / "components" / "data" / name).read_bytes())
        print(f"wrote {target.relative_to(ROOT)}", file=sys.stderr)
    VALUES_SCHEMA.write_text(render_values_schema(CHART / "values.yaml"))
    print(f"wrote {VALUES_SCHEMA.relative_to(ROOT)}", file=sys.stderr)
    CHART_ROLES.write_text(rbac.chart_roles_yaml(COMPONENTS))
    print(f"wrote {CHART_ROLES.relative_to(ROOT)}", file=sys.stderr)
    for path, text in (
        (MANIFESTS, render_manifests()),
        (DRA_RBAC_MANIFESTS, render_dra_rbac_manifests()),
    ):
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
