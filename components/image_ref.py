"""Image references and pull credentials as a container runtime reads them.

The upgrade pre-flight asks a registry for exactly what a node's kubelet would pull, so
it must split a reference the way the runtime does (``ubuntu`` is Docker Hub's
``library/ubuntu:latest``; a first part with a dot, a colon or ``localhost`` is a
registry host) and pick a pull Secret's credentials the way the kubelet does (keys of a
``.dockerconfigjson`` may carry a scheme or a path). Pure: the registry client and the
Secret reads live in the operator.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DOCKER_HUB = "docker.io"
#: Where Docker Hub's registry API answers (its references name ``docker.io``).
DOCKER_HUB_API = "registry-1.docker.io"
_HUB_ALIASES = frozenset({DOCKER_HUB, "index.docker.io", DOCKER_HUB_API})


@dataclass(frozen=True)
class ImageRef:
    """One image as the registry API names it."""

    registry: str
    """Host (and port) as the reference spells it: docker.io for Hub images."""
    repository: str
    reference: str
    """A tag, or a digest (``sha256:...``)."""

    @property
    def api_host(self) -> str:
        """Where the registry's API answers."""
        return DOCKER_HUB_API if self.registry in _HUB_ALIASES else self.registry

    @property
    def loopback(self) -> bool:
        """A registry on this host: spoken to over plain HTTP, as runtimes do."""
        host = self.registry
        host = host[1:].split("]")[0] if host.startswith("[") else host.split(":")[0]
        return host == "localhost" or host.startswith("127.") or host == "::1"


def parse_image(image: str) -> ImageRef:
    """Split ``image`` as a runtime would; a reference without tag or digest means
    ``latest``. Raises ValueError for one no runtime could pull."""
    text = image.strip()
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"not an image reference: {image!r}")
    name, reference = text, "latest"
    if "@" in text:
        name, reference = text.split("@", 1)
    else:
        last = text.rsplit("/", 1)[-1]
        if ":" in last:
            name, reference = text.rsplit(":", 1)
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = DOCKER_HUB, name
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    if not reference or any(not part for part in repository.split("/")):
        raise ValueError(f"not an image reference: {image!r}")
    return ImageRef(registry=registry, repository=repository, reference=reference)


@dataclass(frozen=True)
class Credential:
    username: str
    password: str


def _host_of(key: str) -> str:
    """A config key's host: ``https://nvcr.io/v1/`` and ``nvcr.io`` both name nvcr.io."""
    host = key.split("://", 1)[-1].split("/", 1)[0].lower()
    return DOCKER_HUB if host in _HUB_ALIASES else host


def _entry_credential(entry: Any) -> Credential | None:
    if not isinstance(entry, Mapping):
        return None
    user, password = entry.get("username"), entry.get("password")
    if isinstance(user, str) and isinstance(password, str) and (user or password):
        return Credential(user, password)
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            decoded = base64.b64decode(auth).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        if sep:
            return Credential(user, password)
    return None


def docker_auths(secret_type: str, data: Mapping[str, str]) -> dict[str, Any]:
    """The per-registry entries of a pull Secret (``kubernetes.io/dockerconfigjson`` or
    the older ``kubernetes.io/dockercfg``; ``data`` still base64, as the API gives it).
    Anything unreadable is no credential: the kubelet would pull anonymously too."""
    key = ".dockerconfigjson" if secret_type.endswith("dockerconfigjson") else ".dockercfg"
    raw = data.get(key)
    if not raw:
        return {}
    try:
        parsed = json.loads(base64.b64decode(raw))
    except (binascii.Error, ValueError):
        return {}
    if not isinstance(parsed, dict):
        return {}
    auths = parsed.get("auths", {}) if key == ".dockerconfigjson" else parsed
    return dict(auths) if isinstance(auths, dict) else {}


def credential_for(registry: str, configs: Iterable[Mapping[str, Any]]) -> Credential | None:
    """The first credential, in the pod's Secret order, whose key names ``registry``."""
    wanted = _host_of(registry)
    for auths in configs:
        for key, entry in auths.items():
            if _host_of(key) == wanted:
                found = _entry_credential(entry)
                if found is not None:
                    return found
    return None
