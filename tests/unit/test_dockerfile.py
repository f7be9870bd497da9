"""The Dockerfile's invariants, read from the file (no container engine needed):
multi-stage, slim base, the final stage runs as a fixed non-root user, holds no
build tools, and starts `gpuop`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|make|build-essential|apt-get|apk|cargo|rustc)\b")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    result = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        result.append((keyword.upper(), args.strip()))
    return result


def _stages() -> tuple[dict[str, str], list[Stage]]:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, rest in _instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages and keyword == "ARG":
            key, _, value = rest.partition("=")
            args[key] = value
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


def test_multi_stage_from_a_slim_python_base() -> None:
    _, stages = _stages()
    assert len(stages) >= 2
    for stage in stages:
        assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", stage.base), stage.base
    final = stages[-1]
    copies = final.all("COPY")
    assert any(c.startswith("--from=") for c in copies), "the final stage copies the build's result"
    # The sources never reach the final stage, only the built environment.
    assert all(c.startswith("--from=") for c in copies)


def test_final_stage_runs_as_a_fixed_non_root_user() -> None:
    _, stages = _stages()
    users = stages[-1].all("USER")
    assert users, "no USER in the final stage"
    user = users[-1].split(":")[0]
    assert user.isdigit(), "numeric, so runAsNonRoot can verify it"
    assert int(user) != 0
    assert user == "65532"  # the chart's runAsUser


def test_no_build_tools_in_the_final_stage() -> None:
    _, stages = _stages()
    for command in stages[-1].all("RUN"):
        assert not BUILD_TOOLS.search(command), command
    # pip is removed from the environment the final stage copies.
    build_runs = " ".join(r for s in stages[:-1] for r in s.all("RUN"))
    assert "pip uninstall -y pip" in build_runs
    assert "--only-binary=:all:" in build_runs


def test_entrypoint_is_gpuop_and_version_is_baked_in() -> None:
    _, stages = _stages()
    final = stages[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["gpuop"]
    assert json.loads(final.all("CMD")[-1]) == ["run"]
    build_runs = " ".join(r for s in stages[:-1] for r in s.all("RUN"))
    assert "gpuop version" in build_runs  # the installed metadata answers it
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    assert f"VERSION={version.group(1)}" in final.all("ARG")


def test_dockerignore_keeps_the_context_to_the_packages() -> None:
    lines = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*"
    assert {"!gpuop/", "!statemachine/", "!components/", "!crd/", "!pyproject.toml"} <= set(lines)


def test_the_image_leaves_the_simulator_and_nvml_fake_out() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    # after "!gpuop/", so they are excluded again
    assert lines.index("gpuop/cluster/") > lines.index("!gpuop/")
    assert lines.index("gpuop/nvml/fake.py") > lines.index("!gpuop/")
    _, stages = _stages()
    build_runs = " ".join(r for s in stages[:-1] for r in s.all("RUN"))
    assert "find_spec" in build_runs
    assert '"gpuop.cluster", "gpuop.nvml.fake"' in build_runs
