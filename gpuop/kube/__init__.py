"""The Kubernetes client the programs share: REST calls (`rest`), the kinds table
(`kinds`), watch caches (`informer`, with `shapes`, `compact` and the protobuf pods of
`_pb_wire`/`_pb_pod`), the work queue, backoff, and the one configured API client
(`client`). It imports no program (contract `kube-client-knows-no-program`).

Empty on purpose: ``import gpuop`` imports `_lazy_client` from here before anything loads
kubernetes-asyncio.
"""
