"""Diagrams come from the machines' own definitions and name every state and trigger."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from statemachine.diagram import (
    diagrams_markdown,
    machine_definitions,
    mermaid,
    rollout_mermaid,
    upgrade_mermaid,
)
from statemachine.rollout import ROLLOUT_DEFINITION, ROLLOUT_STATES
from statemachine.upgrade import UPGRADE_DEFINITION
from statemachine.upgrade_keys import UpgradeState


def test_upgrade_diagram_names_every_state_and_trigger() -> None:
    text = upgrade_mermaid()
    assert "stateDiagram-v2" in text
    for state in UpgradeState:
        assert f'state "{state.value}" as {state.value.replace("-", "_")}' in text
    for trigger in UPGRADE_DEFINITION.triggers:
        assert f": {trigger} [" in text or f"| {trigger} [" in text, trigger
    assert "upgrade_required --> cordon_required: start [cordon_slot]" in text
    assert "drain_required --> upgrade_failed: drain_failed [drain_failed]" in text
    assert ("| pod_deletion_failed [pod_deletion_falls_back_to_drain]") in text
    assert "[*] --> unknown" in text


def test_rollout_diagram_names_every_state() -> None:
    text = rollout_mermaid()
    for state in ROLLOUT_STATES:
        assert f'state "{state}" as {state.replace("-", "_")}' in text
    assert "pre_requisites --> operator_metrics: advance [settled_up_to_here]" in text
    assert "ready --> driver: rewind [first_unsettled_is_driver]" in text
    assert set(ROLLOUT_DEFINITION.triggers) == {"rewind", "advance"}


@pytest.mark.parametrize("text", [upgrade_mermaid(), rollout_mermaid()])
def test_mermaid_ids_hold_no_hyphens(text: str) -> None:
    for line in text.splitlines():
        line = re.sub(r'"[^"]*"', '""', line)  # labels may
        edge = re.match(r"\s*(\S+) --> (\S+):", line)
        if edge:
            assert "-" not in edge.group(1), line
            assert "-" not in edge.group(2), line
        assert not line.strip().startswith("Class "), line


def test_diagrams_are_deterministic_and_fenced() -> None:
    doc = diagrams_markdown()
    assert doc == diagrams_markdown()
    definitions = machine_definitions()
    assert UPGRADE_DEFINITION in definitions
    assert doc.count("```mermaid") == len(definitions) >= 2
    assert mermaid(UPGRADE_DEFINITION).strip() in doc


def test_checked_in_diagrams_are_current() -> None:
    """docs/state-machines.md is what `gpuop diagrams` prints now; regenerate with
    `gpuop diagrams > docs/state-machines.md` after changing a machine."""
    path = Path(__file__).resolve().parents[2] / "docs" / "state-machines.md"
    assert path.read_text() == diagrams_markdown()
