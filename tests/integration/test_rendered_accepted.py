"""Every DaemonSet we render for the recorded conformance policies passes the real API
server's validation (a dry-run create): a pod template the server refuses (say hostPID
with shareProcessNamespace) never rolls out, whatever our unit tests think of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio import client

import components as c
from tests.conformance._diff import conformance_dir, ours_for, scenarios

pytestmark = pytest.mark.integration

SCENARIOS = scenarios(conformance_dir())


@pytest.mark.parametrize("folder", SCENARIOS, ids=[f.name for f in SCENARIOS])
async def test_rendered_daemonsets_pass_server_validation(
    folder: Path, namespace: str, api_client: client.ApiClient
) -> None:
    objects, _ = ours_for(folder)
    apps = client.AppsV1Api(api_client)
    daemonsets = [o for o in objects if o["kind"] == "DaemonSet"]
    assert daemonsets
    for ds in daemonsets:
        body: c.Manifest = {**ds, "metadata": {**ds["metadata"], "namespace": namespace}}
        body["metadata"].pop("ownerReferences", None)
        # Raises ApiException (422) with the server's reason if it refuses the object.
        await apps.create_namespaced_daemon_set(namespace, body, dry_run="All")
