"""`python -m weightkeeper.job`: the command of every Kubernetes workspace job (the pool's template).

The job runs as the model's owner with the Prefect credential and the namespace's token in its environment.
Importing weightkeeper makes this process undumpable (`kube.shut_job_process`) before it runs `prefect flow-run
execute` in the same process (an exec would make it dumpable again); the engine process Prefect starts for the
flow does the same once it imports weightkeeper.
"""

from __future__ import annotations

import sys


def main() -> None:
    from prefect.cli import app

    sys.argv = ["prefect", "flow-run", "execute", *sys.argv[1:]]
    app()


if __name__ == "__main__":
    main()
