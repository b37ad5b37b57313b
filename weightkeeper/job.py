"""`python -m weightkeeper.job`: the command of every Kubernetes workspace job (the pool's template).

The job runs as the model's owner with the Prefect credential and the namespace's token in its environment.
Importing weightkeeper makes this process undumpable (`kube.shut_job_process`) before anything else; it then
runs Prefect's engine (`python -m prefect.engine`, the flow run `PREFECT__FLOW_RUN_ID` names) in this same
process. `prefect flow-run execute` would start the engine in a new process, readable by the owner's other
processes until it imported weightkeeper.
"""

from __future__ import annotations

import runpy


def main() -> None:
    runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
