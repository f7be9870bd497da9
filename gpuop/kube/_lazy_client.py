"""Load kubernetes-asyncio's generated API and model classes only when asked for.

``kubernetes_asyncio.client`` imports about 60 API classes and 1,000 model classes
on import, roughly 38 MiB of a process whose whole budget is 100 MiB at 3,000
nodes. The operator never touches them: its REST layer calls
``ApiClient.call_api`` on plain paths and reads plain dicts. So before the
package is first imported, its three eager ``__init__`` modules (``client``,
``client.api``, ``client.models``) are registered as lazy packages that resolve
each name on first attribute access, from the same ``from X import Y`` table the
real ``__init__`` holds. Code that does use the generated classes (the tests, the
local cluster helpers) still gets them, one module at a time.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

_PACKAGES = (
    "kubernetes_asyncio.client",
    "kubernetes_asyncio.client.api",
    "kubernetes_asyncio.client.models",
)


def install() -> bool:
    """Register the lazy packages; False when kubernetes-asyncio is already imported."""
    if any(name in sys.modules for name in ("kubernetes_asyncio", *_PACKAGES)):
        return False
    modules = []
    for name in _PACKAGES:
        module = _lazy_package(name)
        if module is None:
            return False
        modules.append(module)
    for module in modules:
        sys.modules[module.__name__] = module
    return True


def _lazy_package(name: str) -> types.ModuleType | None:
    spec = _find_spec(name)
    if spec is None or spec.origin is None or spec.submodule_search_locations is None:
        return None
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), spec.origin)
    table: dict[str, tuple[str, str]] = {}
    constants: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
            for alias in stmt.names:
                table[alias.asname or alias.name] = (stmt.module, alias.name)
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                try:
                    constants[target.id] = ast.literal_eval(stmt.value)
                except ValueError:
                    return None  # not a plain table: leave the package alone
        elif not isinstance(stmt, ast.Expr):  # docstrings are fine, anything else is not
            return None
    module = types.ModuleType(name, ast.get_docstring(tree))
    module.__file__ = spec.origin
    module.__path__ = list(spec.submodule_search_locations)
    module.__package__ = name
    module.__spec__ = spec
    module.__dict__.update(constants)

    def __getattr__(attr: str) -> Any:
        if attr in table:
            source, original = table[attr]
            value = getattr(importlib.import_module(source), original)
        elif _find_spec(f"{name}.{attr}") is not None:
            value = importlib.import_module(f"{name}.{attr}")
        else:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        setattr(module, attr, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*module.__dict__, *table})

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    module.__dir__ = __dir__  # type: ignore[method-assign]
    return module


def _find_spec(name: str) -> importlib.machinery.ModuleSpec | None:
    """The spec of ``name`` without importing it (nor its parent's ``__init__``)."""
    parent = name.rpartition(".")[0]
    if parent in sys.modules:
        path = getattr(sys.modules[parent], "__path__", None)
    else:
        parent_spec = _find_spec(parent) if "." in parent else importlib.util.find_spec(parent)
        path = parent_spec.submodule_search_locations if parent_spec else None
    if path is None:
        return None
    return importlib.machinery.PathFinder.find_spec(name, list(path))
