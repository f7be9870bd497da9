"""The cluster directory: ``up`` marks it, ``down`` deletes only from a marked
directory and only what ``up`` created (issue 14, item 8)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpuop.cli import main
from gpuop.devcluster import ClusterError, LocalCluster
from gpuop.devcluster._cluster import MARKER


def _as_after_up(cluster: LocalCluster) -> None:
    """What ``up`` leaves behind, without starting processes."""
    cluster._claim()
    d = cluster.directory
    for sub in ("pki", "etcd/member/snap", "logs"):
        (d / sub).mkdir(parents=True)
    (d / "pki" / "ca.key").write_text("k")
    (d / "etcd" / "member" / "snap" / "db").write_text("x")
    (d / "logs" / "etcd.log").write_text("l")
    for name in ("kubeconfig", "kwok.yaml", "scheduler.yaml"):
        (d / name).write_text(name)
    (d / "state.json").write_text(json.dumps({"processes": []}))


def test_down_removes_a_directory_up_created(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "new" / "cluster")
    _as_after_up(cluster)
    assert (cluster.directory / MARKER).is_file()
    assert cluster.down() == []
    assert not cluster.directory.exists()
    assert (tmp_path / "new").is_dir()  # a parent it made on the way is not its to delete


def test_down_deletes_only_what_up_created(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c")
    _as_after_up(cluster)
    (cluster.directory / "notes.txt").write_text("mine")
    (cluster.directory / "pki.bak").mkdir()
    cluster.down()
    left = sorted(p.name for p in cluster.directory.iterdir())
    # The marker stays with the user's files, so the next `up` or `down` still may.
    assert left == sorted([MARKER, "notes.txt", "pki.bak"])
    (cluster.directory / "notes.txt").unlink()
    (cluster.directory / "pki.bak").rmdir()
    cluster.down()
    assert not cluster.directory.exists()


def test_an_existing_empty_directory_is_used_but_not_removed(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    _as_after_up(cluster)
    cluster.down()
    assert tmp_path.is_dir()
    assert list(tmp_path.iterdir()) == []


def test_a_symlink_in_place_of_a_created_directory_is_unlinked_not_followed(
    tmp_path: Path,
) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "file").write_text("keep")
    cluster = LocalCluster(tmp_path / "c")
    _as_after_up(cluster)
    shutil.rmtree(cluster.directory / "logs")
    (cluster.directory / "logs").symlink_to(precious)
    cluster.down()
    assert (precious / "file").read_text() == "keep"


@pytest.mark.parametrize("action", ["down", "up"])
def test_a_directory_without_the_marker_is_refused_and_left_intact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    (home / "pki").mkdir()
    code = main(["cluster", action, "--dir", str(home)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{home}: it is not a gpuop cluster directory (no {MARKER} in it)" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in home.iterdir()) == ["pki", "thesis.tex"]


def test_down_of_a_missing_or_empty_foreign_directory_does_nothing(tmp_path: Path) -> None:
    assert LocalCluster(tmp_path / "none").down() == []
    assert LocalCluster(tmp_path).down() == []
    assert tmp_path.is_dir()


def test_a_directory_from_before_the_marker_is_recognised_by_its_contents(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (old / "state.json").write_text(json.dumps({"processes": []}))
    (old / "etcd").mkdir()
    (old / "kubeconfig").write_text("x")
    LocalCluster(old).down()
    assert list(old.iterdir()) == []
    # One foreign file and it is not ours any more.
    (old / "state.json").write_text(json.dumps({"processes": []}))
    (old / "other").write_text("y")
    with pytest.raises(ClusterError, match="not a gpuop cluster directory"):
        LocalCluster(old).down()
    assert (old / "other").exists()


def test_a_file_in_place_of_the_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    cluster = LocalCluster(path)
    assert cluster.down() == []
    with pytest.raises(ClusterError, match="is not a directory"):
        cluster._claim()
    assert path.read_text() == "x"


def _fake_start(monkeypatch: pytest.MonkeyPatch, taken: int) -> tuple[list[int], list[str]]:
    """``up`` without processes: the first ``taken`` starts find their port taken."""
    from gpuop.devcluster import _cluster
    from gpuop.devcluster._errors import PortTaken

    ports: list[int] = []
    events: list[str] = []

    def start(self: LocalCluster, bins: object, port: int, tie: bool) -> object:
        ports.append(port)
        events.append(f"start marker={(self.directory / MARKER).is_file()}")
        if len(ports) <= taken:
            raise PortTaken("kube-apiserver could not bind its port: address already in use")
        return "info"

    async def populate(
        self: LocalCluster, nodes: int, gpu_nodes: int, dra: bool, workloads: object
    ) -> None:
        events.append("populate")

    monkeypatch.setattr(_cluster, "ensure_binaries", lambda versions: None)
    monkeypatch.setattr(LocalCluster, "_start", start)
    monkeypatch.setattr(LocalCluster, "_populate", populate)
    return ports, events


def test_up_starts_again_on_fresh_ports_when_one_was_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports, events = _fake_start(monkeypatch, taken=2)
    cluster = LocalCluster(tmp_path / "c")
    assert cluster.up(nodes=2, gpu_nodes=1) == "info"  # type: ignore[comparison-overlap]
    assert events == ["start marker=True"] * 3 + ["populate"]
    assert len(ports) == 3


def test_up_gives_up_after_the_attempts_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuop.devcluster._cluster import PORT_ATTEMPTS

    ports, _ = _fake_start(monkeypatch, taken=PORT_ATTEMPTS)
    cluster = LocalCluster(tmp_path / "c")
    with pytest.raises(ClusterError, match="address already in use"):
        cluster.up(nodes=2, gpu_nodes=1)
    assert len(ports) == PORT_ATTEMPTS
    assert not cluster.directory.exists()


def test_a_port_given_by_the_user_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuop.devcluster import _cluster

    ports, _ = _fake_start(monkeypatch, taken=1)
    monkeypatch.setattr(_cluster, "_check_port", lambda port: port)
    with pytest.raises(ClusterError, match="address already in use"):
        LocalCluster(tmp_path / "c").up(nodes=2, gpu_nodes=1, apiserver_port=16443)
    assert ports == [16443]
