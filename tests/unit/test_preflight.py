"""The upgrade pre-flight's pure parts: image references and pull credentials as a
runtime reads them, the pool verdict per mode, the record the CLI reads; and the
operator unit's memory: a passed pool is not asked again, a held one only after its
backoff, each image once per pull-Secret version (the registry here is a recording
stand-in; tests/integration/test_upgrade_preflight.py asks a real one)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from components.image_ref import (
    Credential,
    ImageRef,
    credential_for,
    docker_auths,
    parse_image,
)
from gpuop.kube.backoff import Backoff
from gpuop.operator.controller.writers.preflight import Preflight
from gpuop.operator.controller.writers.registry import parse_challenge
from gpuop.operator.events import EventRecorder
from statemachine.preflight import (
    RECORD_ANNOTATION,
    Found,
    ImageCheck,
    Mode,
    held_nodes,
    pool_images,
    pool_verdict,
    pull_secret_names,
    record,
    recorded_hold,
)
from statemachine.upgrade_keys import STATE_LABEL
from tests.factories import node

Obj = dict[str, Any]


@pytest.mark.parametrize(
    ("image", "registry", "repository", "reference"),
    [
        ("ubuntu", "docker.io", "library/ubuntu", "latest"),
        ("nvidia/cuda:12.4", "docker.io", "nvidia/cuda", "12.4"),
        ("nvcr.io/nvidia/driver:595.91.07-u22", "nvcr.io", "nvidia/driver", "595.91.07-u22"),
        ("127.0.0.1:5000/nvidia/driver", "127.0.0.1:5000", "nvidia/driver", "latest"),
        ("localhost/x:1", "localhost", "x", "1"),
        ("reg.io/a/b@sha256:abc", "reg.io", "a/b", "sha256:abc"),
        ("[::1]:5000/a:b", "[::1]:5000", "a", "b"),
    ],
)  # fmt: skip
def test_references_split_as_a_runtime_splits_them(
    image: str, registry: str, repository: str, reference: str
) -> None:
    assert parse_image(image) == ImageRef(registry, repository, reference)


def test_api_hosts_and_plain_http_only_on_loopback() -> None:
    assert parse_image("ubuntu").api_host == "registry-1.docker.io"
    assert parse_image("nvcr.io/nvidia/driver:1").api_host == "nvcr.io"
    assert parse_image("127.0.0.1:5000/a:b").loopback
    assert parse_image("localhost:5000/a:b").loopback
    assert parse_image("[::1]:5000/a:b").loopback
    assert not parse_image("nvcr.io/a:b").loopback
    assert not parse_image("10.0.0.1:5000/a:b").loopback
    for bad in ("", "a b", "reg.io/:tag"):
        with pytest.raises(ValueError, match="not an image reference"):
            parse_image(bad)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_pull_secret_credentials_match_the_registry_host() -> None:
    config = {
        "auths": {
            "https://nvcr.io/v1/": {"auth": _b64("$oauthtoken:key")},
            "https://index.docker.io/v1/": {"username": "hub", "password": "pw"},
            "broken.io": {"auth": "!!"},
        }
    }
    auths = docker_auths(
        "kubernetes.io/dockerconfigjson", {".dockerconfigjson": _b64(json.dumps(config))}
    )
    legacy = docker_auths(
        "kubernetes.io/dockercfg",
        {".dockercfg": _b64(json.dumps({"reg.io:5000": {"auth": _b64("u:p")}}))},
    )
    assert credential_for("nvcr.io", [auths]) == Credential("$oauthtoken", "key")
    assert credential_for("docker.io", [auths]) == Credential("hub", "pw")
    assert credential_for("reg.io:5000", [auths, legacy]) == Credential("u", "p")
    assert credential_for("broken.io", [auths]) is None
    assert credential_for("other.io", [auths, legacy]) is None
    # Unreadable Secrets are no credentials (the kubelet pulls anonymously then).
    assert docker_auths("kubernetes.io/dockerconfigjson", {".dockerconfigjson": "%%"}) == {}
    assert docker_auths("kubernetes.io/dockerconfigjson", {}) == {}
    assert docker_auths("Opaque", {".dockercfg": _b64("[]")}) == {}


def test_challenges_are_parsed() -> None:
    bearer = parse_challenge('Bearer realm="https://auth.io/token",service="reg.io",scope="x"')
    assert bearer.scheme == "bearer"
    assert bearer.params == {"realm": "https://auth.io/token", "service": "reg.io", "scope": "x"}
    assert parse_challenge('Basic realm="r"').scheme == "basic"
    assert parse_challenge(None).scheme == ""


def test_a_missing_or_refused_image_holds_an_unreachable_one_per_mode() -> None:
    present = ImageCheck("r/a:1", Found.PRESENT)
    missing = ImageCheck("r/driver:2-ubuntu22.04", Found.MISSING, "manifest unknown")
    refused = ImageCheck("r/mgr:1", Found.DENIED, "HTTP 401")
    dark = ImageCheck("mirror/gds:1", Found.UNREACHABLE, "connection refused")
    assert not pool_verdict("p", [present], Mode.HOLD).held
    held = pool_verdict("p", [present, missing, refused], Mode.PROCEED)
    assert held.held
    assert "r/driver:2-ubuntu22.04 not found in its registry (manifest unknown)" in held.hold
    assert "r/mgr:1 refused" in held.hold
    assert "r/a:1" not in held.hold
    assert "pool p holds on its current driver" in held.hold
    assert pool_verdict("p", [present, dark], Mode.HOLD).held
    assert "registry unreachable" in pool_verdict("p", [dark], Mode.HOLD).hold
    open_ = pool_verdict("p", [present, dark], Mode.PROCEED)
    assert not open_.held
    assert open_.unchecked == (dark,)
    assert open_.retry  # asked again later, though it proceeds


def test_only_waiting_nodes_of_held_pools_are_held() -> None:
    held = pool_verdict("a", [ImageCheck("x", Found.MISSING)], Mode.HOLD)
    ok = pool_verdict("b", [ImageCheck("y", Found.PRESENT)], Mode.HOLD)
    got = held_nodes({"a": ["n1", "n2"], "b": ["n3"], "c": ["n4"]}, {"a": held, "b": ok})
    assert got == {"n1": held.hold, "n2": held.hold}


def test_the_record_holds_only_for_its_template_generation() -> None:
    held = pool_verdict("a", [ImageCheck("x", Found.MISSING)], Mode.HOLD)
    value = record(held, 7)
    assert value is not None
    assert recorded_hold({RECORD_ANNOTATION: value}, 7) == held.hold
    assert recorded_hold({RECORD_ANNOTATION: value}, 8) == ""
    assert recorded_hold({RECORD_ANNOTATION: "not json"}, 7) == ""
    assert recorded_hold({}, 7) == ""
    assert record(pool_verdict("a", [], Mode.HOLD), 7) is None


def test_pool_images_and_secrets_in_pod_order() -> None:
    spec = {
        "initContainers": [{"name": "mgr", "image": "r/mgr:1"}],
        "containers": [{"name": "d", "image": "r/driver:2"}, {"name": "x", "image": "r/mgr:1"}],
        "imagePullSecrets": [{"name": "one"}, {"name": "two"}, {}],
    }
    assert pool_images(spec) == ("r/mgr:1", "r/driver:2")
    assert pull_secret_names(spec) == ("one", "two")
    assert pool_images({}) == ()


# ------------------------------------------------------------ the operator unit


class _Rest:
    def __init__(self) -> None:
        self.patches: list[Obj] = []
        self.events: list[Obj] = []
        self.secret_reads = 0

    async def get(self, kind: Any, name: str, namespace: str | None = None) -> Obj | None:
        self.secret_reads += 1
        config = {"auths": {"reg.io": {"auth": _b64("u:p")}}}
        return {
            "metadata": {"name": name, "resourceVersion": "5"},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": _b64(json.dumps(config))},
        }

    async def merge_patch(self, kind: Any, name: str, patch: Obj, namespace: str) -> Obj:
        self.patches.append(patch)
        return patch

    async def create(self, kind: Any, body: Obj, namespace: str) -> Obj:
        self.events.append(body)
        return body


class _Registry:
    def __init__(self, missing: set[str]) -> None:
        self.missing = missing
        self.asked: list[tuple[str, Credential | None]] = []

    async def check_all(self, images: dict[str, Credential | None]) -> dict[str, ImageCheck]:
        self.asked += list(images.items())
        return {
            i: ImageCheck(i, Found.MISSING if i in self.missing else Found.PRESENT) for i in images
        }


class _Cache(dict[str, Obj]):
    pass


def _ds(generation: int, driver: str) -> Obj:
    return {
        "metadata": {"name": "drv", "generation": generation, "annotations": {}},
        "spec": {
            "template": {
                "spec": {
                    "initContainers": [{"image": "reg.io/mgr:1"}],
                    "containers": [{"image": driver}],
                    "imagePullSecrets": [{"name": "regcred"}],
                }
            }
        },
    }


def _node(name: str, state: str) -> Obj:
    return node(name, {STATE_LABEL: state})


async def test_the_unit_asks_only_when_a_wave_waits_and_remembers(tmp_path: Path) -> None:
    now = [100.0]
    rest = _Rest()
    cache = _Cache({"ns/drv": _ds(1, "reg.io/driver:2")})
    registry = _Registry(missing={"reg.io/driver:2"})
    unit = Preflight(
        rest,  # type: ignore[arg-type]
        "ns",
        cache,  # type: ignore[arg-type]
        lambda node: "drv",
        EventRecorder(rest),  # type: ignore[arg-type]
        Mode.HOLD,
        client=registry,  # type: ignore[arg-type]
        clock=lambda: now[0],
    )
    unit.retry = Backoff(base=30.0, cap=600.0, jitter=0.0)
    # No node waits for a slot: nothing is asked, not even the Secret.
    idle = await unit.hold([_node("n1", "upgrade-done")])
    assert idle.held == {}
    assert registry.asked == []
    assert rest.secret_reads == 0

    waiting = [_node("n1", "upgrade-required"), _node("n2", "cordon-required")]
    first = await unit.hold(waiting)
    assert set(first.held) == {"n1"}
    assert "reg.io/driver:2 not found" in first.held["n1"]
    assert first.requeue_after == 30.0
    assert registry.asked == [
        ("reg.io/mgr:1", Credential("u", "p")),
        ("reg.io/driver:2", Credential("u", "p")),
    ]
    assert len(rest.patches) == 1
    assert [e["reason"] for e in rest.events] == ["DriverUpgradePreflightHeld"]
    # Before the backoff is up the held pool is not asked again.
    now[0] += 10
    again = await unit.hold(waiting)
    assert again.held == first.held
    assert again.requeue_after == 20.0
    assert len(registry.asked) == 2
    # After it, only the image not found yet is asked; still missing: the wait doubles.
    now[0] += 20
    cache["ns/drv"]["metadata"]["annotations"] = rest.patches[0]["metadata"]["annotations"]
    third = await unit.hold(waiting)
    assert third.requeue_after == 60.0
    assert registry.asked[2:] == [("reg.io/driver:2", Credential("u", "p"))]
    assert len(rest.patches) == 1  # the same hold: no write, no Event
    assert len(rest.events) == 1
    # The tag appears: the pool proceeds, its record goes, and it is not asked again.
    registry.missing.clear()
    now[0] += 60
    passed = await unit.hold(waiting)
    assert passed.held == {}
    assert passed.requeue_after is None
    assert rest.patches[-1] == {"metadata": {"annotations": {RECORD_ANNOTATION: None}}}
    assert rest.events[-1]["reason"] == "DriverUpgradePreflightPassed"
    asked = len(registry.asked)
    await unit.hold(waiting)
    assert len(registry.asked) == asked
    # A new template is checked afresh; its unchanged images are remembered.
    cache["ns/drv"] = _ds(2, "reg.io/driver:3")
    await unit.hold(waiting)
    assert registry.asked[asked:] == [("reg.io/driver:3", Credential("u", "p"))]


async def test_off_asks_nothing() -> None:
    rest = _Rest()
    registry = _Registry(missing={"reg.io/driver:2"})
    unit = Preflight(
        rest,  # type: ignore[arg-type]
        "ns",
        _Cache({"ns/drv": _ds(1, "reg.io/driver:2")}),  # type: ignore[arg-type]
        lambda node: "drv",
        EventRecorder(rest),  # type: ignore[arg-type]
        Mode.OFF,
        client=registry,  # type: ignore[arg-type]
    )
    assert (await unit.hold([_node("n1", "upgrade-required")])).held == {}
    assert registry.asked == []
