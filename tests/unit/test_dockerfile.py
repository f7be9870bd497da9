"""The Dockerfile's invariants, read from the file (no container engine needed):
multi-stage, slim base, the final stage runs as a fixed non-root user, holds no
build tools, starts the `gpuop` console script, and builds from a clean checkout
(every path it copies is tracked by git)."""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import json
import re
import subprocess
import tomllib
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


def test_the_image_leaves_the_development_wing_out() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    # after "!gpuop/", so it is excluded again; the one folder of gpuop left out
    assert lines.index("gpuop/devcluster/") > lines.index("!gpuop/")
    assert [ln for ln in lines if ln.startswith("gpuop/")] == ["gpuop/devcluster/"]
    _, stages = _stages()
    build_runs = " ".join(r for s in stages[:-1] for r in s.all("RUN"))
    assert 'find_spec("gpuop.devcluster") is not None' in build_runs


def _tracked() -> set[str]:
    """The files of a clean checkout: what git tracks (staged included)."""
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout
    return {p for p in out.split("\0") if p}


def _copied_sources() -> list[str]:
    """The build context paths the Dockerfile's COPY instructions read (not --from)."""
    _, stages = _stages()
    sources: list[str] = []
    for stage in stages:
        for args in stage.all("COPY"):
            parts = [p for p in args.split() if not p.startswith("--")]
            if any(p.startswith("--from=") for p in args.split()):
                continue
            sources.extend(p.rstrip("/") for p in parts[:-1])
    return sources


def test_every_path_the_dockerfile_copies_is_in_a_clean_checkout() -> None:
    """`docker build .` from a fresh clone: every COPY source is tracked by git (a file,
    or a folder with tracked files), the .dockerignore lets it in, and the package data
    pyproject.toml ships (the CRDs, components/data) is tracked too."""
    tracked = _tracked()
    sources = _copied_sources()
    assert {"pyproject.toml", "gpuop", "statemachine", "components", "crd"} <= set(sources)
    ignore = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    for source in sources:
        assert source in tracked or any(p.startswith(f"{source}/") for p in tracked), (
            f"COPY {source}: not in a clean checkout (git ls-files)"
        )
        assert f"!{source}" in ignore or f"!{source}/" in ignore, f"{source}: .dockerignored"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in packages:
        name = package.rstrip("*")
        assert name in sources, f"package {name} is not copied into the image"
        assert f"{name}/__init__.py" in tracked
    for package, globs in project["tool"]["setuptools"]["package-data"].items():
        for pattern in globs:
            matched = [p for p in tracked if fnmatch.fnmatch(p, f"{package}/{pattern}")]
            assert matched, f"package data {package}/{pattern}: nothing tracked"


def test_the_entrypoint_is_the_gpuop_console_script() -> None:
    """ENTRYPOINT ["gpuop"] is the console script pyproject.toml defines, whose target
    is tracked and is the CLI's main (the one tests and docs run)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    _, stages = _stages()
    (entrypoint,) = stages[-1].all("ENTRYPOINT")
    (script,) = json.loads(entrypoint)
    target = project["project"]["scripts"][script]
    module, _, attribute = target.partition(":")
    assert f"{module.replace('.', '/')}.py" in _tracked()
    cli = importlib.import_module(module)
    assert callable(getattr(cli, attribute))
    # The final stage puts the environment's bin (where pip installs the script) first.
    assert any("PATH=/opt/gpuop/bin:" in env for env in stages[-1].all("ENV"))
    # And the installed script here is the same entry point.
    (installed,) = [
        ep for ep in importlib.metadata.entry_points(group="console_scripts") if ep.name == script
    ]
    assert installed.value == target
