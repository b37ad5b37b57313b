"""A Prefect process worker (`python -m weightkeeper.worker --pool P ...` takes `prefect worker start`'s options).
Started by `weightkeeper serve`, it and the flow runs it starts end with their parent (`EXIT_WITH_PARENT_ENV`)."""

from __future__ import annotations

import os
import sys

from weightkeeper import EXIT_WITH_PARENT_ENV


def main() -> None:
    from prefect.cli import app

    if EXIT_WITH_PARENT_ENV in os.environ:  # this process watches serve (`weightkeeper/__init__`), its runs this one
        os.environ[EXIT_WITH_PARENT_ENV] = str(os.getpid())

    sys.argv = ["prefect", "worker", "start", *sys.argv[1:]]
    app()


if __name__ == "__main__":
    main()
