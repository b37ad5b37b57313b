"""The free-space decision (pure) and the configuration of its margin."""

from __future__ import annotations

import pytest

from weightkeeper.config import load_settings
from weightkeeper.errors import ConfigError
from weightkeeper.planning import bytes_to_fetch, space_problem


@pytest.mark.parametrize("files, expected", [
    ([], 0),
    ([(100, 0)], 100),
    ([(100, 100)], 0),                    # in place
    ([(100, 40)], 60),                    # a partial file counts what it holds
    ([(100, 150)], 0),                    # a partial file longer than the file needs nothing more
    ([(100, 0), (50, 50), (30, 10)], 120),
])
def test_bytes_to_fetch(files, expected):
    assert bytes_to_fetch(files) == expected


@pytest.mark.parametrize("needed, free, margin, fits", [
    (0, 0, 0, True),           # nothing to write never fails, even on a full volume
    (0, 10, 100, True),
    (100, 100, 0, True),       # exactly fits
    (101, 100, 0, False),
    (100, 150, 50, True),      # exactly leaves the margin
    (100, 149, 50, False),
    (1, 10 << 30, 1 << 30, True),
    (-5, 0, 0, True),
])
def test_space_problem_decides_on_needed_free_and_margin(needed, free, margin, fits):
    problem = space_problem(needed, free, margin, "/mnt/vol")
    assert (problem is None) == fits
    if not fits:
        assert problem == (f"needs {needed} bytes, {free} free on /mnt/vol "
                           f"(a download leaves free_space_margin_bytes = {margin} free)")


def test_margin_defaults_to_one_gib_and_is_configurable(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("")
    assert load_settings(config).free_space_margin_bytes == 1 << 30
    config.write_text("free_space_margin_bytes = 0\n")
    assert load_settings(config).free_space_margin_bytes == 0
    config.write_text("free_space_margin_bytes = -1\n")
    with pytest.raises(ConfigError, match="free_space_margin_bytes must be 0 or more"):
        load_settings(config)
