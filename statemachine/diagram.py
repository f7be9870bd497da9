"""Mermaid state diagrams generated from the machines' own definitions (docs only).

A throwaway `GraphMachine` is built per call from the same `MachineDef` the runtime
uses, so the picture in the docs cannot drift from the rulebook. Mermaid needs no
Graphviz; graph machines keep per-model graphs, which is why we never use one at run
time.
"""

from __future__ import annotations

import re
from typing import Any

from transitions.extensions import GraphMachine

from statemachine._fsm import MachineDef
from statemachine.rollout import ROLLOUT_DEFINITION
from statemachine.upgrade import UPGRADE_DEFINITION


class _Canvas:
    state: str
    get_graph: Any


def mermaid(definition: MachineDef, title: str | None = None) -> str:
    """Mermaid `stateDiagram-v2` text for one machine definition."""
    canvas = _Canvas()
    GraphMachine(
        model=canvas,
        states=definition.state_configs(),
        transitions=definition.transition_configs(),
        initial=definition.initial,
        auto_transitions=False,
        send_event=True,
        graph_engine="mermaid",
        show_conditions=True,
        title=title or definition.name,
    )
    text = canvas.get_graph().draw(None)
    assert isinstance(text, str)
    # Mermaid keywords are lower case; some renderers reject the "Class" spelling.
    text = text.replace("\n  Class ", "\n  class ")
    return _safe_ids(text, definition.state_names)


def _safe_ids(text: str, names: tuple[str, ...]) -> str:
    """Mermaid ids may not hold '-': use '_' in ids, keep the real name as the label."""
    hyphenated = sorted((n for n in names if "-" in n), key=len, reverse=True)
    if not hyphenated:
        return text
    pattern = re.compile(
        r"(?<![\w-])(" + "|".join(re.escape(n) for n in hyphenated) + r")(?![\w-])"
    )
    parts = text.split('"')
    for i in range(0, len(parts), 2):  # outside quotes only: labels keep their names
        parts[i] = pattern.sub(lambda m: m.group(1).replace("-", "_"), parts[i])
    return '"'.join(parts)


def upgrade_mermaid() -> str:
    return mermaid(UPGRADE_DEFINITION, "driver upgrade (per node)")


def rollout_mermaid() -> str:
    return mermaid(ROLLOUT_DEFINITION, "cluster rollout")


def diagrams_markdown() -> str:
    """Both diagrams as a Markdown section, for the docs command to write to a file."""
    parts = [
        "## Cluster rollout\n",
        "```mermaid\n" + rollout_mermaid().strip() + "\n```\n",
        "## Driver upgrade (per node)\n",
        "```mermaid\n" + upgrade_mermaid().strip() + "\n```\n",
    ]
    return "\n".join(parts)
