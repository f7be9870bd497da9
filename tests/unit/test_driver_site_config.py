"""The driver's site configuration in the rendered driver pod, as upstream mounts it.

The expected mounts come from NVIDIA's operator v26.7 (commit a22dbf6),
`controllers/object_controls.go`:
- `transformDriverContainer`: `kernelModuleConfig` files under `/drivers`; for
  non-precompiled drivers `repoConfig` files under the OS's repository directory
  (`RepoConfigPathMap`: `/etc/apt/sources.list.d` on Ubuntu, `/etc/yum.repos.d` on RHEL)
  and `certConfig` files under its CA directory (`CertConfigPathMap`:
  `/usr/local/share/ca-certificates` on Ubuntu), each file by `subPath`
  (`createConfigMapVolumeMounts`, volume named after the ConfigMap with one item per
  key, `createConfigMapVolume`); `secretEnv` as an `envFrom` secretRef
  (`createSecretEnvReference`); the topology file at `/etc/nvidia/nvidia-topologyd.conf`
  (volume `topology-config`).
- `applyLicensingConfig`: volume `licensing-config` (the Secret if named, else the
  ConfigMap), `gridd.conf` at `/drivers/gridd.conf`, and with `nlsEnabled` the token
  at `/drivers/ClientConfigToken/client_configuration_token.tok`
  (`internal/consts/consts.go`).
- `transformGDSContainer` / `transformGDRCopyContainer`: the same repository and CA
  mounts and `secretEnv` on `nvidia-fs-ctr` and `nvidia-gdrcopy-ctr`;
  `transformPeerMemoryContainer`: the kernel module files on `nvidia-peermem-ctr`.
"""

from __future__ import annotations

from typing import Any

import pytest

import crd
from components import driver
from components.context import NodeFacts, RenderContext
from components.driver_config import config_problems, referenced_config_maps
from components.nvidiadriver import OWNER_LABEL, NVIDIADriverRenderError
from components.nvidiadriver import render as render_nvd

UBUNTU = NodeFacts(os_id="ubuntu", os_version="22.04", kernel="5.15.0-124-generic")
RHEL = NodeFacts(os_id="rhel", os_version="9.4", kernel="5.14.0-427.el9.x86_64")


def _spec(**driver: Any) -> crd.ClusterPolicySpec:
    return crd.ClusterPolicySpec.model_validate({"driver": driver})


def _ctx(node: NodeFacts = UBUNTU, **keys: tuple[str, ...]) -> RenderContext:
    return RenderContext(
        namespace="gpu-operator",
        operator_image="gpuop:test",
        gpu_nodes=(node,),
        config_map_keys=keys,
    )


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == name)


def _mounts(container: dict[str, Any], volume: str) -> list[tuple[str, str | None]]:
    return [
        (m["mountPath"], m.get("subPath")) for m in container["volumeMounts"] if m["name"] == volume
    ]


def _volume(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [v for v in pod["volumes"] if v["name"] == name]
    return found


def test_repositories_and_certificates_go_file_by_file_into_the_os_directories() -> None:
    spec = _spec(repoConfig={"configMapName": "repos"}, certConfig={"name": "certs"})
    ctx = _ctx(repos=("custom.list", "mirror.list"), certs=("proxy-ca.crt",))
    pod = driver.pod_spec(spec, ctx)
    main = _container(pod, "nvidia-driver-ctr")
    assert _mounts(main, "repos") == [
        ("/etc/apt/sources.list.d/custom.list", "custom.list"),
        ("/etc/apt/sources.list.d/mirror.list", "mirror.list"),
    ]
    assert _mounts(main, "certs") == [
        ("/usr/local/share/ca-certificates/proxy-ca.crt", "proxy-ca.crt")
    ]
    assert _volume(pod, "repos") == {
        "name": "repos",
        "configMap": {
            "name": "repos",
            "items": [
                {"key": "custom.list", "path": "custom.list"},
                {"key": "mirror.list", "path": "mirror.list"},
            ],
        },
    }
    assert all(m["readOnly"] for m in main["volumeMounts"] if m["name"] in ("repos", "certs"))


def test_rhel_nodes_get_the_yum_and_pki_directories() -> None:
    spec = _spec(repoConfig={"configMapName": "repos"}, certConfig={"name": "certs"})
    pod = driver.pod_spec(spec, _ctx(RHEL, repos=("a.repo",), certs=("ca.pem",)))
    main = _container(pod, "nvidia-driver-ctr")
    assert _mounts(main, "repos") == [("/etc/yum.repos.d/a.repo", "a.repo")]
    assert _mounts(main, "certs") == [("/etc/pki/ca-trust/extracted/pem/ca.pem", "ca.pem")]


def test_secret_env_reaches_the_driver_and_the_gpudirect_builders() -> None:
    spec = crd.ClusterPolicySpec.model_validate(
        {
            "driver": {"secretEnv": "proxy", "repoConfig": {"configMapName": "repos"}},
            "gds": {"enabled": True},
            "gdrcopy": {"enabled": True},
        }
    )
    pod = driver.pod_spec(spec, _ctx(repos=("a.list",)))
    for name in ("nvidia-driver-ctr", "nvidia-fs-ctr", "nvidia-gdrcopy-ctr"):
        container = _container(pod, name)
        assert container["envFrom"] == [{"secretRef": {"name": "proxy"}}], name
        assert _mounts(container, "repos") == [("/etc/apt/sources.list.d/a.list", "a.list")]
    assert [v["name"] for v in pod["volumes"]].count("repos") == 1


def test_kernel_module_parameters_under_drivers_also_for_peermem() -> None:
    spec = _spec(kernelModuleConfig={"name": "modules"}, rdma={"enabled": True})
    pod = driver.pod_spec(spec, _ctx(modules=("nvidia.conf", "nvidia-uvm.conf")))
    expected = [
        ("/drivers/nvidia.conf", "nvidia.conf"),
        ("/drivers/nvidia-uvm.conf", "nvidia-uvm.conf"),
    ]
    assert _mounts(_container(pod, "nvidia-driver-ctr"), "modules") == expected
    assert _mounts(_container(pod, "nvidia-peermem-ctr"), "modules") == expected


@pytest.mark.parametrize(
    ("licensing", "volume", "mounts"),
    [
        (
            {"configMapName": "licensing"},
            {
                "configMap": {
                    "name": "licensing",
                    "items": [{"key": "gridd.conf", "path": "gridd.conf"}],
                }
            },
            [("/drivers/gridd.conf", "gridd.conf")],
        ),
        (
            {"secretName": "licensing", "configMapName": "ignored", "nlsEnabled": True},
            {
                "secret": {
                    "secretName": "licensing",
                    "items": [
                        {"key": "gridd.conf", "path": "gridd.conf"},
                        {
                            "key": "client_configuration_token.tok",
                            "path": "client_configuration_token.tok",
                        },
                    ],
                }
            },
            [
                ("/drivers/gridd.conf", "gridd.conf"),
                (
                    "/drivers/ClientConfigToken/client_configuration_token.tok",
                    "client_configuration_token.tok",
                ),
            ],
        ),
    ],
)
def test_vgpu_licensing(
    licensing: dict[str, Any], volume: dict[str, Any], mounts: list[tuple[str, str]]
) -> None:
    pod = driver.pod_spec(_spec(licensingConfig=licensing), _ctx())
    assert _volume(pod, "licensing-config") == {"name": "licensing-config", **volume}
    assert _mounts(_container(pod, "nvidia-driver-ctr"), "licensing-config") == mounts


def test_virtual_topology_file() -> None:
    pod = driver.pod_spec(_spec(virtualTopology={"config": "topology"}), _ctx())
    assert _mounts(_container(pod, "nvidia-driver-ctr"), "topology-config") == [
        ("/etc/nvidia/nvidia-topologyd.conf", "nvidia-topologyd.conf")
    ]
    assert _volume(pod, "topology-config")["configMap"] == {
        "name": "topology",
        "items": [{"key": "nvidia-topologyd.conf", "path": "nvidia-topologyd.conf"}],
    }


def test_precompiled_drivers_build_nothing_so_get_no_repositories_certs_or_env() -> None:
    spec = _spec(
        usePrecompiled=True,
        repoConfig={"configMapName": "repos"},
        certConfig={"name": "certs"},
        secretEnv="proxy",
        kernelModuleConfig={"name": "modules"},
    )
    assert referenced_config_maps(spec) == ("modules",)
    pod = driver.pod_spec(spec, _ctx(modules=("nvidia.conf",)), UBUNTU.kernel)
    main = _container(pod, "nvidia-driver-ctr")
    assert _mounts(main, "repos") == []
    assert _mounts(main, "certs") == []
    assert "envFrom" not in main
    assert _mounts(main, "modules") == [("/drivers/nvidia.conf", "nvidia.conf")]


def test_nothing_is_added_without_site_configuration() -> None:
    plain = driver.pod_spec(_spec(), _ctx())
    names = {v["name"] for v in plain["volumes"]}
    assert not names & {"licensing-config", "topology-config"}
    assert "envFrom" not in _container(plain, "nvidia-driver-ctr")


def test_a_missing_config_map_or_unknown_os_is_a_problem_named_by_field() -> None:
    spec = _spec(repoConfig={"configMapName": "repos"}, kernelModuleConfig={"name": "mods"})
    assert config_problems(spec, _ctx(repos=("a.list",), mods=("n.conf",))) == []
    assert config_problems(spec, _ctx(repos=("a.list",))) == [
        "spec.driver.kernelModuleConfig.name: ConfigMap gpu-operator/mods not found"
    ]
    unknown = NodeFacts(os_id="plan9", os_version="4")
    assert config_problems(spec, _ctx(unknown, repos=("a.list",), mods=("n.conf",))) == [
        "spec.driver.repoConfig: no known directory for OS 'plan9'"
    ]


def test_nvidiadriver_path_mounts_the_same_and_refuses_a_missing_config_map() -> None:
    nvd = crd.NVIDIADriverSpec.model_validate(
        {
            "driverType": "gpu",
            "repository": "nvcr.io/nvidia",
            "image": "driver",
            "version": "595.91.07",
            "repoConfig": {"name": "repos"},
            "secretEnv": "proxy",
        }
    )
    node = {
        "metadata": {
            "name": "gpu-0",
            "labels": {
                "nvidia.com/gpu.present": "true",
                OWNER_LABEL: "default",
                "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
                "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
                "feature.node.kubernetes.io/kernel-version.full": UBUNTU.kernel,
            },
        },
        "status": {"nodeInfo": {}},
    }
    base = crd.ClusterPolicySpec()
    (ds,) = render_nvd("default", "uid-1", nvd, [node], base, _ctx(repos=("a.list",)))
    main = _container(ds["spec"]["template"]["spec"], "nvidia-driver-ctr")
    assert _mounts(main, "repos") == [("/etc/apt/sources.list.d/a.list", "a.list")]
    assert main["envFrom"] == [{"secretRef": {"name": "proxy"}}]
    with pytest.raises(NVIDIADriverRenderError, match="ConfigMap gpu-operator/repos not found"):
        render_nvd("default", "uid-1", nvd, [node], base, _ctx())
