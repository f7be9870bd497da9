"""A TCP proxy on loopback in front of the real API server, to break the network
between one client and the server the way networks break: ``blackhole()`` keeps
every socket open but moves no more bytes (a dead peer the TCP stack has not
noticed), ``close()`` drops every connection and the listening port (refused)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

from kubernetes_asyncio import client

from gpuop.kube.client import load_configuration


class Proxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def blackhole(self) -> None:
        """Stop moving bytes; connections (old and new) stay open and silent."""
        self._flowing.clear()

    async def close(self) -> None:
        """Close the port and every connection: new connections are refused."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in self._writers:
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        me = asyncio.current_task()
        assert me is not None
        self._tasks.add(me)
        await self._flowing.wait()
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._writers.append(up_writer)
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        with contextlib.suppress(BaseException):
            await asyncio.gather(*pumps)
        self._tasks.difference_update([*pumps, me])
        up_writer.close()
        writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            await self._flowing.wait()
            writer.write(data)
            await writer.drain()


@asynccontextmanager
async def proxied_client(kubeconfig: Path) -> AsyncIterator[tuple[client.ApiClient, Proxy]]:
    """An ``ApiClient`` that reaches the API server only through a ``Proxy``."""
    configuration = await load_configuration(kubeconfig)
    server = urlsplit(configuration.host)
    assert server.hostname is not None
    assert server.port is not None
    proxy = Proxy(server.hostname, server.port)
    await proxy.start()
    # Same address, another port: the server certificate (for 127.0.0.1) still matches.
    configuration.host = f"{server.scheme}://{server.hostname}:{proxy.port}"
    api = client.ApiClient(configuration)
    try:
        yield api, proxy
    finally:
        await proxy.close()
        await api.close()
