"""Prefect flows: each lifecycle of a model, orchestrating the tasks in `tasks`."""
