#!/usr/bin/env bash
# Usage: tests/bench/apiserver_profile.sh OUT [CLUSTER_DIR] [SECONDS]
#
# Run beside `python -m tests.bench ...` (started before it, with CLUSTER_DIR absent
# so an earlier cluster's files are not read): waits for the bench cluster's admin
# kubeconfig, then for the first DaemonSet in gpu-operator (the operator's, or the
# baseline's), and 5 s later records, over the same SECONDS (60 by default), the CPU
# profiles (/debug/pprof/profile) of kube-apiserver into OUT.pb.gz and of
# kube-controller-manager into OUT-kcm.pb.gz, with the admin certificate (both
# authorize it: system:masters). OUT.info gets the server and the two wall-clock times.
# Read one with `go tool pprof -top -cum -nodefraction=0.0005 OUT.pb.gz`; compare two
# runs with `go tool pprof -top -cum -diff_base=A.pb.gz B.pb.gz`.
set -euo pipefail
out=$1
dir=${2:-/tmp/gpuop-bench-cluster}
seconds=${3:-60}
kc=$dir/kubeconfig
while [ ! -f "$kc" ] || [ ! -f "$dir/state.json" ]; do sleep 0.5; done
field() { grep "$1:" "$kc" | head -1 | awk '{print $2}'; }
server=$(field server)
cert=$(field client-certificate)
key=$(field client-key)
auth=(--cacert "$(field certificate-authority)" --cert "$cert" --key "$key")
kcm_port=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ports']['controller-manager'])" "$dir/state.json")
echo "$server" > "$out.info"
until curl -sf "${auth[@]}" "$server/apis/apps/v1/namespaces/gpu-operator/daemonsets?limit=1" \
    | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin).get("items") else 1)' 2>/dev/null; do
  sleep 0.3
done
date +%s.%N >> "$out.info"
sleep 5
# kube-controller-manager serves a self-signed certificate: -k for it only.
curl -sfk --cert "$cert" --key "$key" \
    "https://127.0.0.1:$kcm_port/debug/pprof/profile?seconds=$seconds" -o "$out-kcm.pb.gz" &
curl -sf "${auth[@]}" "$server/debug/pprof/profile?seconds=$seconds" -o "$out.pb.gz"
wait
date +%s.%N >> "$out.info"
