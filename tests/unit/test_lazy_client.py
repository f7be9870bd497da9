"""The lazy kubernetes-asyncio packages: nothing generated loads unless asked for."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_operator_imports_load_no_generated_model_or_api() -> None:
    out = _run(
        """
        import sys
        import gpuop.operator.app, gpuop.kube.rest, gpuop.kube.client, gpuop.kube.informer
        loaded = [m for m in sys.modules
                  if m.startswith(("kubernetes_asyncio.client.models.",
                                   "kubernetes_asyncio.client.api."))]
        print(len(loaded))
        """
    )
    assert out == "0"


def test_generated_names_still_resolve_on_demand() -> None:
    out = _run(
        """
        import gpuop
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client import V1ObjectMeta
        from kubernetes_asyncio.client.models import V1Node
        assert client.V1Pod.__name__ == "V1Pod"
        assert client.CoreV1Api.__name__ == "CoreV1Api"
        assert client.models.V1Node is V1Node
        assert "V1Pod" in dir(client) and "V1Pod" in client.__all__
        assert client.ApiClient.__module__ == "kubernetes_asyncio.client.api_client"
        meta = V1ObjectMeta(name="x")
        print(client.__version__, meta.name)
        """
    )
    assert out.endswith(" x")


def test_unknown_name_is_an_attribute_error() -> None:
    out = _run(
        """
        import gpuop
        from kubernetes_asyncio import client
        try:
            client.NoSuchThing
        except AttributeError as err:
            print("AttributeError", err)
        """
    )
    assert out.startswith("AttributeError")
    assert "NoSuchThing" in out


def test_already_imported_package_is_left_alone() -> None:
    out = _run(
        """
        import kubernetes_asyncio.client
        from gpuop.kube import _lazy_client
        print(_lazy_client.install(), type(kubernetes_asyncio.client.__spec__.loader).__name__)
        """
    )
    assert out.startswith("False")
