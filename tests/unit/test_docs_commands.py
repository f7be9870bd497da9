"""Docs that hold: every command in the README's and docs' shell blocks names a real
`gpuop` sub-command and option (parsed by the CLI's own parser), a real file, module,
tox environment or chart value; every relative link and anchor resolves; every alert
shipped is listed in docs/monitoring.md; the README stays short and starts with Helm."""

from __future__ import annotations

import argparse
import itertools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpuop.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted([README, *(ROOT / "docs").glob("*.md")])
SHELL_LANGS = {"sh", "bash", "shell", "console"}
#: Top-level folders of this repository: a token starting with one names a file here.
REPO_DIRS = (
    "deploy/",
    "docs/",
    "tests/",
    "gpuop/",
    "components/",
    "crd/",
    "statemachine/",
    ".ci/",
)
CHART = ROOT / "deploy" / "helm" / "gpu-operator"
SEPARATORS = {"&&", "||", ";", "|", "&"}


@dataclass(frozen=True)
class Command:
    where: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    text: str


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\S*)", lines[i])
        if not fence:
            i += 1
            continue
        start, lang, body = i + 1, fence.group(2), []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        yield Block(path, start, lang, "\n".join(body))


def _shell_lines(block: Block) -> Iterator[tuple[int, str]]:
    """Logical command lines: continuations joined, heredoc bodies and comments skipped;
    in output blocks (no language, `console`) only the `$ ` prompt lines."""
    prompt_only = block.lang in ("", "console")
    if not prompt_only and block.lang not in SHELL_LANGS:
        return
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        number, text = block.line + i + 1, lines[i]
        i += 1
        if prompt_only:
            if not text.startswith("$ "):
                continue
            text = text[2:]
        while text.rstrip().endswith("\\") and i < len(lines):
            text = text.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", text)
        if heredoc:
            while i < len(lines) and lines[i].strip() != heredoc.group(1):
                i += 1
            i += 1
            text = text[: heredoc.start()]
        if text.strip() and not text.lstrip().startswith("#"):
            yield number, text


def _split(text: str) -> list[list[str]]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _commands() -> list[Command]:
    found = []
    for path in DOCS:
        for block in _blocks(path):
            for number, text in _shell_lines(block):
                for argv in _split(text):
                    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
                        argv = argv[1:]  # FOO=bar command ...
                    if argv:
                        found.append(Command(f"{_rel(path)}:{number}", tuple(argv)))
    return found


COMMANDS = _commands()


def _gpuop_args(argv: tuple[str, ...]) -> list[str] | None:
    """The arguments of a `gpuop` command line, None for any other program."""
    if argv[0] == "gpuop":
        return list(argv[1:])
    if argv[0] in ("python", "python3") and argv[1:3] == ("-m", "gpuop"):
        return list(argv[3:])
    return None


def _values() -> dict[str, object]:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert isinstance(values, dict)
    return values


def _repo_path_problems(token: str) -> list[str]:
    candidate = re.sub(r"(\.\w+):\w+$", r"\1", token.split("=", 1)[-1])  # file.py:name
    if not candidate.startswith(REPO_DIRS):
        return []
    if any(ch in candidate for ch in "*?["):
        return [] if list(ROOT.glob(candidate.rstrip("/"))) else [f"no file matches {candidate}"]
    return [] if (ROOT / candidate).exists() else [f"no file {candidate}"]


def _problems(command: Command) -> list[str]:
    argv = command.argv
    paths = argv
    if argv[0] == "kubectl":  # `deploy/NAME` is a Deployment there: only -f names a file
        paths = tuple(f for flag, f in itertools.pairwise(argv) if flag == "-f")
    problems = [p for token in paths for p in _repo_path_problems(token)]
    args = _gpuop_args(argv)
    if args is not None:
        try:
            build_parser().parse_args(args)
        except SystemExit as err:  # the parser printed why
            problems.append(f"`gpuop {' '.join(args)}` does not parse (exit {err.code})")
        return problems
    program = argv[0]
    if program in ("python", "python3") and len(argv) > 2 and argv[1] == "-m":
        module = argv[2]
        if module.split(".")[0] in ("tests", "gpuop", "components", "crd", "statemachine"):
            base = ROOT / module.replace(".", "/")
            if not (base.with_suffix(".py").exists() or (base / "__main__.py").exists()):
                problems.append(f"no module {module}")
    elif program == "tox":
        for flag, env in itertools.pairwise(argv):
            if flag == "-e":
                tox = (ROOT / "tox.ini").read_text(encoding="utf-8")
                envs = {"py", *re.findall(r"^\[testenv:([\w-]+)\]", tox, re.M)}
                problems += [f"no tox environment {e}" for e in env.split(",") if e not in envs]
    elif program == "helm" and len(argv) > 1 and argv[1] in ("install", "upgrade", "template"):
        values = _values()
        positional = [a for a in argv[2:] if not a.startswith("-")]
        if not any(a.startswith("deploy/helm/") for a in positional):
            problems.append("helm without the chart deploy/helm/gpu-operator")
        for flag, value in itertools.pairwise(argv):
            if flag == "--set":
                key = re.split(r"[.\[=]", value, maxsplit=1)[0]
                if key not in values:
                    problems.append(f"--set {value}: the chart has no value {key!r}")
    return problems


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.where} {c.argv[0]}")
def test_every_command_names_what_exists(command: Command) -> None:
    assert not _problems(command), (command.where, " ".join(command.argv))


def test_the_commands_were_found() -> None:
    programs = {c.argv[0] for c in COMMANDS}
    assert {"gpuop", "python3", "helm", "kubectl", "tox"} <= programs
    assert sum(_gpuop_args(c.argv) is not None for c in COMMANDS) >= 10


def _sub_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


INLINE = re.compile(r"`((?:python3? -m )?gpuop [^`]+)`")


def _inline_gpuop() -> Iterator[tuple[str, str]]:
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in INLINE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            yield f"{_rel(path)}:{line}", match.group(1)


@pytest.mark.parametrize(("where", "text"), list(_inline_gpuop()))
def test_every_inline_gpuop_command_names_real_sub_commands_and_options(
    where: str, text: str
) -> None:
    """`gpuop cluster up [--nodes N]` and the like: the sub-commands exist and every
    option is one of that sub-command's (or the global ones)."""
    tokens = text.replace("python3 -m ", "").replace("python -m ", "").split()[1:]
    parser, options = build_parser(), _options(build_parser())
    for token in tokens:
        children = _sub_parsers(parser)
        if children and token in children:
            parser = children[token]
            options |= _options(parser)
            continue
        if children and not token.startswith("-"):
            joined = token.replace("|", "/").strip("[]")
            names = [n for n in re.split(r"[/]", joined) if n]
            bad = [n for n in names if n not in children]
            assert not bad, f"{where}: `{text}`: no sub-command {bad}"
            break
        for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", token):
            assert option in options, f"{where}: `{text}`: no option {option}"


def _slug(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    inside = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            inside = not inside
            continue
        heading = re.match(r"^#{1,6}\s+(.*)", line)
        if heading and not inside:
            slug, n = _slug(heading.group(1)), 0
            while (slug if n == 0 else f"{slug}-{n}") in anchors:
                n += 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links() -> Iterator[tuple[str, Path, str]]:
    for path in DOCS:
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if not re.match(r"^[a-z]+:", target):
                yield _rel(path), path, target


@pytest.mark.parametrize(("where", "path", "target"), list(_links()))
def test_every_relative_link_and_anchor_resolves(where: str, path: Path, target: str) -> None:
    file_part, _, anchor = target.partition("#")
    linked = (path.parent / file_part).resolve() if file_part else path
    assert linked.exists(), f"{where}: no file {file_part}"
    if anchor and linked.suffix == ".md":
        assert anchor in _anchors(linked), f"{where}: no heading #{anchor} in {file_part}"


def _code_spans() -> Iterator[tuple[str, str]]:
    for path in DOCS:
        for span in re.findall(r"`([^`\n]+)`", path.read_text(encoding="utf-8")):
            for token in span.split():
                if token.startswith(REPO_DIRS) or token in ("Dockerfile", "tox.ini"):
                    yield _rel(path), token.rstrip(".,;:)")


@pytest.mark.parametrize(("where", "token"), sorted(set(_code_spans())))
def test_every_file_the_docs_name_exists(where: str, token: str) -> None:
    assert not _repo_path_problems(token), f"{where}: {token}"


def test_every_alert_is_in_the_monitoring_doc() -> None:
    monitoring = (ROOT / "docs" / "monitoring.md").read_text(encoding="utf-8")
    alerts = [
        rule["alert"]
        for rules in (ROOT / "components" / "data").glob("*.rules.yaml")
        for group in yaml.safe_load(rules.read_text(encoding="utf-8"))["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]
    assert alerts
    missing = [a for a in alerts if f"`{a}`" not in monitoring]
    assert not missing, f"alerts missing from docs/monitoring.md: {missing}"


def test_the_readme_is_short_and_starts_with_helm() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 220, len(lines)
    first_screen = "\n".join(lines[:40])
    assert "## Install on a cluster with Helm" in first_screen
    assert "helm install gpu-operator deploy/helm/gpu-operator" in first_screen


def test_the_readme_keeps_its_two_commands_and_ci_runs_the_second() -> None:
    text = README.read_text(encoding="utf-8")
    assert "python3 -m pip install . && python3 -m gpuop run" in text  # the main job
    assert "python3 -m pip install tox && tox" in text  # the tests
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^python3 -m tox\s*$", ci, re.M), "CI no longer runs the README's tox"
