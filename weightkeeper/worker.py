"""A Prefect process worker that exits with the `weightkeeper serve` that started it (`python -m
weightkeeper.worker --pool P ...` takes `prefect worker start`'s options)."""

from __future__ import annotations

import os
import sys

from weightkeeper.prefectserver import PARENT_ENV, exit_with_parent


def main() -> None:
    if parent := os.environ.pop(PARENT_ENV, None):
        exit_with_parent(int(parent))
    from prefect.cli import app

    sys.argv = ["prefect", "worker", "start", *sys.argv[1:]]
    app()


if __name__ == "__main__":
    main()
