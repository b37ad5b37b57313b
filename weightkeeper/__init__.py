"""weightkeeper: owns model weights for GPU platforms, as Prefect flows over its own registry."""

__version__ = "0.1.0"
