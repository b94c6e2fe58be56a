"""L0: a registry of named objects with aliases, looked up case-insensitively.

The MMA models (``mpt.engines``) and the hardware targets (``mpt.targets``) are kept in one each:
``register`` adds an object under its ``name`` and ``aliases``, ``get`` finds one by name or alias
(or passes an object of the registry's type through), ``all`` lists them in registration order.
"""
from __future__ import annotations

__all__ = ["Registry"]


class Registry:
    """Named objects of type ``kind`` (with ``name`` and ``aliases`` attributes); ``noun`` names
    one in messages ("MMA model", "target"), ``plural`` the list of valid names ("models")."""

    def __init__(self, kind: type, noun: str, plural: str):
        self.kind, self.noun, self.plural = kind, noun, plural
        self._items: dict = {}
        self._keys: dict = {}

    def register(self, obj):
        """Add ``obj`` under its name and aliases; ValueError if a name is taken."""
        if not isinstance(obj, self.kind):
            raise TypeError(f"{self.noun.split()[-1]} must be a {self.kind.__name__}; got "
                            f"{type(obj).__name__}")
        keys = (obj.name, *obj.aliases)
        for key in keys:
            if key.lower() in self._keys:
                raise ValueError(f"{self.noun} name {key!r} is already registered")
        self._items[obj.name] = obj
        self._keys.update((key.lower(), obj) for key in keys)
        return obj

    def all(self) -> dict:
        """Every registered object by name, in registration order."""
        return dict(self._items)

    def get(self, key, arg: str):
        """The object named ``key`` (name or alias, any case), or ``key`` itself if it is one;
        TypeError/ValueError naming the argument ``arg`` and listing the valid names."""
        if isinstance(key, self.kind):
            return key
        if not isinstance(key, str):
            raise TypeError(f"{arg} must be a {self.noun} name or a {self.kind.__name__}; got "
                            f"{type(key).__name__}")
        found = self._keys.get(key.lower())
        if found is None:
            valid = ", ".join(f"{o.name} ({'/'.join(o.aliases)})" if o.aliases else o.name
                              for o in self._items.values())
            raise ValueError(f"unknown {self.noun} {key!r}; valid {self.plural}: {valid}")
        return found
