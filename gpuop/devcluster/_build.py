"""Build the control-plane binaries from the Go module proxy, once, into the cache.

``go install pkg@version`` is refused for k8s.io/kubernetes and etcd's server
because their go.mod files carry ``replace`` lines, so each is built from a tiny
generated wrapper module that requires the release and pins what it replaces.
kwok has no replace lines and is installed directly. Every build lands in a
temporary directory and is renamed into place only when complete, so an
interrupted build never leaves a half-filled cache entry.
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ._errors import ClusterError
from ._go import (
    count_packages,
    find_go,
    go_build_with_progress,
    go_env,
    go_failure,
    run_go,
    write_wrapper,
)
from ._versions import (
    KUBE_COMMANDS,
    BinaryPaths,
    Versions,
    cache_dir,
    helm_path,
    helm_version,
    prometheus_path,
    prometheus_version,
    promtool_path,
    promtool_version,
)

_STAMP = ".complete"
_STAGING_REPLACE = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", re.MULTILINE)


def ensure_binaries(versions: Versions | None = None, root: Path | None = None) -> BinaryPaths:
    """Return the cached binaries, building whatever is missing first."""
    versions = versions or Versions.from_env()
    root = root or cache_dir()
    paths = BinaryPaths.under(root, versions)
    if all(p.is_file() for p in paths.all()) and _all_stamped(paths):
        return paths
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root):
        go = find_go()
        if not _stamped(paths.etcd.parent):
            _build_etcd(go, root, versions.etcd, paths.etcd.parent)
        if not _stamped(paths.kube_apiserver.parent):
            _build_kubernetes(go, root, versions.kubernetes, paths.kube_apiserver.parent)
        if not _stamped(paths.kwok.parent):
            _build_kwok(go, root, versions.kwok, paths.kwok.parent)
    return paths


def ensure_helm(version: str | None = None, root: Path | None = None) -> Path:
    """Return the cached Helm binary (the chart tests need it), building it if missing."""
    version = version or helm_version()
    root = root or cache_dir()
    return _ensure_tool(helm_path(root, version), root, version, _build_helm)


def ensure_promtool(version: str | None = None, root: Path | None = None) -> Path:
    """Return the cached promtool (the alert rule tests run it), building it if missing."""
    version = version or promtool_version()
    root = root or cache_dir()
    return _ensure_tool(promtool_path(root, version), root, version, _build_promtool)


def ensure_prometheus(version: str | None = None, root: Path | None = None) -> Path:
    """Return the cached Prometheus server (the alert integration test runs it against
    the local cluster), building it if missing."""
    version = version or prometheus_version()
    root = root or cache_dir()
    return _ensure_tool(prometheus_path(root, version), root, version, _build_prometheus)


def _ensure_tool(
    path: Path, root: Path, version: str, build: Callable[[str, Path, str, Path], None]
) -> Path:
    """A single-binary tool at `path`: returned when its stamp says it is complete, else
    built under the cache lock (another process may have built it meanwhile)."""
    if path.is_file() and _stamped(path.parent):
        return path
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root):
        if not _stamped(path.parent):
            build(find_go(), root, version, path.parent)
    return path


def _all_stamped(paths: BinaryPaths) -> bool:
    return all(_stamped(p.parent) for p in paths.all())


def _stamped(directory: Path) -> bool:
    return (directory / _STAMP).is_file()


@contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    """Serialise builds between concurrent runs (two test sessions, say)."""
    with (root / "build.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _install(tmp: Path, final: Path, stamp: str) -> None:
    (tmp / _STAMP).write_text(stamp)
    if final.exists():
        shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(final)


def _staging_modules(go: str, version: str, cwd: Path) -> list[str]:
    """Read the staging modules that release's go.mod replaces with local paths."""
    out = run_go(
        go, ["mod", "download", "-json", f"k8s.io/kubernetes@{version}"], cwd, "kubernetes download"
    )
    info = json.loads(out)
    if info.get("Error"):
        raise go_failure(f"Kubernetes {version}", str(info["Error"]))
    go_mod = Path(str(info["GoMod"])).read_text()
    return sorted(set(_STAGING_REPLACE.findall(go_mod)))


def _minor(version: str) -> tuple[str, str]:
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", version)
    if not match:
        raise ClusterError(
            f"Kubernetes version {version!r} is not of the form v1.X.Y",
            "set GPUOP_KUBERNETES_VERSION to a release such as v1.34.4",
        )
    return match.group(1), match.group(2)


def _build_wrapped(
    go: str,
    root: Path,
    name: str,
    version: str,
    requires: str,
    packages: Sequence[str],
    final: Path,
    ldflags: str = "-s -w",
    binary: str | None = None,
    also: Callable[[Path, Path, dict[str, str]], None] | None = None,
    tags: Sequence[str] = (),
) -> None:
    """Generate a wrapper module, resolve it, and build ``packages`` into ``final``.

    ``also(src, out_dir, env)`` may add files to the entry before it is installed;
    ``tags`` are Go build tags, for the listing as well as the build.
    """
    src = root / "src" / f"{name}-{version}"
    print(f"gpuop: building {name} {version} into {final} (cache: {root})", flush=True)
    write_wrapper(src, f"gpuop.local/{name}build", requires, packages)
    env = go_env()
    if tags:
        env["GOFLAGS"] = f"{env['GOFLAGS']} -tags={','.join(tags)}"
    run_go(go, ["mod", "tidy"], src, f"resolving {name} {version}", env)
    total = count_packages(go, src, packages, env)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    try:
        # With several main packages, -o names a directory; with one, a file.
        out = f"{tmp}/" if binary is None else str(tmp / binary)
        go_build_with_progress(
            go,
            ["build", "-v", "-trimpath", "-ldflags", ldflags, "-o", out, *packages],
            src,
            f"{name} {version}",
            total,
            env,
        )
        if also is not None:
            also(src, tmp, env)
        _install(tmp, final, version)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build_kubernetes(go: str, root: Path, version: str, final: Path) -> None:
    major, minor = _minor(version)
    staging_version = f"v0.{minor}.{version.rsplit('.', 1)[1]}"
    probe = root / "src"
    probe.mkdir(parents=True, exist_ok=True)
    staging = _staging_modules(go, version, probe)
    replaces = "\n".join(f"\t{m} => {m} {staging_version}" for m in staging)
    ldflags = " ".join(
        [
            "-s -w",
            f"-X k8s.io/component-base/version.gitVersion={version}",
            f"-X k8s.io/component-base/version.gitMajor={major}",
            f"-X k8s.io/component-base/version.gitMinor={minor}",
            "-X k8s.io/component-base/version.gitTreeState=clean",
        ]
    )
    _build_wrapped(
        go,
        root,
        "kubernetes",
        version,
        f"require k8s.io/kubernetes {version}\n\nreplace (\n{replaces}\n)\n",
        [f"k8s.io/kubernetes/cmd/{c}" for c in KUBE_COMMANDS],
        final,
        ldflags,
    )


def _build_etcd(go: str, root: Path, version: str, final: Path) -> None:
    pkg = "go.etcd.io/etcd/server/v3"
    # The server's main package is the module root, so name the binary explicitly.
    _build_wrapped(
        go, root, "etcd", version, f"require {pkg} {version}\n", [pkg], final, binary="etcd"
    )


#: kwok's own "fast" lifecycle: nodes become Ready and keep a lease heartbeat,
#: pods become Running and Ready at once, complete and delete promptly.
KWOK_STAGE_FILES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
KWOK_STAGES = "stages.yaml"


def _build_kwok(go: str, root: Path, version: str, final: Path) -> None:
    pkg = "sigs.k8s.io/kwok/cmd/kwok"

    def stages(src: Path, out: Path, env: dict[str, str]) -> None:
        # kwok runs nothing without Stage objects; take the release's own from
        # the module source the build just downloaded, so they match the binary.
        module_dir = Path(
            run_go(
                go, ["list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"], src, "kwok", env
            ).strip()
        )
        docs = [(module_dir / rel).read_text().strip() for rel in KWOK_STAGE_FILES]
        (out / KWOK_STAGES).write_text("\n---\n".join(docs) + "\n")

    _build_wrapped(
        go,
        root,
        "kwok",
        version,
        f"require sigs.k8s.io/kwok {version}\n",
        [pkg],
        final,
        binary="kwok",
        also=stages,
    )


def _helm_kube_minor(go: str, version: str, cwd: Path) -> str:
    """The Kubernetes minor Helm's client libraries speak, read from its go.mod
    (client-go v0.X.Y is Kubernetes 1.X), as Helm's Makefile derives it."""
    out = run_go(
        go, ["mod", "download", "-json", f"helm.sh/helm/v3@{version}"], cwd, "helm download"
    )
    info = json.loads(out)
    if info.get("Error"):
        raise go_failure(f"helm {version}", str(info["Error"]))
    go_mod = Path(str(info["GoMod"])).read_text()
    match = re.search(r"^\s*k8s\.io/client-go\s+v0\.(\d+)\.", go_mod, re.MULTILINE)
    if not match:
        raise ClusterError(
            f"helm {version}: its go.mod names no k8s.io/client-go release",
            "set GPUOP_HELM_VERSION to a Helm 3 release such as v3.19.5",
        )
    return match.group(1)


def _build_helm(go: str, root: Path, version: str, final: Path) -> None:
    pkg = "helm.sh/helm/v3/cmd/helm"
    probe = root / "src"
    probe.mkdir(parents=True, exist_ok=True)
    minor = _helm_kube_minor(go, version, probe)
    # What Helm's own Makefile stamps in: its version (for `helm version`) and the
    # Kubernetes release its client libraries speak (the default .Capabilities.KubeVersion
    # of `helm template`, and the release `helm lint` checks deprecations against).
    ldflags = " ".join(
        [
            "-s -w",
            f"-X helm.sh/helm/v3/internal/version.version={version}",
            "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
            *(
                f"-X helm.sh/helm/v3/pkg/{pkg_name}.k8sVersion{part}={value}"
                for pkg_name in ("chartutil", "lint/rules")
                for part, value in (("Major", "1"), ("Minor", minor))
            ),
        ]
    )
    _build_wrapped(
        go,
        root,
        "helm",
        version,
        f"require helm.sh/helm/v3 {version}\n",
        [pkg],
        final,
        ldflags,
        binary="helm",
    )


def _build_promtool(go: str, root: Path, version: str, final: Path) -> None:
    # Prometheus's go.mod has no replace lines; the wrapper only pins the release.
    _build_wrapped(
        go,
        root,
        "promtool",
        version,
        f"require github.com/prometheus/prometheus {version}\n",
        ["github.com/prometheus/prometheus/cmd/promtool"],
        final,
        binary="promtool",
    )


#: Build tags for the Prometheus server: only the file and HTTP service discoveries
#: (the test scrapes static targets; the cloud SDKs would triple the build), and no
#: ``builtinassets``: the web UI's compiled assets are not in the module, and the API
#: the tests read needs none of them.
PROMETHEUS_TAGS = ("remove_all_sd",)


def _build_prometheus(go: str, root: Path, version: str, final: Path) -> None:
    _build_wrapped(
        go,
        root,
        "prometheus",
        version,
        f"require github.com/prometheus/prometheus {version}\n",
        ["github.com/prometheus/prometheus/cmd/prometheus"],
        final,
        binary="prometheus",
        tags=PROMETHEUS_TAGS,
    )
