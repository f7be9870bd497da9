"""Build the OCI distribution registry the pre-flight tests run, once, into the cache.

The release's own ``cmd/registry`` links every cloud storage driver (AWS, Azure, GCS
SDKs); the tests need the in-memory store and token auth only, so a tiny generated
``main`` imports just those and runs the release's command (``registry serve CONFIG``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ._build import _ensure_tool, _install
from ._go import count_packages, go_build_with_progress, go_env, run_go
from ._versions import cache_dir

#: github.com/distribution/distribution/v3: its go.mod has no replace lines.
REGISTRY_VERSION = "v3.1.2"
_MODULE = "github.com/distribution/distribution/v3"
#: What the generated main links: the server, token and htpasswd auth, two stores.
REGISTRY_IMPORTS = (
    f"{_MODULE}/registry/auth/htpasswd",
    f"{_MODULE}/registry/auth/token",
    f"{_MODULE}/registry/storage/driver/filesystem",
    f"{_MODULE}/registry/storage/driver/inmemory",
)


def registry_version() -> str:
    """``$GPUOP_REGISTRY_VERSION``, else the pinned distribution release."""
    return os.environ.get("GPUOP_REGISTRY_VERSION", REGISTRY_VERSION)


def registry_path(root: Path, version: str) -> Path:
    """Where the registry binary of ``version`` is cached under ``root``."""
    return root / "bin" / f"registry-{version}" / "registry"


def ensure_registry(version: str | None = None, root: Path | None = None) -> Path:
    """Return the cached registry (the pre-flight integration tests run it), building it
    if missing."""
    version = version or registry_version()
    root = root or cache_dir()
    return _ensure_tool(registry_path(root, version), root, version, _build_registry)


def main_source() -> str:
    """The generated ``main``: the release's command over only the drivers listed."""
    imported = "\n".join(f'\t_ "{imp}"' for imp in REGISTRY_IMPORTS)
    return (
        "package main\n\nimport (\n"
        f'\t"{_MODULE}/registry"\n{imported}\n)\n\n'
        "func main() {\n\t_ = registry.RootCmd.Execute()\n}\n"
    )


def _build_registry(go: str, root: Path, version: str, final: Path) -> None:
    src = root / "src" / f"registry-{version}"
    print(f"gpuop: building registry {version} into {final} (cache: {root})", flush=True)
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text(
        f"module gpuop.local/registrybuild\n\ngo 1.24\n\nrequire {_MODULE} {version}\n"
    )
    (src / "main.go").write_text(main_source())
    env = go_env()
    run_go(go, ["mod", "tidy"], src, f"resolving registry {version}", env)
    total = count_packages(go, src, ["."], env)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".registry-", dir=final.parent))
    try:
        go_build_with_progress(
            go,
            ["build", "-v", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp / "registry"), "."],
            src,
            f"registry {version}",
            total,
            env,
        )
        _install(tmp, final, version)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
