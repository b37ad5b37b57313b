"""The registry: the only place weightkeeper's state is written."""

from weightkeeper.registry.store import (Claim, Holder, LocalPath, Model, ModelSpec, Registry, open_registry,
                                         registry_for)

__all__ = ["Claim", "Holder", "LocalPath", "Model", "ModelSpec", "Registry", "open_registry", "registry_for"]
