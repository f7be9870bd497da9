"""Watch caches against the real API server: list+watch, relist after 410 Gone,
reconnect after silence, no requests at all while nothing changes, and backoff
(and a failing /healthz) while the API server cannot be reached."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from gpuop.devcluster import ClusterInfo
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.kube.kinds import KINDS, by_kind
from gpuop.kube.rest import Rest
from gpuop.operator.controller.views.node_views import NodeTrim, selector_label_keys
from gpuop.operator.health import Liveness
from gpuop.operator.server import make_app, start
from tests.integration.harness import NAMESPACE, eventually
from tests.integration.proxy import proxied_client
from tests.integration.test_control_plane import _compact_etcd

pytestmark = pytest.mark.integration

TEMPLATE = by_kind("v1", "PodTemplate")


def _template(name: str, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": app}},
        "template": {"spec": {"containers": [{"name": "c", "image": "pause"}]}},
    }


async def test_informer_relists_after_410_and_keeps_an_exact_cache(
    rest: Rest, local_cluster: ClusterInfo
) -> None:
    # PodTemplates bypass the API server's watch cache in the local cluster, so a
    # watch resumed from a compacted resourceVersion really gets 410 Gone.
    await rest.create(TEMPLATE, _template("watched-0", "watched"), NAMESPACE)
    events: list[tuple[str, str]] = []

    def handler(kind: str, old: Any, new: Any) -> None:
        events.append((kind, (new or old)["metadata"]["name"]))

    informer = Informer(
        ResourceSpec(
            "podtemplates", rest.lister(TEMPLATE, NAMESPACE), label_selector="app=watched"
        ),
        handler,
        silence=1.0,  # reconnect quickly when the stream is quiet
    )
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 10)
        assert set(informer.store) == {f"{NAMESPACE}/watched-0"}
        assert informer.relists == 1

        await rest.create(TEMPLATE, _template("watched-1", "watched"), NAMESPACE)

        async def seen_watched_1() -> bool:
            return f"{NAMESPACE}/watched-1" in informer.store

        await eventually(seen_watched_1, timeout=10)
        # Changes the informer does not select move etcd on; then history is compacted.
        for i in range(3):
            await rest.create(TEMPLATE, _template(f"other-{i}", "other"), NAMESPACE)
        await _compact_etcd(local_cluster.ports["etcd"])
        # The next reconnect (after a second of silence) resumes from a compacted
        # version: 410, relist, and the cache is whole again.

        async def relisted() -> bool:
            return informer.relists >= 2

        await eventually(relisted, timeout=15)
        await rest.create(TEMPLATE, _template("watched-2", "watched"), NAMESPACE)

        async def seen_watched_2() -> bool:
            return f"{NAMESPACE}/watched-2" in informer.store

        await eventually(seen_watched_2, timeout=10)
        assert set(informer.store) == {f"{NAMESPACE}/watched-{i}" for i in range(3)}
        assert informer.reconnects >= 1
        assert ("ADDED", "watched-2") in events
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for name in ["watched-0", "watched-1", "watched-2", "other-0", "other-1", "other-2"]:
            await rest.delete(TEMPLATE, name, NAMESPACE)


async def test_an_idle_informer_makes_no_requests(rest: Rest) -> None:
    counted = Rest(rest.api, KINDS)
    informer = Informer(
        ResourceSpec("nodes", counted.lister(by_kind("v1", "Node"))), lambda *_: None
    )
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 10)
        await asyncio.sleep(0.5)
        before = dict(counted.counts)
        await asyncio.sleep(5)
        assert dict(counted.counts) == before
        assert before == {("LIST", "nodes"): 1, ("WATCH", "nodes"): 1}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_watch_reconnects_back_off_while_the_api_server_is_unreachable(
    local_cluster: ClusterInfo,
) -> None:
    """The informer syncs through a proxy, then the proxy's port closes (every
    connection refused). Reconnects must back off: a few in a few seconds, where an
    unthrottled loop makes thousands. Liveness then fails, from memory alone."""
    async with proxied_client(local_cluster.kubeconfig) as (api, proxy):
        counted = Rest(api, KINDS)
        informer = Informer(
            ResourceSpec("nodes", counted.lister(by_kind("v1", "Node"))), lambda *_: None
        )
        task = asyncio.create_task(informer.run())
        runner = None
        try:
            await asyncio.wait_for(informer.synced.wait(), 10)

            async def watching() -> bool:
                return counted.counts[("WATCH", "nodes")] == 1

            await eventually(watching, timeout=10)
            await proxy.close()
            before = sum(counted.counts.values())
            await asyncio.sleep(3)
            attempts = sum(counted.counts.values()) - before
            assert 1 <= attempts <= 10, counted.counts

            liveness = Liveness(informers=lambda: [informer], unavailable_after=0.5)
            runner = await start(
                make_app(CollectorRegistry(), liveness.check, lambda: (True, "ok")),
                "127.0.0.1",
                0,
            )

            async def unhealthy() -> bool:
                return not liveness.check()[0]

            await eventually(unhealthy, timeout=30)
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{runner.addresses[0][1]}/healthz") as resp,
            ):
                assert resp.status == 500
                assert "watch nodes failing" in await resp.text()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if runner is not None:
                await runner.cleanup()


async def test_a_relist_keeps_what_our_writes_returned_after_its_snapshot(rest: Rest) -> None:
    """Writes answered while a LIST is read are newer than its snapshot: the relist
    must neither roll them back nor drop an object created after the snapshot."""
    await rest.create(TEMPLATE, _template("snap-0", "snap"), NAMESPACE)
    real = rest.lister(TEMPLATE, NAMESPACE)
    write_during_list = False

    async def list_then_write(**kwargs: Any) -> Any:
        resp = await real(**kwargs)
        if write_during_list and not kwargs.get("watch"):
            patched = await rest.merge_patch(
                TEMPLATE, "snap-0", {"metadata": {"labels": {"v": "2"}}}, NAMESPACE
            )
            informer.observe(patched)
            informer.observe(await rest.create(TEMPLATE, _template("snap-1", "snap"), NAMESPACE))
        return resp

    informer = Informer(
        ResourceSpec("podtemplates", list_then_write, label_selector="app=snap"),
        lambda *_: None,
    )
    try:
        await informer._list()
        assert set(informer.store) == {f"{NAMESPACE}/snap-0"}
        write_during_list = True
        await informer._list()
        snap0 = informer.get(f"{NAMESPACE}/snap-0")
        assert snap0 is not None
        assert snap0["metadata"]["labels"].get("v") == "2"
        assert f"{NAMESPACE}/snap-1" in informer.store
    finally:
        for name in ["snap-0", "snap-1"]:
            await rest.delete(TEMPLATE, name, NAMESPACE)


async def test_a_relist_on_request_brings_back_what_the_transform_now_keeps(rest: Rest) -> None:
    """The node cache keeps only the label prefixes the operator reads; when an
    NVIDIADriver selects on another label, the cache widens its trim and lists again at
    once (the open watch is closed), and later changes of that label arrive as events."""
    node_kind = by_kind("v1", "Node")
    name = (await rest.list(node_kind))[0]["metadata"]["name"]
    key = "gpuop-test.example/pool"
    trim = NodeTrim()
    seen: list[str | None] = []

    def handler(event: str, old: Any, new: Any) -> None:
        if new is not None and new["metadata"]["name"] == name:
            seen.append(new["metadata"]["labels"].get(key))

    counted = Rest(rest.api, KINDS)
    informer = Informer(ResourceSpec("nodes", counted.lister(node_kind), transform=trim), handler)
    await rest.merge_patch(node_kind, name, {"metadata": {"labels": {key: "a"}}})
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 10)
        assert key not in informer.store[name]["metadata"]["labels"]
        trim.extra_labels = selector_label_keys([{key: "a", "nvidia.com/gpu.product": "x"}])
        assert trim.extra_labels == {key}
        informer.request_relist()

        async def kept() -> bool:
            return informer.store[name]["metadata"]["labels"].get(key) == "a"

        await eventually(kept, timeout=10)
        assert counted.counts[("LIST", "nodes")] == 2
        assert seen[-1] == "a"  # the relist told the handler what it now keeps
        await rest.merge_patch(node_kind, name, {"metadata": {"labels": {key: "b"}}})

        async def followed() -> bool:
            return bool(seen) and seen[-1] == "b"

        await eventually(followed, timeout=10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await rest.merge_patch(node_kind, name, {"metadata": {"labels": {key: None}}})
