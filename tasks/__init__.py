"""Prefect tasks: each does one side effect, and writes state only through the registry."""
