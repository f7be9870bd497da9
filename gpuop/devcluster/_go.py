"""The Go toolchain as the binary builds drive it: find `go`, run it with a pinned
environment, build with a progress bar per compiled package, and turn its failures into
one-line `ClusterError`s (a version the module proxy lacks is named as such).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from gpuop.progress import Progress

from ._errors import ClusterError

MISSING_VERSION_MARKERS = (
    "unknown revision",
    "invalid version",
    "no matching versions",
    "not available",
    "404 Not Found",
)


def find_go() -> str:
    go = os.environ.get("GPUOP_GO") or shutil.which("go")
    if not go:
        raise ClusterError(
            "`go` was not found on PATH",
            "install Go 1.24 or newer (or set GPUOP_GO to its path) so the "
            "Kubernetes binaries can be built",
        )
    return go


def go_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"})
    env.update(extra or {})
    return env


def run_go(
    go: str, args: Sequence[str], cwd: Path, what: str, env: dict[str, str] | None = None
) -> str:
    proc = subprocess.run(
        [go, *args],
        cwd=cwd,
        env=env or go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise go_failure(what, proc.stderr or proc.stdout)
    return proc.stdout


def go_failure(what: str, output: str) -> ClusterError:
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    missing = next(
        (ln for ln in lines if any(marker in ln for marker in MISSING_VERSION_MARKERS)),
        None,
    )
    if missing:
        return ClusterError(
            f"{what} failed: {missing.strip()}",
            "that version does not exist on the Go module proxy; pick a released version "
            "(see GPUOP_KUBERNETES_VERSION / GPUOP_ETCD_VERSION / GPUOP_KWOK_VERSION)",
        )
    last = lines[-1].strip() if lines else "no output"
    return ClusterError(f"{what} failed: {last}", "see the go output above; rerun to retry")


def write_wrapper(directory: Path, module: str, go_mod_body: str, imports: Sequence[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "go.mod").write_text(f"module {module}\n\ngo 1.24\n\n{go_mod_body}")
    imported = "\n".join(f'\t_ "{imp}"' for imp in imports)
    (directory / "tools.go").write_text(
        f"//go:build tools\n\npackage tools\n\nimport (\n{imported}\n)\n"
    )


def count_packages(go: str, cwd: Path, packages: Sequence[str], env: dict[str, str]) -> int:
    out = run_go(
        go,
        # Standard-library packages count too: with a cold build cache they are
        # compiled as well (with a warm one the bar just finishes early).
        ["list", "-deps", "-f", "{{.ImportPath}}", *packages],
        cwd,
        "listing packages",
        env,
    )
    return max(1, sum(1 for ln in out.splitlines() if ln.strip()))


def go_build_with_progress(
    go: str, args: Sequence[str], cwd: Path, label: str, total: int, env: dict[str, str]
) -> None:
    """Run ``go build -v``/``go install -v``, advancing a bar per compiled package."""
    progress = Progress(label, total=total)
    proc = subprocess.Popen(
        [go, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    tail: list[str] = []
    for line in proc.stderr:
        line = line.rstrip()
        if not line:
            continue
        if re.fullmatch(r"[\w./~-]+", line):
            progress.advance(1, line.rsplit("/", 1)[-1])
        else:
            tail.append(line)
    code = proc.wait()
    if code != 0:
        progress.finish("failed")
        raise go_failure(label, "\n".join(tail))
    progress.finish("built")
