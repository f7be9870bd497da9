"""Extra kwok Stage: the validator's one-shot workloads (CUDA vectorAdd, device-plugin
check) run to completion on simulated nodes, as they would on a real GPU node.

kwok's own stages only complete pods owned by Jobs; these bare pods would otherwise
stay Running forever, and the validator's cuda check could never pass here.
"""

from __future__ import annotations

from gpuop.nodeagent.workload import CUDA_VALIDATOR, PLUGIN_VALIDATOR

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
