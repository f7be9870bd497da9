"""Ask an OCI registry whether an image exists, as a node's runtime would find it.

The distribution API: ``GET /v2/`` says how the registry authenticates (nothing, Basic,
or a Bearer token from the realm its ``WWW-Authenticate`` names, asked with the pull
credentials for ``repository:<name>:pull``), then ``HEAD /v2/<name>/manifests/<ref>``
answers 200 (present) or 404 (missing). Nothing is pulled. Registries on loopback are
spoken to over plain HTTP, as runtimes do; every other over HTTPS.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp

from components.image_ref import Credential, ImageRef, parse_image
from statemachine.preflight import Found, ImageCheck

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Challenge:
    """How a registry wants to be authenticated (from its ``/v2/`` answer)."""

    scheme: str
    """"" (none), "basic" or "bearer"."""
    params: Mapping[str, str] = field(default_factory=dict)


def parse_challenge(header: str | None) -> Challenge:
    if not header:
        return Challenge("")
    scheme, _, rest = header.strip().partition(" ")
    return Challenge(scheme.lower(), dict(_PARAM.findall(rest)))


class Unreachable(Exception):
    """The registry could not be asked (the message says why)."""


class RegistryClient:
    """One session per batch of checks; each registry is pinged once per batch."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(5.0, timeout_s))

    async def check_all(self, images: Mapping[str, Credential | None]) -> dict[str, ImageCheck]:
        """Each image's answer (with its credential, if any), asked in parallel."""
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            pings: dict[str, asyncio.Task[Challenge]] = {}
            checks = [self._check(session, pings, image, cred) for image, cred in images.items()]
            return {c.image: c for c in await asyncio.gather(*checks)}

    async def _check(
        self,
        session: aiohttp.ClientSession,
        pings: dict[str, asyncio.Task[Challenge]],
        image: str,
        cred: Credential | None,
    ) -> ImageCheck:
        try:
            ref = parse_image(image)
        except ValueError as err:
            return ImageCheck(image, Found.MISSING, str(err))
        base = f"{'http' if ref.loopback else 'https'}://{ref.api_host}"
        try:
            if base not in pings:
                pings[base] = asyncio.ensure_future(_ping(session, base))
            challenge = await asyncio.shield(pings[base])
            headers = {"Accept": MANIFEST_TYPES}
            auth = await _authorization(session, challenge, ref, cred)
            if auth is None:
                return ImageCheck(image, Found.DENIED, "the registry wants credentials")
            if auth:
                headers["Authorization"] = auth
            url = f"{base}/v2/{ref.repository}/manifests/{ref.reference}"
            async with session.head(url, headers=headers, allow_redirects=True) as resp:
                return _answer(image, resp.status)
        except Unreachable as err:
            return ImageCheck(image, Found.UNREACHABLE, str(err))
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            return ImageCheck(image, Found.UNREACHABLE, _short(err))


def _answer(image: str, status: int) -> ImageCheck:
    if status == 200:
        return ImageCheck(image, Found.PRESENT)
    if status == 404:
        return ImageCheck(image, Found.MISSING, "manifest unknown")
    if status in (401, 403):
        return ImageCheck(image, Found.DENIED, f"HTTP {status}")
    return ImageCheck(image, Found.UNREACHABLE, f"HTTP {status} for the manifest")


async def _ping(session: aiohttp.ClientSession, base: str) -> Challenge:
    """``GET /v2/``: 200 (open) or 401 with a challenge; anything else is no registry API."""
    async with session.get(f"{base}/v2/") as resp:
        if resp.status == 200:
            return Challenge("")
        if resp.status == 401:
            return parse_challenge(resp.headers.get("WWW-Authenticate"))
        raise Unreachable(f"HTTP {resp.status} for {base}/v2/")


async def _authorization(
    session: aiohttp.ClientSession, challenge: Challenge, ref: ImageRef, cred: Credential | None
) -> str | None:
    """The Authorization header to send ("" none); None when credentials are wanted and
    there are none, or the token service refused them."""
    basic = _basic(cred) if cred is not None else None
    if challenge.scheme == "":
        return ""
    if challenge.scheme == "basic":
        return basic
    if challenge.scheme != "bearer" or "realm" not in challenge.params:
        raise Unreachable(f"unknown authentication scheme {challenge.scheme!r}")
    params = {"scope": f"repository:{ref.repository}:pull"}
    if "service" in challenge.params:
        params["service"] = challenge.params["service"]
    headers = {"Authorization": basic} if basic is not None else {}
    async with session.get(challenge.params["realm"], params=params, headers=headers) as resp:
        if resp.status in (401, 403):
            return None
        if resp.status != 200:
            raise Unreachable(f"HTTP {resp.status} from the token service")
        body = await resp.json(content_type=None)
    token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
    if not isinstance(token, str) or not token:
        raise Unreachable("the token service answered no token")
    return f"Bearer {token}"


def _basic(cred: Credential) -> str:
    pair = f"{cred.username}:{cred.password}".encode()
    return f"Basic {base64.b64encode(pair).decode()}"


def _short(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text.splitlines()[0][:200]
