"""weightkeeper: owns model weights for GPU platforms, as Prefect flows over its own registry."""

from weightkeeper.kube import shut_job_process

__version__ = "0.1.0"

shut_job_process()  # first thing in a workspace job's process: its secrets are not its owner's to read
