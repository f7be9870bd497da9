"""Our own protobuf schema for the few Pod fields the pods cache keeps.

Kubernetes serves Pods as protobuf (``application/vnd.kubernetes.protobuf``), the
encoding its own controllers read: decoding it is several times cheaper for the API
server than JSON (which it builds per watcher) and for us. A Pod is megabytes of
schema in ``k8s.io/api``; the cache reads a dozen fields (:class:`gpuop.operator.controller.
_pods.PodShape`). These messages list only those fields, under the field numbers of
``k8s.io/api/core/v1/generated.proto`` and ``apimachinery/pkg/apis/meta/v1`` and
``pkg/runtime`` (API facts, stable across releases); every other field of the wire
(managedFields, the pod spec's volumes...) is an unknown field the decoder skips.
The descriptors are built here, not generated, so nothing is copied from elsewhere;
decoding is protobuf's C (upb) backend.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _BYTES, _INT32, _INT64, _MESSAGE = (
    _F.TYPE_STRING,
    _F.TYPE_BYTES,
    _F.TYPE_INT32,
    _F.TYPE_INT64,
    _F.TYPE_MESSAGE,
)
_PACKAGE = "gpuop.k8s"

#: message -> (field name, number, type, message type or None, repeated)
_Field = tuple[str, int, int, str | None, bool]
_MESSAGES: dict[str, list[_Field]] = {
    # k8s.io/apimachinery/pkg/runtime
    "TypeMeta": [("apiVersion", 1, _STRING, None, False), ("kind", 2, _STRING, None, False)],
    "Unknown": [
        ("typeMeta", 1, _MESSAGE, "TypeMeta", False),
        ("raw", 2, _BYTES, None, False),
        ("contentEncoding", 3, _STRING, None, False),
        ("contentType", 4, _STRING, None, False),
    ],
    "RawExtension": [("raw", 1, _BYTES, None, False)],
    # k8s.io/apimachinery/pkg/apis/meta/v1
    "WatchEvent": [
        ("type", 1, _STRING, None, False),
        ("object", 2, _MESSAGE, "RawExtension", False),
    ],
    "Time": [("seconds", 1, _INT64, None, False), ("nanos", 2, _INT32, None, False)],
    "ListMeta": [
        ("resourceVersion", 2, _STRING, None, False),
        ("continue", 3, _STRING, None, False),
    ],
    "Status": [
        ("status", 2, _STRING, None, False),
        ("message", 3, _STRING, None, False),
        ("reason", 4, _STRING, None, False),
        ("code", 6, _INT32, None, False),
    ],
    "ObjectMeta": [
        ("name", 1, _STRING, None, False),
        ("namespace", 3, _STRING, None, False),
        ("uid", 5, _STRING, None, False),
        ("resourceVersion", 6, _STRING, None, False),
        ("creationTimestamp", 8, _MESSAGE, "Time", False),
        ("deletionTimestamp", 9, _MESSAGE, "Time", False),
        ("labels", 11, _MESSAGE, "ObjectMeta.LabelsEntry", True),
    ],
    # k8s.io/api/core/v1
    "EnvVar": [("name", 1, _STRING, None, False), ("value", 2, _STRING, None, False)],
    "Container": [("env", 7, _MESSAGE, "EnvVar", True)],
    "PodSpec": [
        ("containers", 2, _MESSAGE, "Container", True),
        ("nodeName", 10, _STRING, None, False),
    ],
    "PodCondition": [("type", 1, _STRING, None, False), ("status", 2, _STRING, None, False)],
    "ContainerStateWaiting": [("reason", 1, _STRING, None, False)],
    "ContainerState": [("waiting", 1, _MESSAGE, "ContainerStateWaiting", False)],
    "ContainerStatus": [
        ("state", 2, _MESSAGE, "ContainerState", False),
        ("restartCount", 5, _INT32, None, False),
    ],
    "PodStatus": [
        ("phase", 1, _STRING, None, False),
        ("conditions", 2, _MESSAGE, "PodCondition", True),
        ("containerStatuses", 8, _MESSAGE, "ContainerStatus", True),
    ],
    "Pod": [
        ("metadata", 1, _MESSAGE, "ObjectMeta", False),
        ("spec", 2, _MESSAGE, "PodSpec", False),
        ("status", 3, _MESSAGE, "PodStatus", False),
    ],
    "PodList": [
        ("metadata", 1, _MESSAGE, "ListMeta", False),
        ("items", 2, _MESSAGE, "Pod", True),
    ],
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="gpuop/k8s_pod_subset.proto", package=_PACKAGE, syntax="proto2"
    )
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field_name, number, kind, type_name, repeated in fields:
            message.field.add(
                name=field_name,
                number=number,
                type=kind,
                type_name=f".{_PACKAGE}.{type_name}" if type_name else None,
                label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
            )
        if name == "ObjectMeta":  # map<string, string> labels: an entry message
            entry = message.nested_type.add(name="LabelsEntry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=_STRING, label=_F.LABEL_OPTIONAL)
            entry.field.add(name="value", number=2, type=_STRING, label=_F.LABEL_OPTIONAL)
    return proto


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in _MESSAGES
    }


_CLASSES = _classes()
Unknown: Any = _CLASSES["Unknown"]
WatchEvent: Any = _CLASSES["WatchEvent"]
Status: Any = _CLASSES["Status"]
Pod: Any = _CLASSES["Pod"]
PodList: Any = _CLASSES["PodList"]
