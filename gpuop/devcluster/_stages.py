"""Extra kwok Stage: the validator's one-shot workloads (CUDA vectorAdd, device-plugin
check) run to completion on simulated nodes, as they would on a real GPU node.

kwok's own stages only complete pods owned by Jobs; these bare pods would otherwise
stay Running forever, and the validator's cuda check could never pass here.
"""

from __future__ import annotations

import yaml

from gpuop.nodeagent.workload import CUDA_VALIDATOR, PLUGIN_VALIDATOR

from ._node_files import hold_expression

WORKLOAD_COMPLETE_STAGE = f"""apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: gpuop-validation-workload-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.labels.app'
      operator: 'In'
      values: ['{CUDA_VALIDATOR}', '{PLUGIN_VALIDATOR}']
  next:
    statusTemplate: |
      phase: Succeeded
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - name: {{{{ .name | Quote }}}}
        image: {{{{ .image | Quote }}}}
        ready: false
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            reason: Completed
            startedAt: {{{{ Now | Quote }}}}
            finishedAt: {{{{ Now | Quote }}}}
      {{{{ end }}}}
"""

CLAIM_POD_TERMINATED_STAGE = """apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: gpuop-claim-pod-terminated
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running', 'Pending']
    - key: '.spec.resourceClaims'
      operator: 'Exists'
  weight: 1
  next:
    statusTemplate: |
      phase: Succeeded
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: false
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            reason: Completed
            startedAt: {{ Now | Quote }}
            finishedAt: {{ Now | Quote }}
      {{ end }}
"""
"""A deleted pod holding ResourceClaims reaches a terminal phase before it goes, as the
kubelet moves every deleted pod (Kubernetes 1.27+): only then does the resourceclaim
controller release its claims. kwok's own pod-delete stage deletes the pod at once, and
a pod deleted in the foreground (its DaemonSet was) then waits for claims that wait for
it. The weight makes this stage win over pod-delete, which follows once the phase moved."""


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (status templates) as literal blocks, as kwok's own files."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)

POD_READY_STAGE = "pod-ready"


def hold_pod_ready(stages: str) -> str:
    """kwok's stages with its ``pod-ready`` stage told to leave alone the pods the
    node-image simulator holds (``_node_files.hold_expression``) until it releases them.

    Only used with the simulator on; without it kwok's stages are used as built."""
    docs = [d for d in yaml.safe_load_all(stages) if d]
    found = False
    for doc in docs:
        if doc.get("kind") == "Stage" and doc.get("metadata", {}).get("name") == POD_READY_STAGE:
            expressions = doc["spec"].setdefault("selector", {}).setdefault("matchExpressions", [])
            expressions.append(hold_expression())
            found = True
    if not found:
        raise ValueError(f"kwok's stages have no {POD_READY_STAGE!r} stage to hold pods in")
    return yaml.dump_all(docs, Dumper=_BlockDumper, sort_keys=False, width=1000)
