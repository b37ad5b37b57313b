"""Mutation check: break each guard and rule by hand, confirm a test goes red, restore.

Run from the repository root: `.venv/bin/python tests/mutations.py [NAME ...]`. Each mutation is
applied to a scratch copy of the tree, so the working tree is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name: (file, original text, broken text, tests that must go red)
MUTATIONS = {
    "guard-volume-root": ("weightkeeper/guard.py", 'raise _refuse(path, "it is a workspace volume root")', "pass",
                          "tests/test_guard.py"),
    "guard-models-segment": ("weightkeeper/guard.py", "if below < 0 or below == len(segments) - 1:", "if False:",
                             "tests/test_guard.py"),
    "guard-unicode": ("weightkeeper/guard.py", "bad = [s for s in segments if not SEGMENT.fullmatch(s)]", "bad = []",
                      "tests/test_guard.py"),
    "guard-clean-path": ("weightkeeper/guard.py", 'if path.startswith("//") or posixpath.normpath(path) != path:',
                         "if False:", "tests/test_guard.py"),
    "guard-outside-volume": ("weightkeeper/guard.py", 'raise _refuse(path, "not inside any declared workspace volume")',
                             "return VolumeRule(path)", "tests/test_guard.py"),
    "symlinked-parent": ("weightkeeper/fsops.py", "    _check_parents(path, volume)\n", "", "tests/test_guard.py"),
    "follow-link-at-path": ("weightkeeper/fsops.py", "if stat.S_ISDIR(mode):", "if os.path.isdir(path):",
                            "tests/test_guard.py"),
    "dir-name-collision": ("weightkeeper/layout.py", 'return "--".join(repo_id.split("/"))',
                           'return "-".join(repo_id.split("/"))', "tests/test_layout.py"),
    "subpath-models-parent": ("weightkeeper/layout.py", "if not subpath or models_dir not in subpath.split(\"/\"):",
                              "if True:", "tests/test_layout.py"),
    "bin-fallback": ("weightkeeper/planning.py", "    if not weights:\n        weights = list(",
                     "    if False:\n        weights = list(", "tests/test_layout.py"),
    "dedup-cluster-path": ("weightkeeper/planning.py", "paths.setdefault((w.cluster, path),",
                           "paths.setdefault((w.name, path),", "tests/test_layout.py"),
    "private-without-volume": ("weightkeeper/planning.py", "        if not w.volume:\n",
                               "        if False:\n", "tests/test_layout.py tests/test_lifecycle.py::test_private_workspace_without_volume_fails_the_model"),
    "wait-for-deleting": ("weightkeeper/registry/store.py", '            if decision != "free":\n',
                          '            if decision == "taken":\n',
                          "tests/test_lifecycle.py::test_pending_model_waits_for_a_deleting_models_path"),
    "create-while-deleting": ("weightkeeper/registry/store.py", '                if decision == "wait":\n',
                              '                if False:\n', "tests/test_registry.py"),
    "shared-path-kept": ("tasks/cleanup.py", "        if other:\n", "        if False:\n",
                         "tests/test_lifecycle.py::test_directory_another_live_model_owns_is_kept_even_if_both_claim_it"),
    "never-owned-untouched": ("tasks/cleanup.py", "        if not entry.owned:\n", "        if False:\n",
                              "tests/test_lifecycle.py::test_files_the_model_never_put_down_are_untouched"),
    "release-early": ("weightkeeper/registry/store.py", "            if row.paths:\n                return False\n",
                      "", "tests/test_registry.py tests/test_lifecycle.py::test_cleanup_failure_keeps_model_and_retry_releases_it"),
    "cleanup-failure-releases": ("tasks/cleanup.py", "        raise\n\n\n@task(name=\"release-model\")",
                                 "        registry.remove_path(name, path_id)\n        return 'gave up'\n\n\n@task(name=\"release-model\")",
                                 "tests/test_lifecycle.py::test_cleanup_failure_keeps_model_and_retry_releases_it"),
    "stop-before-cleanup": ("weightkeeper/registry/store.py",
                            "            return row.phase != DELETING or p.status == CLEANING\n",
                            "            return True\n",
                            "tests/test_lifecycle.py::test_delete_stops_a_running_download_first tests/test_registry.py"),
    "concurrency-cap": ("weightkeeper/config.py", "        return self.max_concurrent_downloads >= 0",
                        "        return False",
                        "tests/test_lifecycle.py::test_download_cap_is_never_exceeded"),
    "cross-run-resume": ("weightkeeper/download.py", "        resume = os.fstat(fd).st_size\n",
                         "        resume = 0\n        f.truncate(0)\n",
                         "tests/test_lifecycle.py::test_partial_file_resumes_from_its_size"),
    "checksum": ("weightkeeper/download.py", "        ok = writer.matches()", "        ok = True",
                 "tests/test_lifecycle.py::test_corrupt_partial_file_is_dropped_and_refetched"),
    "only-listed-files": ("weightkeeper/planning.py", '"*.safetensors", "*.json", "tokenizer*",',
                          '"*.safetensors", "*.json", "tokenizer*", "*.md",',
                          "tests/test_layout.py tests/test_lifecycle.py::test_create_ready_delete_released"),
    "size-excludes-cache": ("weightkeeper/fsops.py", "if not (current == path and entry.name == CACHE_DIR):",
                            "if True:", "tests/test_guard.py"),
    "row-locks": ("weightkeeper/registry/store.py", "row = session.scalars(query.with_for_update() if lock else query).first()",
                  "row = session.scalars(query).first()", "tests/test_registry.py::test_no_lost_updates_under_concurrent_writers"),
    "token-never-logged": ("tasks/download.py", "        logger.info(\"%s: %d of %d files to fetch into %s\"",
                           "        logger.info('token %s', load_token(registry.get_model(name).token_block))\n"
                           "        logger.info(\"%s: %d of %d files to fetch into %s\"",
                           "tests/test_lifecycle.py::test_gated_repo_needs_the_token_block_and_never_leaks_it"),
}


def run(name: str) -> bool:
    path, original, broken, tests = MUTATIONS[name]
    scratch = Path(tempfile.mkdtemp(prefix=f"wk-mut-{name}-"))
    try:
        shutil.copytree(ROOT, scratch / "tree", ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__"))
        target = scratch / "tree" / path
        text = target.read_text()
        assert text.count(original) == 1, f"{name}: the original text is not found once in {path}"
        text = text.replace(original, broken)
        target.write_text(text)
        env = dict(os.environ, PYTHONPATH=str(scratch / "tree"), WK_TEST_DB="")
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests.split()],
                              cwd=scratch / "tree", env=env, capture_output=True, text=True, timeout=900)
        red = proc.returncode != 0
        summary = (proc.stdout.strip().splitlines() or ["?"])[-1]
        print(f"{'RED  ' if red else 'GREEN'} {name:26} {summary}", flush=True)
        return red
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    names = sys.argv[1:] or list(MUTATIONS)
    survived = [n for n in names if not run(n)]
    print(f"{len(names) - len(survived)} of {len(names)} mutations caught" + (f"; survived: {survived}" if survived else ""))
    sys.exit(1 if survived else 0)
