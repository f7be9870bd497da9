#!/usr/bin/env bash
# Usage: tests/bench/apiserver_profile.sh OUT [CLUSTER_DIR] [SECONDS]
#
# Run beside `python -m tests.bench ...` (started before it): waits for the bench
# cluster's admin kubeconfig, then for the first DaemonSet in gpu-operator (the
# operator's, or the baseline's), and 5 s later records kube-apiserver's own CPU
# profile (/debug/pprof/profile, SECONDS long, 60 by default) into OUT.pb.gz, with
# the admin certificate. OUT.info gets the server and the two wall-clock times.
# Read it with `go tool pprof -top -cum -nodefraction=0.0005 OUT.pb.gz`.
set -euo pipefail
out=$1
dir=${2:-/tmp/gpuop-bench-cluster}
seconds=${3:-60}
kc=$dir/kubeconfig
while [ ! -f "$kc" ]; do sleep 0.5; done
field() { grep "$1:" "$kc" | head -1 | awk '{print $2}'; }
server=$(field server)
auth=(--cacert "$(field certificate-authority)" --cert "$(field client-certificate)" --key "$(field client-key)")
echo "$server" > "$out.info"
until curl -sf "${auth[@]}" "$server/apis/apps/v1/namespaces/gpu-operator/daemonsets?limit=1" \
    | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin).get("items") else 1)' 2>/dev/null; do
  sleep 0.3
done
date +%s.%N >> "$out.info"
sleep 5
curl -sf "${auth[@]}" "$server/debug/pprof/profile?seconds=$seconds" -o "$out.pb.gz"
date +%s.%N >> "$out.info"
