"""How the GPUCluster controller marks what it applies (the owner reference, shared
with the conformance test so both sides compare the same objects), and what other
passes may ask of it."""

from __future__ import annotations

from typing import Protocol

from crd import GC_API_VERSION, GC_KIND
from gpuop.kube.informer import Obj


class GPUClusterPresence(Protocol):
    """Whether a GPUCluster exists, as the node pass asks it (the GPUCluster pass is
    another pass: named here, never imported, so the passes stay independent)."""

    def knows_whether_one_exists(self) -> bool: ...
    def active(self) -> bool: ...


def gpucluster_owner(meta: Obj) -> Obj:
    """A controller reference to the GPUCluster with ``meta``. As upstream's, it blocks
    the owner's foreground deletion until the object is gone (the operator may set it:
    it holds update on gpuclusters/finalizers)."""
    return {
        "apiVersion": GC_API_VERSION,
        "kind": GC_KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def gpucluster_owned(obj: Obj) -> bool:
    """Whether a GPUCluster controls ``obj``: the ClusterPolicy's prune leaves it to
    garbage collection (the NVIDIADriver accounts applied beside a GPUCluster)."""
    return any(
        ref.get("kind") == GC_KIND and ref.get("controller")
        for ref in obj["metadata"].get("ownerReferences") or ()
    )
