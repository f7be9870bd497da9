"""Pure helpers of the binary build: error classification and version parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.devcluster import BinaryPaths, ClusterError, Versions, cache_dir
from gpuop.devcluster._build import _STAGING_REPLACE, _minor
from gpuop.devcluster._go import go_failure


def test_missing_version_is_named_as_such() -> None:
    err = go_failure(
        "kubernetes v1.34.99",
        "go: k8s.io/kubernetes@v1.34.99: reading proxy: 404 Not Found\n"
        "\tserver response: not found: unknown revision v1.34.99",
    )
    assert "does not exist on the Go module proxy" in str(err)
    assert "v1.34.99" in str(err)


def test_other_failures_quote_the_last_line() -> None:
    err = go_failure("etcd v3.5.35", "# pkg\n./x.go:1: undefined: y\n")
    assert str(err).startswith("etcd v3.5.35 failed: ./x.go:1: undefined: y")


def test_staging_replace_lines_are_found() -> None:
    go_mod = (
        "replace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n"
        "\tk8s.io/client-go => ./staging/src/k8s.io/client-go\n"
        "\tgithub.com/x/y => github.com/x/y v1.0.0\n)\n"
    )
    assert _STAGING_REPLACE.findall(go_mod) == ["k8s.io/api", "k8s.io/client-go"]


def test_minor_parsing() -> None:
    assert _minor("v1.34.4") == ("1", "34")
    with pytest.raises(ClusterError, match=r"v1\.X\.Y"):
        _minor("1.34")


def test_cache_dir_and_versions_follow_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUOP_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("GPUOP_KUBERNETES_VERSION", "v1.33.13")
    assert cache_dir() == tmp_path / "c"
    versions = Versions.from_env()
    assert versions.kubernetes == "v1.33.13"
    paths = BinaryPaths.under(cache_dir(), versions)
    assert paths.kube_apiserver == tmp_path / "c/bin/kubernetes-v1.33.13/kube-apiserver"
    assert paths.etcd.name == "etcd"
    assert paths.kwok.name == "kwok"


def test_prometheus_is_cached_beside_promtool_at_its_release(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The server the alert integration test runs is the release promtool checks the rules
    with (one variable moves both), cached under its own stamped directory; its build
    leaves out the cloud service discoveries and needs no web UI assets."""
    from gpuop.devcluster import _build
    from gpuop.devcluster._versions import prometheus_path, prometheus_version, promtool_version

    monkeypatch.setenv("GPUOP_PROMTOOL_VERSION", "v0.399.1")
    assert prometheus_version() == promtool_version() == "v0.399.1"
    path = prometheus_path(tmp_path, "v0.399.1")
    assert path == tmp_path / "bin" / "prometheus-v0.399.1" / "prometheus"
    assert _build.PROMETHEUS_TAGS == ("remove_all_sd",)
    # A stamped entry is returned without building (nor needing Go).
    path.parent.mkdir(parents=True)
    path.write_text("")
    (path.parent / ".complete").write_text("v0.399.1")
    monkeypatch.setattr(_build, "find_go", lambda: pytest.fail("built again"))
    assert _build.ensure_prometheus(root=tmp_path) == path
