"""The applied-hash annotation: stable for equal content, different for any change."""

from __future__ import annotations

import copy

import components as c
import crd
from components import HASH_ANNOTATION, manifest_hash, needs_apply, with_hash

CTX = c.RenderContext(namespace="gpu-operator", operator_image="gpuop:1")


def driver_ds(spec: crd.ClusterPolicySpec) -> c.Manifest:
    (ds,) = [
        o for o in c.component_by_name("driver").objects(spec, CTX) if o["kind"] == "DaemonSet"
    ]
    return ds


def test_hash_is_stable_and_short() -> None:
    obj = driver_ds(crd.ClusterPolicySpec())
    again = driver_ds(crd.ClusterPolicySpec())
    assert manifest_hash(obj) == manifest_hash(again)
    assert len(manifest_hash(obj)) == 16
    int(manifest_hash(obj), 16)


def test_hash_ignores_key_order_status_and_itself() -> None:
    a = {"kind": "X", "metadata": {"name": "n", "labels": {"a": "1", "b": "2"}}}
    b = {"metadata": {"labels": {"b": "2", "a": "1"}, "name": "n"}, "kind": "X"}
    assert manifest_hash(a) == manifest_hash(b)
    assert manifest_hash({**a, "status": {"x": 1}}) == manifest_hash(a)
    assert manifest_hash(with_hash(a)) == manifest_hash(a)
    assert with_hash(with_hash(a)) == with_hash(a)


def test_with_hash_copies_and_keeps_annotations() -> None:
    obj = {"kind": "X", "metadata": {"name": "n", "annotations": {"keep": "me"}}}
    original = copy.deepcopy(obj)
    hashed = with_hash(obj)
    assert obj == original
    assert hashed["metadata"]["annotations"]["keep"] == "me"
    assert hashed["metadata"]["annotations"][HASH_ANNOTATION] == manifest_hash(obj)


def test_needs_apply() -> None:
    desired = with_hash(driver_ds(crd.ClusterPolicySpec()))
    assert needs_apply(desired, None)
    # The API server adds defaults, status and metadata: still no write needed.
    observed = copy.deepcopy(desired)
    observed["metadata"].update({"uid": "u", "resourceVersion": "7", "generation": 3})
    observed["spec"]["revisionHistoryLimit"] = 10
    observed["status"] = {"desiredNumberScheduled": 3}
    assert not needs_apply(desired, observed)
    assert not needs_apply(driver_ds(crd.ClusterPolicySpec()), observed)  # bare desired too
    # An object someone else made (no annotation) is taken over.
    del observed["metadata"]["annotations"][HASH_ANNOTATION]
    assert needs_apply(desired, observed)


def test_any_desired_change_needs_apply() -> None:
    old = with_hash(driver_ds(crd.ClusterPolicySpec()))
    new_spec = crd.ClusterPolicySpec.model_validate({"driver": {"version": "570.1"}})
    assert needs_apply(with_hash(driver_ds(new_spec)), old)
    relabelled = c.component_by_name("driver").objects(
        crd.ClusterPolicySpec(),
        c.RenderContext(
            namespace="gpu-operator", operator_image="gpuop:1", extra_labels={"a": "b"}
        ),
    )[1]
    assert needs_apply(with_hash(relabelled), old)


def test_whole_policy_is_stable_across_renders() -> None:
    spec = crd.ClusterPolicySpec.model_validate({"dcgm": {"enabled": True}})
    first = {
        name: [manifest_hash(o) for o in objs]
        for name, objs in c.desired_objects(spec, CTX).items()
    }
    second = {
        name: [manifest_hash(o) for o in objs]
        for name, objs in c.desired_objects(spec, CTX).items()
    }
    assert first == second


def test_objects_applied_under_the_old_domain_are_not_rewritten() -> None:
    """Releases before the single `gpuop.io/` domain stored the hash under `gpuop.dev/`:
    an object they applied with the same content needs no write; a changed one does, and
    the new spelling replaces the old."""
    from components.hashing import LEGACY_HASH_ANNOTATION

    desired = driver_ds(crd.ClusterPolicySpec())
    written = with_hash(desired)
    assert HASH_ANNOTATION == "gpuop.io/applied-hash"
    annotations = written["metadata"]["annotations"]
    old = copy.deepcopy(written)
    old["metadata"]["annotations"] = {
        **{k: v for k, v in annotations.items() if k != HASH_ANNOTATION},
        LEGACY_HASH_ANNOTATION: annotations[HASH_ANNOTATION],
    }
    assert not needs_apply(desired, old)
    changed = driver_ds(crd.ClusterPolicySpec.model_validate({"driver": {"version": "1.2.3"}}))
    assert needs_apply(changed, old)
    assert LEGACY_HASH_ANNOTATION not in with_hash(changed)["metadata"]["annotations"]
