"""The mutation runner counts a mutation as caught only when one of its named tests fails; a broken entry is
reported as broken, never as a catch."""

from __future__ import annotations

import pytest

from mutations import BROKEN, CAUGHT, MUTATIONS, SURVIVED, check, run

pytestmark = pytest.mark.without_prefect_server

LAYOUT = "weightkeeper/layout.py"
JOIN = 'return "--".join(repo_id.split("/"))'
COLLIDE = "tests/test_layout.py::test_dir_names_never_collide"
HARNESS = '    """Flows a test calls (in its own thread) run'


@pytest.mark.parametrize("entry, verdict, why", [
    (MUTATIONS["dir-name-collision"], CAUGHT, "1 failed"),
    ((LAYOUT, JOIN, JOIN + "  # changes nothing", COLLIDE), SURVIVED, "1 passed"),
    ((LAYOUT, JOIN, JOIN.replace("--", "-"), "tests/test_layout.py::test_that_was_renamed"), BROKEN,
     "exited 4, not 1 (no test failed): ERROR: not found: tests/test_layout.py::test_that_was_renamed"),
    ((LAYOUT, "def repo_dir_name(", "def dir_name(", "tests/test_layout.py"), BROKEN,
     "exited 2, not 1 (no test failed): ERROR tests/test_layout.py"),
    (("tests/conftest.py", HARNESS, '    raise RuntimeError("a fixture, not a rule")\n' + HARNESS, COLLIDE), BROKEN,
     "exited 1 but none of the named tests failed"),
    ((LAYOUT, JOIN, JOIN[:-1], COLLIDE), BROKEN, "the broken weightkeeper/layout.py no longer parses"),
    ((LAYOUT, "return repo_id.replace", "", COLLIDE), BROKEN, "stale: the text to break occurs 0 times"),
    ((LAYOUT, "    return ", "    return None and ", COLLIDE), BROKEN, "not once"),
], ids=["caught", "survived", "vanished-test", "collection-error", "fixture-error-only", "syntax-error",
        "stale-text", "text-found-twice"])
def test_only_a_failing_named_test_catches_a_mutation(entry, verdict, why):
    got, said = run("probe", entry)
    assert got == verdict and why in said, (got, said)


def test_every_entry_breaks_a_text_found_once_and_names_tests_that_exist():
    assert check(MUTATIONS) == {}


def test_every_module_of_a_scratch_copy_is_imported_from_the_copy(tmp_path):
    """flows/ and tasks/ install as weightkeeper.flows/.tasks (mapped to the repository): a mutation of them
    must still reach the copy's tests."""
    import os
    import subprocess
    import sys

    from mutations import ROOT, copy_tree

    copy_tree(ROOT, tmp_path / "tree")
    found = subprocess.run([sys.executable, "-c", "import weightkeeper.tasks.download as t, weightkeeper.flows.jobs as f,"
                            " weightkeeper.config as c; print(t.__file__); print(f.__file__); print(c.__file__)"],
                           cwd=tmp_path / "tree", env=dict(os.environ, PYTHONPATH=str(tmp_path / "tree")),
                           capture_output=True, text=True, check=True).stdout.split()
    assert all(path.startswith(str(tmp_path / "tree")) for path in found), found
