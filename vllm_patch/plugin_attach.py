"""The import hook of the `vllm.general_plugins` plugin (plugin.py): a `sys.meta_path`
finder that serves vLLM's modules as the file patch would have written them.

It holds, for each module it serves, the file the module would come from and the text
to run in its place (the file patch's edited text, or a module the patch adds).  Every
other import goes on to Python's own finders.  Nothing is written: no file, no bytecode
(the loader has no `path_stats`, so importlib neither reads nor writes a `.pyc` for
these modules; a stock `.pyc` beside the file is not used).  Each served text is put
in `linecache` under its file's path, so tracebacks and `inspect` show the lines that
run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import linecache
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True)
class Served:
    """One module the finder serves: where it would be read from, and its text."""

    path: Path
    text: str

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def module_name(path: str) -> str:
    """The module a tree-relative file path holds: `vllm/a/b.py` -> `vllm.a.b`,
    `vllm/a/__init__.py` -> `vllm.a`."""
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class ServedLoader(importlib.abc.SourceLoader):
    """Runs a served module's text, compiled under its file's path."""

    def __init__(self, fullname: str, served: Served) -> None:
        self.fullname = fullname
        self.served = served

    def get_filename(self, fullname: str) -> str:
        return str(self.served.path)

    def get_data(self, path: str) -> bytes:
        if Path(path) == self.served.path:
            return self.served.text.encode("utf-8")
        return Path(path).read_bytes()

    def is_package(self, fullname: str) -> bool:
        return self.served.is_package

    def exec_module(self, module: ModuleType) -> None:
        lines = self.served.text.splitlines(keepends=True)
        # No mtime: linecache.checkcache keeps the entry rather than reread the file.
        linecache.cache[str(self.served.path)] = (
            len(self.served.text),
            None,
            lines,
            str(self.served.path),
        )
        super().exec_module(module)


class PluginFinder(importlib.abc.MetaPathFinder):
    """Finds the served modules before Python's own finders do."""

    def __init__(self, modules: Mapping[str, Served]) -> None:
        self.modules = dict(modules)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        served = self.modules.get(fullname)
        if served is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname,
            served.path,
            loader=ServedLoader(fullname, served),
            submodule_search_locations=[str(served.path.parent)] if served.is_package else None,
        )

    def names(self) -> list[str]:
        """Every module it serves."""
        return sorted(self.modules)
