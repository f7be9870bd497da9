"""Private keys are created owner-only: never written world-readable and fixed after."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuop.devcluster import _pki


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _no_chmod(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mode fixed by chmod after the write would have been readable in between."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("chmod after creation: the file was readable before it")

    monkeypatch.setattr(os, "chmod", refuse)
    monkeypatch.setattr(Path, "chmod", refuse)


@pytest.mark.usefixtures("open_umask")
def test_keys_are_created_0600_even_with_an_open_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_chmod(monkeypatch)
    pki = _pki.generate(tmp_path / "pki")
    for key in (pki.ca_key, pki.serving_key, pki.admin_key, pki.sa_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
        assert key.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert stat.S_IMODE((tmp_path / "pki").stat().st_mode) == 0o700


@pytest.mark.usefixtures("open_umask")
def test_write_private_replaces_a_planted_symlink_without_following_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_chmod(monkeypatch)
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    link = tmp_path / "admin.key"
    link.symlink_to(target)
    _pki.write_private(link, b"secret")
    assert not link.is_symlink()
    assert link.read_bytes() == b"secret"
    assert stat.S_IMODE(link.stat().st_mode) == 0o600
    assert target.read_text() == "untouched"
