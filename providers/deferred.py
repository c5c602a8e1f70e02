"""Deferred imports: a module that a library imports at its own import but Inlet never uses loads on first use.

Every process of Inlet (command line, flow runs, worker processes) pays its imports at start-up; a stand-in
in sys.modules skips the ones that only some features need, and loads the real module the moment anything
reads an attribute of it, so those features still work. A library's optional integrations, which it imports
only if installed, can instead be hidden from its import (hidden()): it then goes without them, as designed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# lancedb imports lance_namespace, whose REST client package imports every API class of the Lance namespace
# REST protocol at its own import (~0.8 s of lancedb's ~1.5 s here). Inlet opens local folders and object
# storage, never a REST namespace; lance_namespace's models, which it does read, are submodules and still load.
UNUSED_AT_IMPORT = ("lance_namespace_urllib3_client",)


class Deferred(types.ModuleType):
    """Stands in sys.modules for a module that an import names but may never use; loads it when first used."""

    _lock = threading.RLock()  # re-entrant: the module's own imports may ask for it while it loads

    def __getattr__(self, attr: str) -> Any:
        with Deferred._lock:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
                parent, _, child = self.__name__.rpartition(".")
                if parent and getattr(sys.modules.get(parent), child, None) is self:
                    delattr(sys.modules[parent], child)
                real = importlib.import_module(self.__name__)
                # Submodules loaded under the stand-in are attributes of the real package too.
                for name, module in list(sys.modules.items()):
                    head, _, tail = name.rpartition(".")
                    if head == self.__name__ and not hasattr(real, tail):
                        setattr(real, tail, module)
                self.__dict__.update(real.__dict__)
        return getattr(sys.modules[self.__name__], attr)


def defer(name: str) -> None:
    """Put a Deferred stand-in for name in sys.modules, unless it is already imported or not installed."""
    if name in sys.modules:
        return
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:  # its parent package is missing: then so is the module, and the import says so
        return
    if spec is None:
        return
    module = Deferred(name)
    module.__spec__, module.__file__ = spec, spec.origin
    if spec.submodule_search_locations is not None:
        module.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def defer_unused_imports() -> None:
    """Defer the modules of UNUSED_AT_IMPORT (before the libraries that import them load)."""
    for name in UNUSED_AT_IMPORT:
        defer(name)


class _Hide:
    """A finder that answers "not installed" for the named packages, to imports made by one thread only."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names, self.thread = names, threading.get_ident()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if threading.get_ident() == self.thread and name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden from this import)", name=name)


@contextmanager
def hidden(*names: str) -> Iterator[None]:
    """Within the block, this thread imports as if the named top-level packages were not installed.

    For a library that imports optional integrations whenever they are installed, and works without them
    (their absence is its documented "not installed" case). A package already imported is not hidden: the
    library then gets it whole, not without its submodules. Other threads, and imports after the block,
    are not affected.
    """
    finder = _Hide(tuple(n for n in names if n not in sys.modules))
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
