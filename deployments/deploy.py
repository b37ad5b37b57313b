"""Declare every weightkeeper flow as a Prefect deployment on the server at PREFECT_API_URL.

    .venv/bin/python deployments/deploy.py [--config FILE]

Creates the download limit and the work pools (Kubernetes pools from infra/kubernetes for workspaces with a
`[workspaces.kubernetes]` table, local process pools for the others) if missing (a Kubernetes pool whose
template differs from the config's is updated), then applies
`weightkeeper.deployments.declared`: ensure-model, delete-model, reconcile (every
`reconcile_interval_seconds`, default 60) and, per workspace work pool other than the control pool,
download-to-path and clean-path (the lifecycle runs run those of the control pool's workspaces themselves). Start a worker per pool yourself (`prefect worker start --pool P --type process`), or
run `weightkeeper serve`, which does all of this and starts the workers and the API.
"""

import argparse
import os
import sys

from weightkeeper.config import load_settings
from weightkeeper.deployments import apply_deployments


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="TOML config file (default $WEIGHTKEEPER_CONFIG)")
    settings = load_settings(parser.parse_args().config)
    if not os.environ.get("PREFECT_API_URL"):
        print("error: set PREFECT_API_URL to the Prefect server to deploy to", file=sys.stderr)
        return 2
    for name in apply_deployments(settings):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
