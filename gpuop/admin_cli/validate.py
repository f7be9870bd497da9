"""`gpuop validate FILE...`: the operator's own checks on files, without a cluster.

Each document of each file is a ClusterPolicy, an NVIDIADriver or a GPUCluster (checked
against the models, the semantic checks and the CRDs' CEL rules the operator repeats),
chart values (rendered by the cached Helm binary through the chart, then checked the
same way), or something else (not looked at). Then the rules between objects, over every
file together: one ClusterPolicy, not beside a GPUCluster, one default NVIDIADriver,
no node two NVIDIADrivers could both select.

One line per finding, ``FILE:DOC: KIND/NAME: field.path: problem``; fields the operator
accepts but does not act on are ``warning:`` lines, which leave the exit code 0.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

import crd
from gpuop.operator.controller import conflict_message
from statemachine.driver_owner import DriverResource, assign_owners

Obj = dict[str, Any]

SOURCE_CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpu-operator"
"""The chart of a source checkout (the operator image has none)."""

KINDS = {
    crd.KIND: crd.API_VERSION,
    crd.NVD_KIND: crd.NVD_API_VERSION,
    crd.GC_KIND: crd.GC_API_VERSION,
}


@dataclass(frozen=True)
class Finding:
    where: str
    """``FILE:DOC``"""
    obj: str
    """``KIND/NAME``, or empty for the document as a whole."""
    path: str
    message: str
    warning: bool = False

    def __str__(self) -> str:
        parts = [self.where]
        if self.obj:
            parts.append(self.obj)
        if self.path:
            parts.append(self.path)
        parts.append(f"warning: {self.message}" if self.warning else self.message)
        return ": ".join(parts)


@dataclass(frozen=True)
class Doc:
    where: str
    obj: Obj

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind") or "")

    @property
    def name(self) -> str:
        meta = self.obj.get("metadata")
        return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.name or '<unnamed>'}"


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    return Path(name).read_text()  # an unreadable file: the CLI's one error line, exit 2


def _load(name: str, text: str) -> tuple[list[tuple[int, Any]], Finding | None]:
    """The documents of a file, numbered from 1 (empty ones left out); those before
    invalid YAML are still checked."""
    docs: list[Any] = []
    try:
        for doc in yaml.safe_load_all(text):
            docs.append(doc)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"{name}:{len(docs) + 1}"
        at += f": line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        error = Finding(at, "", "", f"invalid YAML: {' '.join(str(problem).split())}")
        return [(i, d) for i, d in enumerate(docs, 1) if d is not None], error
    return [(i, d) for i, d in enumerate(docs, 1) if d is not None], None


def _is_values(obj: Any) -> bool:
    return isinstance(obj, Mapping) and "kind" not in obj and "apiVersion" not in obj


def _helm() -> Path | None:
    """The cached Helm binary, where this install has the local cluster's cache and it
    was built (`gpuop cluster build`); never built here."""
    try:
        from gpuop.devcluster._versions import cache_dir, helm_path, helm_version
    except ModuleNotFoundError:
        return None
    path = helm_path(cache_dir(), helm_version())
    return path if path.is_file() else None


def _render(doc: Doc, chart: Path) -> tuple[list[Doc], list[Finding]]:
    """Chart values through the chart: the objects it renders, or why it could not."""
    helm = _helm()
    if helm is None:
        why = "chart values not checked: no cached Helm binary (`gpuop cluster build` makes one)"
        return [], [Finding(doc.where, "", "", why)]
    if not (chart / "Chart.yaml").is_file():
        why = f"chart values not checked: no chart in {chart} (pass --chart)"
        return [], [Finding(doc.where, "", "", why)]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values:
        yaml.safe_dump(doc.obj, values)
        values.flush()
        command = [str(helm), "template", "gpu-operator", str(chart), "-n", "gpu-operator"]
        proc = subprocess.run(
            [*command, "-f", values.name],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    if proc.returncode != 0:
        return [], _refusals(doc.where, proc.stderr, proc.returncode)
    rendered = [
        Doc(f"{doc.where} (rendered)", dict(d))
        for d in yaml.safe_load_all(proc.stdout)
        if isinstance(d, Mapping) and d.get("kind") in KINDS
    ]
    return rendered, []


_SCHEMA_ERROR = re.compile(r"^- at '(?P<path>[^']*)': (?P<problem>.+)$")


def _refusals(where: str, stderr: str, code: int) -> list[Finding]:
    """Helm's refusal: one finding per values schema error (at its values path), else
    the error's first line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    schema = [m for m in map(_SCHEMA_ERROR.match, lines) if m]
    if schema:
        return [
            Finding(
                where, "values", m["path"].strip("/").replace("/", ".") or "<root>", m["problem"]
            )
            for m in schema
        ]
    errors = [line.removeprefix("Error:").strip() for line in lines if line.startswith("Error:")]
    message = (errors or lines or [f"helm template exited {code}"])[0]
    return [Finding(where, "", "", f"chart refuses the values: {message}")]


def _selector_problems(path: str, selector: Mapping[str, Any] | None) -> Iterator[crd.Problem]:
    for key, value in (selector or {}).items():
        problem = crd.label_selector_problem(f"{key}={value}")
        if problem:
            yield crd.Problem(f"{path}.{key}", problem)


def _check(doc: Doc, warnings: bool) -> tuple[Any, list[Finding]]:
    """One object's model (None when it does not parse) and what is wrong with it."""
    problems: list[crd.Problem] = []
    unsupported: list[crd.UnsupportedField] = []
    model: Any = None
    expected = KINDS[doc.kind]
    if doc.obj.get("apiVersion") != expected:
        problems.append(crd.Problem("apiVersion", f"must be {expected}"))
    if not doc.name:
        problems.append(crd.Problem("metadata.name", "required"))
    if doc.kind == crd.KIND:
        model, found = crd.parse_policy(doc.obj)
        problems.extend(found)
        if model is not None:
            unsupported = crd.unsupported_fields(model.spec)
    else:
        parse = crd.parse_nvidiadriver if doc.kind == crd.NVD_KIND else crd.parse_gpucluster
        try:
            model = parse(doc.obj)
        except ValidationError as err:
            problems.extend(crd.validation_problems(err))
    if isinstance(model, crd.NVIDIADriver):
        spec = model.spec
        if spec.default and spec.node_selector:
            problems.append(
                crd.Problem("spec.nodeSelector", "default NVIDIADriver must not use nodeSelector")
            )
        if crd.OWNER_LABEL in (spec.node_selector or {}):
            path = f"spec.nodeSelector.{crd.OWNER_LABEL}"
            problems.append(crd.Problem(path, "a reserved label, set by the operator"))
        problems.extend(_selector_problems("spec.nodeSelector", spec.node_selector))
        unsupported = crd.nvidiadriver_unsupported_fields(spec)
    elif isinstance(model, crd.GPUCluster):
        if doc.name and doc.name != crd.GC_NAME:
            message = f"GPUCluster is a singleton, metadata.name must be '{crd.GC_NAME}'"
            problems.append(crd.Problem("metadata.name", message))
        unsupported = crd.gpucluster_unsupported_fields(model.spec)
    findings = [Finding(doc.where, doc.label, p.path, p.message) for p in problems]
    if warnings:
        findings += [Finding(doc.where, doc.label, u.path, u.reason, True) for u in unsupported]
    return model, findings


def _cross(checked: list[tuple[Doc, Any]]) -> Iterator[Finding]:
    """The rules between objects, over every file given."""
    policies = [(d, m) for d, m in checked if d.kind == crd.KIND]
    clusters = [d for d, _ in checked if d.kind == crd.GC_KIND]
    drivers = [(d, m) for d, m in checked if isinstance(m, crd.NVIDIADriver)]
    names = sorted({d.name for d, _ in policies})
    if len(names) > 1:
        message = (
            f"more than one ClusterPolicy ({', '.join(names)}): the operator acts on the"
            " oldest and ignores the others"
        )
        for doc, _ in policies:
            yield Finding(doc.where, doc.label, "", message)
    if policies and clusters:
        for doc in clusters:
            yield Finding(doc.where, doc.label, "", conflict_message(policies[0][0].name))
    if not drivers:
        return
    by_name = {d.name: d for d, _ in drivers}
    resources = [
        DriverResource(d.name, m.spec.default, dict(m.spec.node_selector or {})) for d, m in drivers
    ]
    for name, problem in sorted(assign_owners({}, resources).problems.items()):
        yield Finding(by_name[name].where, by_name[name].label, "spec.default", problem.message)
    specific = [r for r in resources if not r.default]
    for a, b in combinations(specific, 2):
        labels = {**a.node_selector, **b.node_selector}
        if a.selects(labels) and b.selects(labels):
            shown = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "any labels"
            for one, other in ((a, b), (b, a)):
                doc = by_name[one.name]
                message = (
                    f"overlaps NVIDIADriver {other.name}'s: a node with {shown} is selected by"
                    " both (ConflictingNodeSelector: neither drives it)"
                )
                yield Finding(doc.where, doc.label, "spec.nodeSelector", message)
    uses_crd = [m for _, m in policies if m is not None and m.spec.driver.use_nvidia_driver_crd]
    if policies and not uses_crd and all(m is not None for _, m in policies):
        for doc, _ in drivers:
            message = "no ClusterPolicy sets driver.useNvidiaDriverCRD: this one is not used"
            yield Finding(doc.where, doc.label, "", message, True)


def validate(names: Iterable[str], chart: Path, warnings: bool = True) -> list[Finding]:
    """Every finding of the files, in file and document order, then the cross-object ones."""
    findings: list[Finding] = []
    checked: list[tuple[Doc, Any]] = []
    for name in names:
        docs, error = _load(name, _read(name))
        if error is not None:
            findings.append(error)
        objects: list[Doc] = []
        for number, raw in docs:
            doc = Doc(f"{name}:{number}", raw)
            if _is_values(raw):
                rendered, refused = _render(doc, chart)
                findings += refused
                objects += rendered
            elif isinstance(raw, Mapping) and raw.get("kind") in KINDS:
                objects.append(doc)
        if error is None and not objects and not any(_is_values(raw) for _, raw in docs):
            kinds = "ClusterPolicy, NVIDIADriver, GPUCluster or chart values"
            findings.append(Finding(name, "", "", f"nothing to check: no {kinds}"))
        for doc in objects:
            model, found = _check(doc, warnings)
            findings += found
            checked.append((doc, model))
    findings += [f for f in _cross(checked) if warnings or not f.warning]
    return findings


def cmd_validate(args: argparse.Namespace) -> int:
    chart = Path(args.chart) if args.chart else SOURCE_CHART
    findings = validate(args.files, chart, args.warnings)
    for finding in findings:
        print(finding)
    errors = sum(not f.warning for f in findings)
    warned = len(findings) - errors
    print(
        f"gpuop validate: {len(args.files)} file(s): {errors} problem(s), {warned} warning(s)",
        file=sys.stderr,
    )
    return 1 if errors else 0
