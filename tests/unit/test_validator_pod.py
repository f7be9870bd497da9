"""The validator pod as upstream's `nvidia-operator-validator`: driver-validation, then
toolkit-validation asking the runtime for every GPU, then the main container (CUDA and
plugin checks); each container with its own step's settings and mounts, and the
toolkit step on a scratch node saying in `toolkit-ready` which check ran."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

import crd
from components import validator
from gpuop.nodeagent import cli, commands
from gpuop.nodeagent.status import StatusFiles
from gpuop.nodeagent.validate import Validator
from tests.unit.test_components_render import env_of, main_container, only_daemonset, pod, spec
from tests.unit.test_node_contract import Node

VALIDATIONS = "/run/nvidia/validations"
NRI = {"cdi": {"enabled": True, "nriPluginEnabled": True}}


def init_containers(policy: crd.ClusterPolicySpec) -> dict[str, dict[str, Any]]:
    ds = only_daemonset("operator-validation", policy)
    return {ctr["name"]: ctr for ctr in pod(ds).get("initContainers", [])}


def mounts_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_subcommands(parser.add_subparsers())
    return parser.parse_args(argv[1:])  # without the program name


def test_driver_then_toolkit_validation_with_upstreams_env() -> None:
    inits = init_containers(spec())
    assert list(inits) == ["driver-validation", "toolkit-validation"]
    driver, toolkit = inits["driver-validation"], inits["toolkit-validation"]
    assert env_of(driver) == {
        "WITH_WAIT": "true",
        "COMPONENT": "driver",
        "OPERATOR_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    }
    assert env_of(toolkit) == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "WITH_WAIT": "false",
        "COMPONENT": "toolkit",
    }
    # WITH_WAIT says what the command does: the driver check is retried until it
    # passes, the toolkit check runs once (a failure exits; the kubelet re-creates the
    # container and the runtime injects the driver afresh).
    assert driver["command"] == ["sh", "-c"]
    assert driver["args"] == [
        f"until {shlex.join(validator.driver_command(spec()))}; do sleep 5; done"
    ]
    assert toolkit["command"] == validator.toolkit_command(spec())
    assert "--wait" not in toolkit["command"]
    main = main_container(only_daemonset("operator-validation", spec()))
    assert driver["image"] == toolkit["image"] == main["image"]
    assert driver["securityContext"] == {
        "privileged": True,
        "runAsUser": 0,
        "seLinuxOptions": {"level": "s0"},  # it links /dev/char
    }
    assert toolkit["securityContext"] == {"privileged": True, "runAsUser": 0}
    assert pod(only_daemonset("operator-validation", spec()))["runtimeClassName"] == "nvidia"


def test_each_container_mounts_what_its_check_needs() -> None:
    inits = init_containers(spec())
    driver = mounts_of(inits["driver-validation"])
    assert set(driver) == {VALIDATIONS, "/run/nvidia/driver", "/host", "/host-dev-char"}
    assert driver["/host"]["readOnly"] is True
    assert driver["/run/nvidia/driver"]["mountPropagation"] == "HostToContainer"
    toolkit = mounts_of(inits["toolkit-validation"])
    assert set(toolkit) == {VALIDATIONS, "/host"}  # /host: the file checks, its fallback
    assert toolkit["/host"]["readOnly"] is True
    main = mounts_of(main_container(only_daemonset("operator-validation", spec())))
    assert set(main) == {VALIDATIONS}
    for mounts in (driver, toolkit, main):  # files written here reach the host
        assert mounts[VALIDATIONS]["mountPropagation"] == "Bidirectional"
    volumes = {v["name"] for v in pod(only_daemonset("operator-validation", spec()))["volumes"]}
    used = {m["name"] for ms in (driver, toolkit, main) for m in ms.values()}
    assert used == volumes


def test_each_steps_settings_reach_its_own_container() -> None:
    """As upstream's TransformValidatorComponent: `validator.<step>.env` goes to that
    step's container, `validator.env` and `args` to the main one, `resources` to all."""
    resources = {"limits": {"memory": "200Mi"}}

    def one(name: str) -> list[dict[str, str]]:
        return [{"name": name, "value": "1"}]

    policy = spec(
        validator={
            "env": one("MAIN"),
            "args": ["--backoff-max", "10"],
            "resources": resources,
            "driver": {"env": one("DRIVER")},
            "toolkit": {"env": one("TOOLKIT")},
            "cuda": {"env": one("CUDA")},
            "plugin": {"env": one("PLUGIN")},
        }
    )
    inits = init_containers(policy)
    main = main_container(only_daemonset("operator-validation", policy))
    owners = {"DRIVER": inits["driver-validation"], "TOOLKIT": inits["toolkit-validation"]}
    owners |= {"CUDA": main, "PLUGIN": main, "MAIN": main}
    for name, owner in owners.items():
        for ctr in (*inits.values(), main):
            assert (name in env_of(ctr)) is (ctr is owner), (name, ctr["name"])
    for ctr in (*inits.values(), main):
        assert ctr["resources"] == resources
    assert main["args"] == ["--backoff-max", "10"]
    assert "args" not in inits["toolkit-validation"]
    assert len(inits["driver-validation"]["args"]) == 1  # the script alone


def test_the_nri_plugin_injects_into_toolkit_validation() -> None:
    """Upstream's TransformValidator annotates the toolkit-validation container for the
    NRI plugin and asks for no RuntimeClass; workload pods then ask for none either."""
    ds = only_daemonset("operator-validation", spec(**NRI))
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "nvidia.cdi.k8s.io/container.toolkit-validation": "management.nvidia.com/gpu=all"
    }
    assert "runtimeClassName" not in pod(ds)
    assert "toolkit-validation" in init_containers(spec(**NRI))
    command = main_container(ds)["command"]
    assert command[command.index("--runtime-class") + 1] == ""


def test_each_step_parses_as_the_node_agents_checks() -> None:
    policy = spec(toolkit={"installDir": "/opt/nvidia"})
    driver, toolkit, main = (parse(step) for step in validator.steps(policy))
    assert (driver.checks, driver.wait, driver.driver_container) == (["driver"], False, True)
    assert (toolkit.checks, toolkit.wait) == (["toolkit"], False)
    assert toolkit.host_root == Path("/host")
    assert toolkit.toolkit_runtime_dirs[0] == "/opt/nvidia/toolkit"
    assert (main.checks, main.wait) == (["cuda", "plugin"], True)
    for args in (driver, toolkit, main):
        assert args.validations_dir == Path(VALIDATIONS)


async def run_toolkit_step(node: Node) -> bool:
    """toolkit-validation's rendered command, run on ``node`` (its / is ``node.root``)."""
    args = parse(validator.toolkit_command(spec()))
    for name in ("host_root", "validations_dir"):
        setattr(args, name, node.here(str(getattr(args, name))))
    checks = commands.build_checks(args, None, fs_root=node.root)
    return await Validator(checks, StatusFiles(args.validations_dir)).run_once()


def injected_smi(node: Node, status: int) -> None:
    """What the runtime's hook puts in a container asking for every GPU."""
    line = "| NVIDIA-SMI 595.91.07   Driver Version: 595.91.07   CUDA Version: 13.0 |"
    node.write("/usr/bin/nvidia-smi", f"#!/bin/sh\necho '{line}'\nexit {status}\n", 0o755)


async def test_toolkit_step_runs_the_injected_nvidia_smi(tmp_path: Path) -> None:
    node = Node(tmp_path)
    injected_smi(node, 0)
    assert await run_toolkit_step(node)  # no toolkit files on the host needed
    ready = node.here(f"{VALIDATIONS}/toolkit-ready").read_text()
    assert ready == "TOOLKIT_CHECK=nvidia-smi\n"


async def test_a_failing_nvidia_smi_fails_the_step(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.toolkit()  # the files are there, but the runtime's container does not work
    injected_smi(node, 9)
    assert not await run_toolkit_step(node)
    assert not node.here(f"{VALIDATIONS}/toolkit-ready").exists()


async def test_without_an_injected_nvidia_smi_the_files_are_checked(tmp_path: Path) -> None:
    node = Node(tmp_path)
    assert not await run_toolkit_step(node)  # neither nvidia-smi nor the runtime's files
    node.toolkit()
    assert await run_toolkit_step(node)
    ready = node.here(f"{VALIDATIONS}/toolkit-ready").read_text()
    assert ready == "TOOLKIT_CHECK=files\n"
