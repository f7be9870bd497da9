"""The TLS read buffer every API connection allocates
(``gpuop.kube.client.limit_tls_read_buffer``)."""

from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto

from gpuop.kube.client import TLS_READ_BUFFER, limit_tls_read_buffer


def test_a_new_tls_connection_reads_into_the_smaller_buffer() -> None:
    """What asyncio's socket transport asks the protocol for (``get_buffer(-1)``) is the
    whole resident buffer of the connection: 256 KiB each before, one per watch."""
    limit_tls_read_buffer()
    loop = asyncio.new_event_loop()
    try:
        proto = sslproto.SSLProtocol(loop, asyncio.Protocol(), ssl.create_default_context(), None)
        assert len(proto.get_buffer(-1)) == TLS_READ_BUFFER == 64 * 1024
        assert len(proto._ssl_buffer) == TLS_READ_BUFFER
    finally:
        loop.close()
