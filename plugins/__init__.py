"""One shape for every pluggable policy (router scorers, urgency policies, KV eviction policies) and
for the model adapters' lookup: a `Registry` maps the names a profile uses to modules, imported
lazily. A policy module declares `PARAMS` (a pydantic model: its typed, bounded parameters) and
`create(params: PARAMS, **deps)`; `Registry.params` validates a profile's dict against it, so a bad
name or value fails at profile load with the field path, and `Registry.create` builds the plugin.
Plugins whose modules are heavy to import (the model adapters import torch) have their PARAMS
declared beside the table instead (`params=`), so validating a profile imports none of them.

A library beside `services/` (it imports nothing of omniray's), so that `kv_store/` can use it."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(
        self, kind: str, modules: Mapping[str, str], params: Mapping[str, type[BaseModel]] | None = None
    ):
        self.kind = kind  # "eviction policy", "scorer", ...: what error messages call an entry
        self.modules = dict(modules)
        self._params = dict(params) if params is not None else None
        if self._params is not None and self._params.keys() != self.modules.keys():
            raise ValueError(f"{kind} params: {sorted(self._params)} are not {sorted(self.modules)}")

    def names(self) -> list[str]:
        return sorted(self.modules)

    def check(self, name: str) -> str:
        """`name` if known (nothing imported), else a ValueError listing the known ones."""
        if name not in self.modules:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return name

    def module(self, name: str) -> ModuleType:
        return importlib.import_module(self.modules[self.check(name)])

    def params(self, name: str, params: Mapping[str, Any] | None = None) -> BaseModel:
        """`params` validated against the plugin's PARAMS; a ValueError names the field."""
        model: type[BaseModel] = (
            self.module(name).PARAMS if self._params is None else self._params[self.check(name)]
        )
        try:
            return model.model_validate(dict(params or {}))
        except ValidationError as e:
            fields = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or name}: {err['msg']}" for err in e.errors()
            )
            raise ValueError(f"{self.kind} {name!r}: {fields}") from None

    def create(self, name: str, params: Mapping[str, Any] | BaseModel | None = None, **deps: Any) -> T:
        typed = params if isinstance(params, BaseModel) else self.params(name, params)
        return self.module(name).create(typed, **deps)


__all__ = ["Registry"]
