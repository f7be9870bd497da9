"""`gpuop validate` on real files: the repository's samples and upstream's pass; broken
copies of them fail, each line naming the file, document, object and field."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuop.admin_cli.bundle import parse_duration
from gpuop.admin_cli.validate import _helm
from gpuop.cli import main

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "tests" / "conformance" / "upstream"
SAMPLES = [
    ROOT / "deploy" / "clusterpolicy.yaml",
    ROOT / "tests" / "data" / "clusterpolicy_full.yaml",
    ROOT / "tests" / "data" / "clusterpolicy_seed004.yaml",
    *sorted(UPSTREAM.glob("*/policy.yaml")),
    UPSTREAM / "nvidiadriver-pools" / "nvidiadrivers.yaml",
]
POOLS = [UPSTREAM / "nvidiadriver-pools" / "policy.yaml", *SAMPLES[-1:]]
needs_helm = pytest.mark.skipif(_helm() is None, reason="no cached Helm (gpuop cluster build)")


def _run(capsys: pytest.CaptureFixture[str], *files: Path | str) -> tuple[int, list[str]]:
    code = main(["validate", *map(str, files)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out.splitlines()


def _docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _write(path: Path, docs: list[Any]) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_samples_pass(capsys: pytest.CaptureFixture[str], sample: Path) -> None:
    code, lines = _run(capsys, sample)
    assert [line for line in lines if "warning:" not in line] == []
    assert code == 0


def test_a_policy_with_its_nvidiadrivers_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, *POOLS) == (0, [])


def test_broken_policy_names_file_document_object_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (policy,) = _docs(UPSTREAM / "default" / "policy.yaml")
    policy["spec"]["driver"]["enabled"] = "maybe"
    policy["spec"]["daemonsets"]["tolerations"] = [{"key": "a", "operator": "Sometimes"}]
    broken = _write(tmp_path / "policy.yaml", [{"apiVersion": "v1", "kind": "Namespace"}, policy])
    code, lines = _run(capsys, broken)
    assert code == 1
    prefix = f"{broken}:2: ClusterPolicy/cluster-policy: "
    assert any(line.startswith(prefix + "spec.driver.enabled: ") for line in lines), lines
    assert any(line.startswith(prefix + "spec.daemonsets.tolerations[0]") for line in lines)
    assert all(line.startswith(prefix) for line in lines), lines


def test_semantic_problem_and_unsupported_field_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (policy,) = _docs(ROOT / "deploy" / "clusterpolicy.yaml")
    policy["spec"]["kataManager"] = {"enabled": True}
    warned = _write(tmp_path / "warned.yaml", [policy])
    code, lines = _run(capsys, warned)
    assert code == 0  # a warning alone is no problem
    assert lines == [
        f"{warned}:1: ClusterPolicy/{policy['metadata']['name']}: spec.kataManager.enabled:"
        " warning: deprecated; upstream ignores it"
    ]
    assert main(["validate", "--no-warnings", str(warned)]) == 0
    assert capsys.readouterr().out == ""


def test_broken_nvidiadrivers_and_cross_object_rules(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    training, pinned = _docs(POOLS[1])
    pinned["spec"]["nodeSelector"] = {}  # selects every node: overlaps training's
    default: dict[str, Any] = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": "other-default"},
        "spec": {"default": True, "nodeSelector": {"a": "b"}},
    }
    typo = {**training, "metadata": {"name": "typo"}}
    typo["spec"] = {**training["spec"], "version": 595}  # not a string
    drivers = _write(tmp_path / "drivers.yaml", [training, pinned, default, typo])
    code, lines = _run(capsys, POOLS[0], drivers)
    assert code == 1
    assert lines == [
        f"{drivers}:3: NVIDIADriver/other-default: spec.nodeSelector:"
        " default NVIDIADriver must not use nodeSelector",
        f"{drivers}:4: NVIDIADriver/typo: spec.version: Input should be a valid string",
        f"{drivers}:1: NVIDIADriver/training: spec.nodeSelector: overlaps NVIDIADriver"
        " inference-pinned's: a node with nvidia.com/gpu.family=ampere is selected by both"
        " (ConflictingNodeSelector: neither drives it)",
        f"{drivers}:2: NVIDIADriver/inference-pinned: spec.nodeSelector: overlaps NVIDIADriver"
        " training's: a node with nvidia.com/gpu.family=ampere is selected by both"
        " (ConflictingNodeSelector: neither drives it)",
    ]
    default["spec"].pop("nodeSelector")
    two = {**default, "metadata": {"name": "second-default"}}
    code, lines = _run(capsys, POOLS[0], _write(tmp_path / "two.yaml", [default, two]))
    assert code == 1
    assert len(lines) == 2
    assert all("spec.default: multiple default NVIDIADrivers exist" in line for line in lines)


def test_policy_beside_gpucluster_and_two_policies(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    gpucluster = UPSTREAM / "gpucluster-default" / "policy.yaml"
    assert _run(capsys, gpucluster) == (0, [])
    code, lines = _run(capsys, UPSTREAM / "default" / "policy.yaml", gpucluster)
    assert code == 1
    assert any(
        line.startswith(f"{gpucluster}:1: GPUCluster/") and "may not exist at the same time" in line
        for line in lines
    ), lines
    code, lines = _run(capsys, ROOT / "deploy" / "clusterpolicy.yaml", SAMPLES[1])
    assert code == 1
    assert all("more than one ClusterPolicy" in line for line in lines)


def test_stdin_invalid_yaml_and_nothing_to_check(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    text = (ROOT / "deploy" / "clusterpolicy.yaml").read_text()
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    assert _run(capsys, "-") == (0, [])
    monkeypatch.setattr(sys, "stdin", io.StringIO(text + "\n---\nkey: [unclosed\n"))
    code, lines = _run(capsys, "-")
    assert code == 1
    assert len(lines) == 1
    assert lines[0].startswith("-:2: line ")
    assert "invalid YAML" in lines[0]
    other = tmp_path / "other.yaml"
    other.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    code, lines = _run(capsys, other)
    assert (code, len(lines)) == (1, 1)
    assert "nothing to check" in lines[0]


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["validate"])
    assert exit_.value.code == 2
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert "gpuop: error:" in err
    assert "missing.yaml" in err
    assert "Traceback" not in err


def _values(source: Path, tmp_path: Path, **sets: Any) -> Path:
    values = yaml.safe_load(source.read_text())
    values.setdefault("operator", {}).update(repository="ghcr.io/gpuop", image="gpuop", version="")
    for dotted, value in sets.items():
        *parents, leaf = dotted.split("__")
        node = values
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return _write(tmp_path / source.name, [values])


@needs_helm
def test_chart_values_render_and_are_checked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    chart_values = ROOT / "deploy" / "helm" / "gpu-operator" / "values.yaml"
    assert _run(capsys, chart_values) == (0, [])
    upstream = _values(ROOT / "tests" / "data" / "upstream" / "values.yaml", tmp_path)
    assert _run(capsys, upstream, ROOT / "tests" / "data" / "values_seed004.yaml")[0] == 0
    # As NVIDIA ships it, it names their operator image: the chart's refusal, one line.
    code, lines = _run(capsys, ROOT / "tests" / "data" / "upstream" / "values.yaml")
    assert code == 1
    assert len(lines) == 1
    assert "chart refuses the values" in lines[0]
    broken = _values(
        ROOT / "tests" / "data" / "upstream" / "values.yaml",
        tmp_path,
        daemonsets__priorityClassName=["not", "a", "string"],
    )
    code, lines = _run(capsys, broken)
    assert code == 1
    assert lines == [f"{broken}:1: values: daemonsets.priorityClassName: got array, want string"]


def test_values_without_helm_say_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpuop.admin_cli.validate._helm", lambda: None)
    code, lines = _run(capsys, ROOT / "deploy" / "helm" / "gpu-operator" / "values.yaml")
    assert code == 1
    assert len(lines) == 1
    assert "chart values not checked: no cached Helm binary" in lines[0]


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "1d", "m", "-5m", "1.5h"])
def test_bad_durations_are_usage_errors(text: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuop", "support-bundle", "--since", text],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "gpuop: error: argument --since" in proc.stderr
