"""Attributes of a package imported on first access (PEP 562), so that
importing an engine adapter package imports neither the engine nor torch,
and loads no library."""

import importlib
from typing import Any, Callable, Dict, List, Tuple


def lazy_attributes(package: str, namespace: Dict[str, Any], where: Dict[str, str]
                    ) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """The ``__getattr__`` and ``__dir__`` of package: attribute name is
    imported from the submodule where[name] (relative to package) on first
    access, then kept in namespace."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> List[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
