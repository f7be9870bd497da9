"""The pre-flight tests' registry build: a generated main that links only what the tests
use (not the release's cloud storage drivers), cached under its own stamped entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuop.devcluster import _build
from gpuop.devcluster._build_registry import (
    REGISTRY_IMPORTS,
    ensure_registry,
    main_source,
    registry_path,
    registry_version,
)


def test_the_main_links_only_memory_storage_and_token_auth() -> None:
    source = main_source()
    assert "registry.RootCmd.Execute()" in source
    for imported in REGISTRY_IMPORTS:
        assert f'_ "{imported}"' in source
    assert "s3-aws" not in source
    assert "azure" not in source
    assert "gcs" not in source


def test_a_stamped_entry_is_returned_without_building(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUOP_REGISTRY_VERSION", "v3.9.9")
    assert registry_version() == "v3.9.9"
    path = registry_path(tmp_path, "v3.9.9")
    assert path == tmp_path / "bin" / "registry-v3.9.9" / "registry"
    path.parent.mkdir(parents=True)
    path.write_text("")
    (path.parent / ".complete").write_text("v3.9.9")
    monkeypatch.setattr(_build, "find_go", lambda: pytest.fail("built again"))
    assert ensure_registry(root=tmp_path) == path
