"""cc-manager: sets the confidential-computing mode of a VM host's GPUs (Kata mode only).

A node's `nvidia.com/cc.mode` label picks the mode (`on`, `off`, `devtools`), else
`ccManager.defaultMode`; the manager applies it, labels the node with what it did, and
marks itself ready in `.cc-manager-ctr-ready`, which the sandbox validator waits for
(the file goes when the pod stops).
"""

from __future__ import annotations

from components._accounts import SCC_RULE
from components._host_paths import RUN_NVIDIA, VALIDATIONS_DIR, host_path, mount
from components._k8s import env, field_env
from components._sandbox import MANAGER_RESOURCES, operand_container, sandbox_switch
from components.component import VM_HOSTS, rule
from components.context import RenderContext
from components.keys import DEPLOY_CC_MANAGER_LABEL, KATA_MODE
from components.operand import Operand, Pod
from crd import ClusterPolicySpec

NAME = "cc-manager"
DAEMONSET_NAME = "nvidia-cc-manager"
SECTION = "ccManager"
CONTAINER_NAME = "nvidia-cc-manager"
READY_FILE = f"{VALIDATIONS_DIR}/.cc-manager-ctr-ready"
DEFAULT_MODE_ENV = "DEFAULT_CC_MODE"


def pod(spec: ClusterPolicySpec, _ctx: RenderContext) -> Pod:
    manager = spec.cc_manager
    main = operand_container(
        CONTAINER_NAME,
        spec,
        SECTION,
        default_resources=MANAGER_RESOURCES,
        env_vars=[
            field_env("NODE_NAME", "spec.nodeName"),
            env("NVIDIA_VISIBLE_DEVICES", "void"),
            env(DEFAULT_MODE_ENV, manager.default_mode),
        ],
        mounts=[mount("host-sys", "/sys"), mount("run-nvidia", RUN_NVIDIA)],
        selinux_s0=True,
        extra={"lifecycle": {"preStop": {"exec": {"command": ["/bin/rm", "-f", READY_FILE]}}}},
    )
    volumes = [
        host_path("host-sys", "/sys", "Directory"),
        host_path("run-nvidia", RUN_NVIDIA, "DirectoryOrCreate"),
    ]
    return Pod(containers=[main], volumes=volumes)


OPERAND = Operand(
    name=NAME,
    section=SECTION,
    daemonset=DAEMONSET_NAME,
    deploy_label=DEPLOY_CC_MANAGER_LABEL,
    pod=pod,
    enabled=sandbox_switch(SECTION, KATA_MODE),  # upstream's runs for Kata only
    placement=VM_HOSTS,
    role=(SCC_RULE, rule("", "pods", "get list watch")),
    # It reads its node's `nvidia.com/cc.mode` and labels the node with the mode set.
    cluster=(rule("", "nodes", "get list patch watch"),),
    selector_key="name",  # upstream's DaemonSet selects its pods by `name` (immutable)
)
COMPONENT = OPERAND.component()
