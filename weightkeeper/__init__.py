"""weightkeeper: owns model weights for GPU platforms, as Prefect flows over its own registry."""

import os

from weightkeeper.kube import shut_job_process

__version__ = "0.1.0"
EXIT_WITH_PARENT_ENV = "WEIGHTKEEPER_EXIT_WITH_PARENT"  # the pid of the parent this process ends with

shut_job_process()  # first thing in a workspace job's process: its secrets are not its owner's to read
if parent := os.environ.get(EXIT_WITH_PARENT_ENV):  # a worker of `serve` (serve's pid), or a run of one (its own)
    from weightkeeper.prefectserver import exit_with_parent

    exit_with_parent(int(parent))
