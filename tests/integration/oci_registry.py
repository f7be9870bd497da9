"""A real OCI registry on loopback for the upgrade pre-flight tests.

The distribution registry (built from the Go module proxy, ``ensure_registry``) keeps
images in memory; with ``token=True`` it wants Bearer tokens from a small token service
run here (aiohttp), which checks Basic credentials and signs ES256 JWTs with a key made
for the run (the registry trusts it through a JWKS file). Images are pushed over the
distribution API itself: one layer, one config, one OCI manifest per tag.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from gpuop.devcluster._build_registry import ensure_registry

SERVICE = "gpuop-test-registry"
ISSUER = "gpuop-test-issuer"
KID = "gpuop-test-key"
PUSHER = ("pusher", "push-secret")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenService:
    """Issues pull tokens to ``users`` (and push tokens to the pusher); records each ask."""

    users: dict[str, str]
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    asked: list[tuple[str, str]] = field(default_factory=list)
    """(user or "", scope) per token request."""
    port: int = 0

    def jwks(self) -> dict[str, Any]:
        numbers = self.key.public_key().public_numbers()
        return {
            "keys": [
                {
                    "kty": "EC",
                    "crv": "P-256",
                    "x": _b64(numbers.x.to_bytes(32, "big")),
                    "y": _b64(numbers.y.to_bytes(32, "big")),
                    "kid": KID,
                    "alg": "ES256",
                    "use": "sig",
                }
            ]
        }

    def token(self, subject: str, scope: str, actions: list[str]) -> str:
        header = {"alg": "ES256", "typ": "JWT", "kid": KID}
        name = scope.split(":")[1] if scope.count(":") >= 1 else ""
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "aud": SERVICE,
            "iat": now,
            "nbf": now - 5,
            "exp": now + 300,
            "jti": uuid.uuid4().hex,
            "access": [{"type": "repository", "name": name, "actions": actions}] if name else [],
        }
        signing = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    async def handle(self, request: web.Request) -> web.Response:
        scope = request.query.get("scope", "")
        user, password = "", ""
        header = request.headers.get("Authorization", "")
        if header.startswith("Basic "):
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        self.asked.append((user, scope))
        if user == PUSHER[0] and password == PUSHER[1]:
            actions = ["pull", "push"]
        elif user and self.users.get(user) == password:
            actions = ["pull"]
        else:
            return web.Response(status=401, text="bad credentials")
        token = self.token(user, scope, actions)
        return web.json_response({"token": token, "access_token": token, "expires_in": 300})


@contextlib.asynccontextmanager
async def token_service(users: dict[str, str]) -> AsyncIterator[TokenService]:
    service = TokenService(users, port=free_port())
    app = web.Application()
    app.router.add_get("/token", service.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", service.port).start()
    try:
        yield service
    finally:
        await runner.cleanup()


@dataclass
class Registry:
    host: str
    """``127.0.0.1:<port>``: what image references name."""
    tokens: TokenService | None = None

    @property
    def base(self) -> str:
        return f"http://{self.host}"


@contextlib.contextmanager
def registry(workdir: Path, tokens: TokenService | None = None) -> Iterator[Registry]:
    """The registry binary serving in memory on a free loopback port."""
    binary = ensure_registry()
    port = free_port()
    auth = ""
    if tokens is not None:
        jwks = workdir / "jwks.json"
        jwks.write_text(json.dumps(tokens.jwks()))
        auth = (
            "auth:\n  token:\n"
            f"    realm: http://127.0.0.1:{tokens.port}/token\n"
            f"    service: {SERVICE}\n    issuer: {ISSUER}\n    jwks: {jwks}\n"
        )
    config = workdir / f"registry-{port}.yaml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  inmemory: {}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n{auth}"
    )
    log = (workdir / f"registry-{port}.log").open("wb")
    proc = subprocess.Popen(
        [str(binary), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"registry did not start: {(workdir / log.name).read_text()}")
            time.sleep(0.05)
        yield Registry(f"127.0.0.1:{port}", tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


async def push(reg: Registry, image: str) -> None:
    """Push a tiny image under ``image`` (``<reg.host>/<repo>:<tag>``)."""
    assert image.startswith(reg.host + "/"), image
    repo, _, tag = image[len(reg.host) + 1 :].rpartition(":")
    headers = {}
    async with aiohttp.ClientSession() as session:
        if reg.tokens is not None:
            token = reg.tokens.token(PUSHER[0], f"repository:{repo}:pull,push", ["pull", "push"])
            headers["Authorization"] = f"Bearer {token}"
        layer = f"layer of {image}".encode()
        blob_config = json.dumps({"architecture": "amd64", "os": "linux"}).encode()
        for blob in (layer, blob_config):
            digest = "sha256:" + hashlib.sha256(blob).hexdigest()
            async with session.post(f"{reg.base}/v2/{repo}/blobs/uploads/", headers=headers) as r:
                assert r.status == 202, await r.text()
                location = r.headers["Location"]
            url = location if location.startswith("http") else reg.base + location
            sep = "&" if "?" in url else "?"
            async with session.put(
                f"{url}{sep}digest={digest}",
                data=blob,
                headers={**headers, "Content-Type": "application/octet-stream"},
            ) as r:
                assert r.status == 201, await r.text()
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": _descriptor("application/vnd.oci.image.config.v1+json", blob_config),
            "layers": [_descriptor("application/vnd.oci.image.layer.v1.tar", layer)],
        }
        async with session.put(
            f"{reg.base}/v2/{repo}/manifests/{tag}",
            data=json.dumps(manifest).encode(),
            headers={**headers, "Content-Type": "application/vnd.oci.image.manifest.v1+json"},
        ) as r:
            assert r.status == 201, await r.text()


def _descriptor(media_type: str, blob: bytes) -> dict[str, Any]:
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(blob).hexdigest(),
        "size": len(blob),
    }


def dockerconfig_secret(name: str, host: str, user: str, password: str) -> dict[str, Any]:
    """A ``kubernetes.io/dockerconfigjson`` pull Secret for ``host``."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    config = {"auths": {host: {"auth": auth}}}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()},
    }
