"""A watcher that only reads: the ``observed`` figure's second process.

It opens the watches the operator holds during a rollout (every node, every operand
pod, the operand DaemonSets and ControllerRevisions, the ClusterPolicies), lists
them, then reads every event until it is stopped, decoding each with
:func:`json.loads` (the least a Python client does) and doing nothing with it. A
watch the API server closes is resumed from the last resourceVersion read, as the
operator's informers do; only an expired one is listed again. The floor run beside
it shows what observing the rollout alone costs the two shared cores, before any of
the operator's own work.

Run by the harness: ``python -m tests.bench.observer --kubeconfig K --namespace NS``;
it prints ``synced`` once every list is done and, on SIGTERM, one JSON line of
what it read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import ssl
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from components import MANAGED_BY, MANAGED_BY_LABEL

MANAGED = MANAGED_BY_LABEL


def _paths(namespace: str) -> dict[str, tuple[str, str]]:
    """Each watched resource: its collection path and label selector, as the operator's."""
    ns = f"namespaces/{namespace}"
    return {
        "nodes": ("/api/v1/nodes", ""),
        "pods": (f"/api/v1/{ns}/pods", MANAGED),
        "daemonsets": (f"/apis/apps/v1/{ns}/daemonsets", f"{MANAGED}={MANAGED_BY}"),
        "controllerrevisions": (f"/apis/apps/v1/{ns}/controllerrevisions", MANAGED),
        "clusterpolicies": ("/apis/nvidia.com/v1/clusterpolicies", ""),
    }


def _session(kubeconfig: Path) -> tuple[str, aiohttp.ClientSession]:
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    connector = aiohttp.TCPConnector(ssl=context, limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    return cluster["server"], aiohttp.ClientSession(connector=connector, timeout=timeout)


class Observer:
    def __init__(self, server: str, session: aiohttp.ClientSession) -> None:
        self.server = server
        self.session = session
        self.events: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.rewatches: Counter[str] = Counter()
        self.relists: Counter[str] = Counter()
        self.failures: list[str] = []

    async def list(self, name: str, path: str, selector: str) -> str:
        """Every page of the collection, decoded; returns its resourceVersion."""
        params = {"limit": "500"}
        if selector:
            params["labelSelector"] = selector
        while True:
            async with self.session.get(self.server + path, params=params) as resp:
                resp.raise_for_status()
                body = await resp.read()
            self.bytes[name] += len(body)
            meta = json.loads(body)["metadata"]
            if not meta.get("continue"):
                return str(meta["resourceVersion"])
            params["continue"] = meta["continue"]

    async def watch(self, name: str, path: str, selector: str, rv: str) -> None:
        """Reads the watch until stopped; a failure is recorded, not raised (the run
        goes on, and the report shows it)."""
        try:
            await self._watch(name, path, selector, rv)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self.failures.append(f"{name}: {type(err).__name__}: {err}")

    async def _watch(self, name: str, path: str, selector: str, rv: str) -> None:
        while True:
            params = {
                "watch": "1",
                "resourceVersion": rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "3600",
            }
            if selector:
                params["labelSelector"] = selector
            expired = False
            async with self.session.get(self.server + path, params=params) as resp:
                resp.raise_for_status()
                # Lines split by hand: aiohttp's readline caps a line's length, and an
                # event is one line of any length.
                pending = b""
                async for chunk in resp.content.iter_any():
                    self.bytes[name] += len(chunk)
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        event = json.loads(line)
                        self.events[name] += 1
                        if event["type"] == "ERROR":
                            expired = True
                            break
                        rv = event["object"]["metadata"]["resourceVersion"]
                    if expired:
                        break
            if expired:
                self.relists[name] += 1
                rv = await self.list(name, path, selector)
            else:
                self.rewatches[name] += 1

    def report(self) -> dict[str, Any]:
        return {
            "events": dict(self.events),
            "bytes": dict(self.bytes),
            "rewatches": dict(self.rewatches),
            "relists": dict(self.relists),
            "failures": self.failures,
        }


async def observe(kubeconfig: Path, namespace: str) -> dict[str, Any]:
    server, session = _session(kubeconfig)
    async with session:
        observer = Observer(server, session)
        paths = _paths(namespace)
        rvs = await asyncio.gather(*(observer.list(n, *p) for n, p in paths.items()))
        print("synced", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        tasks = [
            asyncio.create_task(observer.watch(n, *p, rv))
            for (n, p), rv in zip(paths.items(), rvs, strict=True)
        ]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return observer.report()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.observer")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    args = parser.parse_args(argv)
    report = asyncio.run(observe(args.kubeconfig, args.namespace))
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
