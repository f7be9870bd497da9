"""Objects the API server refuses: which answers count as refusals, the message the
status carries, the retry schedule, and when an Event is due."""

from __future__ import annotations

import json

import pytest

from gpuop.operator.controller.views.refusals import (
    REFUSAL_RETRY_CAP,
    Refusal,
    is_refusal,
    refusal_delay,
    refusals_message,
    server_message,
)
from gpuop.operator.controller.writers.policy_status import _new_error


@pytest.mark.parametrize(
    ("code", "refused"),
    [
        (400, True),
        (403, True),
        (404, True),
        (422, True),
        (408, False),
        (409, False),
        (429, False),
        (500, False),
        (503, False),
        (None, False),
    ],
)
def test_only_client_errors_that_would_repeat_are_refusals(code: int | None, refused: bool) -> None:
    assert is_refusal(code) is refused


def test_server_message_reads_the_status_body_else_keeps_the_text() -> None:
    body = {
        "kind": "Status",
        "status": "Failure",
        "message": 'RuntimeClass.node.k8s.io "NVIDIA_Runtime" is invalid',
        "code": 422,
    }
    assert server_message(json.dumps(body)) == body["message"]
    assert server_message("plain text") == "plain text"
    assert server_message(None) == ""
    assert len(server_message("x" * 5000)) == 1000


def _refusal(name: str, namespace: str | None = "gpu-operator") -> Refusal:
    return Refusal("DaemonSet", namespace, name, 422, "spec: Invalid value", "h", 1, 0.0)


def test_message_names_every_refused_object_with_the_servers_words() -> None:
    message = refusals_message([_refusal("a"), _refusal("rc", namespace=None)])
    assert message == (
        "DaemonSet gpu-operator/a refused by the API server (422): spec: Invalid value; "
        "DaemonSet rc refused by the API server (422): spec: Invalid value"
    )
    assert len(refusals_message([_refusal("a" * 300)] * 50)) == 4000


def test_retry_delay_doubles_and_is_capped() -> None:
    assert [refusal_delay(n, base=10) for n in (1, 2, 3)] == [10, 20, 40]
    assert refusal_delay(30, base=10) == REFUSAL_RETRY_CAP


def _status(error: tuple[str, str] | None) -> dict[str, object]:
    conditions = [{"type": "Ready", "status": "False", "reason": "OperandNotReady"}]
    if error is not None:
        conditions.append(
            {"type": "Error", "status": "True", "reason": error[0], "message": error[1]}
        )
    return {"state": "notReady", "conditions": conditions}


def test_an_event_is_due_for_each_new_error_only() -> None:
    refused = ("ReconcileFailed", "DaemonSet x refused")
    assert _new_error(_status(None), _status(refused))
    assert not _new_error(_status(refused), _status(refused))
    assert _new_error(_status(refused), _status(("ReconcileFailed", "DaemonSet y refused")))
    assert not _new_error(_status(refused), _status(None))
