"""Parsing watch events and LIST pages into a shape keeps exactly what the cache keeps.

The pods watch parses each event into :class:`PodShape` (only the fields ``trim_pod``
reads) instead of the whole JSON; whatever the shape leaves out must be something the
cache never held. The fixtures are operand pods as the API server sent them in a
1,000-node benchmark (managedFields and all).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from components.driver import CONFIG_DIGEST_ENV
from gpuop.kube.informer import Informer, ResourceSpec
from gpuop.kube.shapes import Decoder
from gpuop.operator.controller.views.pod_records import PodShape, pod_index, trim_pod

PODS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent.parent / "data" / "operand_pods.json").read_text()
)


def _variants() -> list[dict[str, Any]]:
    """The recorded pods, plus what a rollout and an upgrade add to them."""
    driver = copy.deepcopy(PODS[1])
    driver["metadata"]["deletionTimestamp"] = "2026-11-24T05:00:00Z"
    driver["spec"]["containers"][0].setdefault("env", []).append(
        {"name": CONFIG_DIGEST_ENV, "value": "abc123"}
    )
    driver["spec"]["containers"][0]["env"].append(
        {"name": "FROM_FIELD", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    )
    driver["status"]["containerStatuses"][0]["state"] = {
        "waiting": {"reason": "ImagePullBackOff", "message": "back-off pulling"}
    }
    pending = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Pending"},
    }
    return [*PODS, driver, pending]


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode()


@pytest.mark.parametrize("pod", _variants(), ids=lambda p: p["metadata"]["name"])
def test_a_shaped_event_trims_to_the_same_cache_entry(pod: dict[str, Any]) -> None:
    shaped = Decoder(PodShape).event(_line("MODIFIED", pod))
    assert shaped["type"] == "MODIFIED"
    assert trim_pod(shaped["object"]) == trim_pod(copy.deepcopy(pod))
    assert "managedFields" not in shaped["object"]["metadata"]
    assert len(json.dumps(shaped)) < len(json.dumps(pod)) / 2 or "managedFields" not in str(pod)


def test_an_error_event_keeps_the_servers_status() -> None:
    status = {"kind": "Status", "code": 410, "message": "too old resource version: 1 (5)"}
    event = Decoder(PodShape).event(_line("ERROR", status))
    assert event["object"]["code"] == 410
    assert event["object"]["message"].startswith("too old")


def test_a_bookmark_keeps_its_resource_version() -> None:
    line = _line("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "12345"}})
    assert Decoder(PodShape).event(line)["object"]["metadata"]["resourceVersion"] == "12345"


def test_what_the_shape_does_not_fit_is_parsed_whole() -> None:
    odd = copy.deepcopy(PODS[1])
    odd["status"]["containerStatuses"][0]["restartCount"] = "many"  # not an int
    event = Decoder(PodShape).event(_line("MODIFIED", odd))
    assert event["object"]["status"]["containerStatuses"][0]["restartCount"] == "many"
    assert "managedFields" in event["object"]["metadata"]  # the whole object


def test_a_list_page_keeps_continue_and_resource_version() -> None:
    body = {
        "kind": "PodList",
        "metadata": {"resourceVersion": "99", "continue": "token"},
        "items": PODS,
    }
    page = Decoder(PodShape).page(json.dumps(body).encode())
    assert page["metadata"] == {"resourceVersion": "99", "continue": "token"}
    assert [trim_pod(p) for p in page["items"]] == [trim_pod(copy.deepcopy(p)) for p in PODS]


def test_no_shape_parses_everything() -> None:
    event = Decoder().event(_line("ADDED", PODS[2]))
    assert event["object"] == PODS[2]


async def _never(**_: Any) -> Any:
    raise AssertionError("no API calls in this test")


def test_the_pods_cache_holds_the_same_entry_with_or_without_the_shape() -> None:
    def cache(shape: Any) -> Informer:
        spec = ResourceSpec("pods", _never, transform=trim_pod, index=pod_index, shape=shape)
        informer = Informer(spec, lambda *_: None)
        for pod in _variants():
            informer._on_line(_line("ADDED", pod))
        return informer

    shaped, whole = cache(PodShape), cache(None)
    assert shaped.store == whole.store
    assert shaped.resource_version == whole.resource_version
