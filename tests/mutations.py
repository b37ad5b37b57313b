"""Mutation check: break each guard and rule by hand, confirm a named test goes red, restore.

Run from the repository root: `.venv/bin/python tests/mutations.py [NAME ...]`; `--check` only checks
every entry (its text found once, its file still parsing, its named tests collected) without running
them. Each mutation is applied to a scratch copy of the tree, so the working tree is never touched.

A mutation is CAUGHT only when pytest exits 1 and one of its named tests failed, and SURVIVED when its
tests pass. Anything else is BROKEN, a fault of the entry rather than of the code: a text to break not
found exactly once (stale), a mutated file that no longer parses, a collection error, a named test that
vanished, failures or errors only outside the named tests, a run that never ends.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name: (file, original text, broken text, tests that must go red); texts may be tuples of several edits
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
    "create-while-deleting": ("weightkeeper/registry/store.py",
                              '                if decision == "wait":\n                    raise ConflictError(\n',
                              '                if False:\n                    raise ConflictError(\n',
                              "tests/test_registry.py"),
    "shared-path-kept": ("tasks/cleanup.py", "        if other:\n", "        if False:\n",
                         "tests/test_lifecycle.py::test_directory_another_live_model_owns_is_kept_even_if_both_claim_it"),
    "never-owned-untouched": ("tasks/cleanup.py", "        if not entry.owned:\n", "        if False:\n",
                              "tests/test_lifecycle.py::test_files_the_model_never_put_down_are_untouched"),
    "release-early": ("weightkeeper/registry/store.py", "            if row.paths or (row.staging_owned and row.staging_uri):",
                      "            if row.staging_owned and row.staging_uri:", "tests/test_registry.py tests/test_lifecycle.py::test_cleanup_failure_keeps_model_and_retry_releases_it"),
    "cleanup-failure-releases": ("tasks/cleanup.py", "name, attempt, e)\n        raise\n",
                                 "name, attempt, e)\n        registry.remove_path(name, path_id)\n"
                                 "        return 'gave up'\n",
                                 "tests/test_lifecycle.py::test_cleanup_failure_keeps_model_and_retry_releases_it"),
    "stop-before-cleanup": ("weightkeeper/registry/store.py",
                            "            if (row.phase == DELETING and p.status != CLEANING) or not self._holds(",
                            "            if not self._holds(",
                            "tests/test_lifecycle.py::test_delete_stops_a_running_download_first tests/test_registry.py"),
    "concurrency-cap": ("weightkeeper/config.py", "        return self.max_concurrent_downloads >= 0",
                        "        return False",
                        "tests/test_lifecycle.py::test_download_cap_is_never_exceeded"),
    "cross-run-resume": ("weightkeeper/download.py",
                         "        if have > self.remote.size:  # a partial file longer than the file: start over",
                         "        if True:  # a partial file longer than the file: start over",
                         "tests/test_lifecycle.py::test_partial_file_resumes_from_its_size"),
    "range-progress-kept": ("weightkeeper/download.py",
                            "        return [Part(p.start, p.end, min(p.done, max(have - p.start, 0))) for p in parts]",
                            "        pass",
                            "tests/test_download.py::test_an_interrupted_ranged_download_resumes_every_range_where_it_stopped"),
    "ranges-in-parallel": ("weightkeeper/download.py", "    count = max(1, min(CONNECTIONS, size // PART_BYTES))",
                           "    count = 1", "tests/test_download.py::test_a_large_file_is_fetched_as_parallel_ranges_and_checked"),
    "range-resumes-in-run": ("weightkeeper/download.py", "            transfer(file.remote, part.offset, part.end, write)",
                             "            transfer(file.remote, part.start, part.end, write)",
                             "tests/test_download.py::test_a_range_cut_mid_body_resumes_from_its_last_written_byte"),
    "token-not-to-cdn": ("weightkeeper/hub.py", "_get(to, {**(headers if own else anonymous), **wanted}",
                         "_get(to, {**headers, **wanted}",
                         "tests/test_download.py::test_the_token_goes_to_the_hub_and_never_to_the_cdn_it_redirects_to"),
    "connection-reuse": ("weightkeeper/hub.py", "if left == 0 and response._fp.isclosed():", "if False:",
                         "tests/test_download.py::test_ranges_reuse_their_connections"),
    "inline-hash-order": ("weightkeeper/download.py", "inline = not self.hashing and self.hashed == offset",
                          "inline = not self.hashing",
                          "tests/test_download.py::test_a_large_file_is_fetched_as_parallel_ranges_and_checked"),
    "prefect-heartbeat-here": ("weightkeeper/runs.py",
                               "        with without_prefect_heartbeat():\n            return flow(*args)",
                               "        return flow(*args)", "tests/test_lifecycle.py::"
                               "test_a_run_started_here_and_every_subflow_send_no_prefect_heartbeat_the_run_lease_is_the_heartbeat"),
    "prefect-heartbeat-subflow": ("flows/jobs.py", "    with without_prefect_heartbeat():\n        state = PATH_FLOWS",
                                  "    if True:\n        state = PATH_FLOWS", "tests/test_lifecycle.py::"
                                  "test_a_run_started_here_and_every_subflow_send_no_prefect_heartbeat_the_run_lease_is_the_heartbeat"),
    "sqlite-writes-queued": ("weightkeeper/prefectserver.py", 'SQLITE_BEGIN_MODE.set("IMMEDIATE")',
                             'SQLITE_BEGIN_MODE.set("IMMEDIATE" if with_for_update else "DEFERRED")',
                             "tests/test_prefectserver.py::"
                             "test_the_sqlite_write_patch_holds_or_the_server_refuses_to_start"),
    "task-run-batches": ("weightkeeper/prefectserver.py", "        os.environ.setdefault(name, value)", "        pass",
                         "tests/test_prefectserver.py::"
                         "test_the_server_started_here_records_task_runs_in_batches_flushed_every_second"),
    "server-exits-with-parent": ("weightkeeper/prefectserver.py", "        exit_with_parent(int(parent))", "        pass",
                                 "tests/test_prefectserver.py::"
                                 "test_the_server_stops_when_the_process_that_started_it_is_killed"),
    "server-port-in-use": ("weightkeeper/prefectserver.py", "    if port and not port_free(port, host):", "    if False:",
                           "tests/test_prefectserver.py::test_a_port_in_use_is_refused_not_joined"),
    "files-at-once": ("weightkeeper/download.py", "FILES_AT_ONCE = CONNECTIONS // 2", "FILES_AT_ONCE = 1000",
                      "tests/test_download.py::test_many_large_files_are_fetched_a_few_at_a_time"),
    "progress-is-for-show": ("tasks/download.py", "except Exception as e:  # noqa: BLE001 - progress is for show",
                             "except ZeroDivisionError as e:  # noqa: BLE001 - progress is for show",
                             "tests/test_lifecycle.py::"
                             "test_a_progress_artifact_that_cannot_be_shown_does_not_stop_the_download"),
    "checksum": ("weightkeeper/download.py", "        ok = size == self.remote.size and (self.digest is None or",
                 "        ok = size == self.remote.size and (True or",
                 "tests/test_lifecycle.py::test_corrupt_partial_file_is_dropped_and_refetched "
                 "tests/test_download.py::test_damaged_progress_costs_a_refetch_never_a_wrong_file"),
    "only-listed-files": ("weightkeeper/planning.py", '"*.safetensors", "*.json", "tokenizer*",',
                          '"*.safetensors", "*.json", "tokenizer*", "*.md",',
                          "tests/test_layout.py tests/test_lifecycle.py::test_create_ready_delete_released"),
    "size-excludes-cache": ("weightkeeper/fsops.py", "return d.size(skip=(CACHE_DIR,))", "return d.size()",
                            "tests/test_guard.py"),
    "row-locks": ("weightkeeper/registry/store.py", "row = session.scalars(query.with_for_update() if lock else query).first()",
                  "row = session.scalars(query).first()", "tests/test_registry.py::test_no_lost_updates_under_concurrent_writers"),
    "token-never-logged": ("tasks/download.py", "    logger.info(\"%s: %d of %d files to fetch into %s\"",
                           "    from weightkeeper.credentials import load_token\n"
                           "    logger.info('token %s', load_token(model.token_block))\n"
                           "    logger.info(\"%s: %d of %d files to fetch into %s\"",
                           "tests/test_lifecycle.py::test_gated_repo_needs_the_token_block_and_never_leaks_it"),
    "artifact-exclusion": ("tasks/download.py",
                           ("            if (blocker := registry.claim_artifact(artifact.id, copy_holder, settings.lease_seconds)) is None:",
                            "        with file_lock(path, volumes, on_wait"),
                           ("            if (blocker := None) is None:", "        with (lambda *a, **kw: contextlib.nullcontext())(path, volumes, on_wait"),
                           "tests/test_sharing.py::test_concurrent_creators_download_exactly_once"),
    "gc-link-scan": ("weightkeeper/sharing.py", "                if resolved and (resolved == artifact or resolved.startswith(artifact + \"/\")):",
                     "                if False:", "tests/test_sharing.py::test_a_link_planted_by_hand_keeps_the_copy_until_it_is_gone"),
    "keep-files": ("tasks/cleanup.py", "        if registry.get_model(name).keep_files:", "        if False:",
                   "tests/test_sharing.py::test_keep_files_leaves_the_link_and_the_copy"),
    "repair-only-damaged": ("tasks/verify.py", "    for problem in problems:\n        discard(root, problem.path)",
                            "    for problem in [Problem(f.path, 'all') for f in snapshot.files]:\n        discard(root, problem.path)",
                            "tests/test_sharing.py::test_reconcile_repairs_only_the_damaged_file"),
    "fail-during-repair": ("tasks/verify.py", "    touched = registry.set_users(artifact.id, FAILED, message)", "    touched = []",
                           "tests/test_sharing.py::test_reconcile_repairs_only_the_damaged_file"),
    "unreachable-limit": ("tasks/verify.py", "        if getattr(e, \"permanent\", True) or down_for >= settings.hub_unreachable_seconds:",
                          "        if False:",
                          "tests/test_sharing.py::test_hub_unreachable_during_repair_fails_the_models_until_it_is_back"),
    "artifacts-guard": ("weightkeeper/guard.py",
                        "    if not artifact and (inside := next(filter(is_artifacts_dir, segments), None)):",
                        "    if False:",
                        "tests/test_guard.py"),
    "relative-link": ("weightkeeper/layout.py", "    return posixpath.relpath(artifact, posixpath.dirname(path))",
                      "    return artifact", "tests/test_layout.py tests/test_sharing.py::test_two_models_share_one_copy_and_it_goes_with_the_last"),
    "outside-models-root": ("weightkeeper/layout.py", '''        return f"{path} is outside the models root''', '''        return None
        return f"{path} is outside the models root''',
                            "tests/test_layout.py tests/test_sharing.py::test_a_shared_model_outside_the_models_root_fails"),
    "verify-after-download": ("tasks/download.py",
                              "    problems = _check_filled(copy, snapshot.files, found, settings.verify_workers)\n"
                              "    if problems:  # files found",
                              "    problems = []\n    if problems:  # files found",
                              "tests/test_sharing.py::test_shared_copy_is_verified_before_it_is_used"),
    "s3-prefix-guard": ("weightkeeper/guard.py", "or not COPY.fullmatch(rest[1]):", ":", "tests/test_guard.py"),
    "s3-trailing-slash": ("weightkeeper/layout.py", 'return f"s3://{bucket}/{prefix}/{repo_dir_name(repo_id)}/{copy}/"',
                          'return f"s3://{bucket}/{prefix}/{repo_dir_name(repo_id)}/{copy}"',
                          "tests/test_layout.py tests/test_s3.py::test_prefix_delete_never_touches_a_neighbouring_prefix"),
    "s3-skip-staged-objects": ("weightkeeper/s3.py", "        if staged(client, bucket, key, remote):", "        if False:",
                               "tests/test_s3.py::test_interrupted_staging_resumes_without_uploading_finished_objects_again"),
    "s3-keep-shared-prefix": ("tasks/cleanup.py", "    if other := registry.staging_in_use_elsewhere(name):",
                              "    if other := None:", "tests/test_s3.py::test_a_prefix_another_live_model_records_is_kept"),
    "s3-never-delete-source": ("tasks/cleanup.py", "    if not model.staging_owned:\n", "    if False:\n",
                               "tests/test_s3.py::test_an_s3_source_is_filled_and_never_deleted"),
    "s3-refused-delete-releases": ("tasks/cleanup.py", "        raise CleanupError(str(e)) from None\n    registry.clear_staging",
                                   "    registry.clear_staging",
                                   "tests/test_s3.py::test_refused_prefix_delete_keeps_the_model_and_retries_until_s3_accepts"),
    "s3-release-waits-for-prefix": ("weightkeeper/registry/store.py",
                                    "if row.paths or (row.staging_owned and row.staging_uri):", "if row.paths:",
                                    "tests/test_registry.py::test_staging_lease_and_who_holds_a_staged_prefix"),
    "s3-wait-for-deleting-prefix": ("weightkeeper/registry/store.py", '            if other:\n                return Claim("wait", other.name, other.owner_name != row.owner_name)\n',
                                    "", "tests/test_registry.py::test_staging_lease_and_who_holds_a_staged_prefix"),
    "s3-stop-staging-first": ("weightkeeper/registry/store.py",
                              "            if row.phase == DELETING or not self._holds(s, Kind.STAGING, row.id, holder):",
                              "            if not self._holds(s, Kind.STAGING, row.id, holder):",
                              "tests/test_registry.py::test_staging_lease_and_who_holds_a_staged_prefix"),
    "stop-waits-for-pods": ("tasks/cleanup.py", "        pods = [] if active else _job_pods(settings, model)",
                            "        pods = []", "tests/test_kube.py::test_delete_waits_until_no_pod_of_a_download_run_remains"),
    "failover-same-cluster": ("weightkeeper/planning.py", "(w.cluster, w.volume, w.public, w.owner) == (here.cluster,",
                              "(here.cluster, w.volume, w.public, w.owner) == (here.cluster,", "tests/test_kube.py::test_failover_moves_only_to_the_same_volume_root_on_the_same_cluster"),
    "failover-capped": ("weightkeeper/registry/store.py", "if row.phase == DELETING or p.failover_attempts >= limit:",
                        "if row.phase == DELETING:", "tests/test_registry.py::test_failover_is_remembered_and_capped"),
    "job-env-scrubbed": ("weightkeeper/kube.py", 'if (not k.startswith("PREFECT_") or k in WORKER_ENV) and', "if",
                         "tests/test_kube.py::test_jobs_get_no_prefect_setting_or_token_of_the_process_that_starts_the_worker"),
    "retry-only-disconnects": ("weightkeeper/registry/store.py",
                               "if not e.connection_invalidated or attempt == DISCONNECT_RETRIES:",
                               "if attempt == DISCONNECT_RETRIES:",
                               "tests/test_registry.py::test_a_call_whose_connection_is_cut_is_retried_and_other_errors_are_not"),
    "show-token-block-to-others": ("weightkeeper/tenancy.py",
                                   'OWNER_FIELDS = ("tokenBlock", "stagingUri", "message", "subpath")',
                                   'OWNER_FIELDS = ("stagingUri", "message", "subpath")',
                                   "tests/test_tenancy.py::test_others_see_only_public_models_without_secrets_paths_or_messages"),
    "show-paths-to-others": ("weightkeeper/tenancy.py", 'OWNER_PATH_FIELDS = ("path", "message", "sharedCopy")',
                             'OWNER_PATH_FIELDS = ("message", "sharedCopy")',
                             "tests/test_tenancy.py::test_others_see_only_public_models_without_secrets_paths_or_messages"),
    "list-others-private": ("weightkeeper/tenancy.py", "Viewer(None if user.admin else user.name,",
                            "Viewer(None,",
                            "tests/test_tenancy.py::test_others_see_only_public_models_without_secrets_paths_or_messages"),
    "get-others-private": ("weightkeeper/api.py", "        if not visible(model, caller, settings):\n",
                           "        if False:\n",
                           "tests/test_tenancy.py::test_others_see_only_public_models_without_secrets_paths_or_messages"),
    "any-token-block": ("weightkeeper/tenancy.py", "if token_block is not None and token_block not in user.token_blocks:",
                        "if False:", "tests/test_tenancy.py::test_a_user_names_only_their_own_token_blocks"),
    "any-s3-source": ("weightkeeper/tenancy.py", "not any(parsed.uri.startswith(p) for p in user.s3_sources)", "False",
                      "tests/test_tenancy.py::test_s3_sources_are_limited_per_user_and_the_staging_prefix_to_nobody"),
    "s3-source-prefix-not-by-segment": ("weightkeeper/config.py", '"/".join(["s3:/", bucket, *segments, ""])',
                                        '"/".join(["s3:/", bucket, *segments])',
                                        "tests/test_tenancy.py::test_s3_sources_are_limited_per_user_and_the_staging_prefix_to_nobody"),
    "staging-prefix-as-source": ("weightkeeper/service.py",
                                 "if parsed.uri.startswith(staging) or staging.startswith(parsed.uri):", "if False:",
                                 "tests/test_tenancy.py::test_s3_sources_are_limited_per_user_and_the_staging_prefix_to_nobody"),
    "url-query-in-message": ("weightkeeper/errors.py", '("?…" if m[3] else "")', '(m[3] or "")',
                             "tests/test_tenancy.py::test_url_queries_and_control_characters_never_reach_messages"),
    "idempotency-key-unbounded": ("weightkeeper/api.py", 'max_length=128, pattern=r"^[ -~]+$",', "",
                                  "tests/test_tenancy.py::test_over_long_or_control_input_answers_422_and_writes_nothing"),
    "revision-unbounded": ("weightkeeper/layout.py", "len(revision) > 255 or not revision.isprintable() or ", "",
                           "tests/test_tenancy.py::test_over_long_or_control_input_answers_422_and_writes_nothing"),
    "prefect-auth-beyond-loopback-only": (
        "weightkeeper/prefectserver.py",
        "    credential = env[SERVER_AUTH_ENV] = prefect_credential(home)  # on loopback too: other users may reach it\n",
        "    env.pop(SERVER_AUTH_ENV, None)\n    credential = None if is_loopback(host) else prefect_credential(home)\n"
        "    if credential:\n        env[SERVER_AUTH_ENV] = credential\n",
        "tests/test_prefectserver.py::test_the_server_stops_when_the_process_that_started_it_is_killed"),
    "prefect-bind-guard": ("weightkeeper/prefectserver.py",
                           "if not is_loopback(host) and not env.get(SERVER_AUTH_ENV):", "if False:",
                           "tests/test_prefectserver.py::test_the_server_is_never_started_beyond_loopback_without_a_"
                           "credential"),
    "job-image-overridable": ("weightkeeper/kubernetes/base-job-template.json", '"image": "{{ workspace.image }}"',
                              '"image": "{{ image }}"',
                              "tests/test_kube.py::test_a_run_cannot_override_the_image_command_volumes_or_namespace_"
                              "of_its_job"),
    "job-keeps-worker-credential": ("weightkeeper/kubernetes/base-job-template.json",
                                    '"name": "PREFECT_API_AUTH_STRING",\n        "value": null',
                                    '"name": "UNUSED",\n        "value": null',
                                    "tests/test_kube.py::test_jobs_get_no_prefect_setting_or_token_of_the_process_"
                                    "that_starts_the_worker"),
    "nesting-rechecked-at-claim": ("weightkeeper/registry/store.py",
                                   "            if nested := self._nested(s, p.cluster, p.path, row, row.owner_name):",
                                   "            if nested := None:", "tests/test_registry.py::test_a_claim_rechecks_nesting"),
    "nesting-with-own-old-paths": ("weightkeeper/registry/store.py",
                                   "if (p.cluster, p.path) not in known], None, None)",
                                   "if (p.cluster, p.path) not in known], row, None)",
                                   "tests/test_registry.py::"
                                   "test_nested_model_paths_are_refused_in_both_directions_and_when_moving"),
    "dot-segments-in-subpath": ("weightkeeper/layout.py", "    if any(s.startswith(\".\") for s in segments):",
                                "    if False:", "tests/test_layout.py"),
    "anchored-follow-link": ("weightkeeper/anchored.py",
                             "DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC",
                             "DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC",
                             "tests/test_attacks.py::test_descend_refuses_a_link_and_makes_nothing_through_it"),
    "adopt-without-refusal": ("weightkeeper/fsops.py", "        if entries:\n", "        if False:\n",
                              "tests/test_attacks.py::test_files_planted_after_declaration_are_never_adopted"),
    "remove-not-ours": ("weightkeeper/fsops.py",
                        "                if not made_here(d, made):\n                    raise NotOursError(",
                        "                if False:\n                    raise NotOursError(",
                        "tests/test_attacks.py::test_a_replaced_model_directory_is_left_to_its_owner_and_the_model_released"),
    "allow-nesting": ("weightkeeper/registry/store.py",
                      "            if other := self._nested(session, p.cluster, p.path, exclude, owner):",
                      "            if other := None:",
                      "tests/test_attacks.py::test_a_model_inside_or_around_another_is_refused_at_declaration"),
    "read-small-any-file": ("weightkeeper/anchored.py",
                            "                if kind != stat.S_IFREG:\n",
                            "                if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFCHR):\n",
                            "tests/test_attacks.py::test_read_small_never_blocks_follows_or_reads_much "
                            "tests/test_attacks.py::test_a_planted_ranges_file_neither_blocks_nor_floods_the_download"),
    "resume-a-planted-hard-link": ("weightkeeper/download.py",
                                   "stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and d.mine(st.st_uid):",
                                   "stat.S_ISREG(st.st_mode) and d.mine(st.st_uid):",
                                   "tests/test_attacks.py::test_a_link_planted_as_the_partial_file_never_changes_its_target"),
    "unmeasured-path-left-downloading": ("tasks/download.py",
                                         "    except (OSError, UnsafePathError, NotOursError) as e:  # swapped",
                                         "    except ZeroDivisionError as e:  # swapped",
                                         "tests/test_attacks.py::test_a_parent_swapped_just_before_the_size_is_measured_fails_the_model"),
    "link-in-the-way-not-retried": ("tasks/cleanup.py", "    except LinkInTheWayError:\n        return True\n", "",
                                    "tests/test_attacks.py::"
                                    "test_a_delete_that_meets_a_swapped_link_retries_and_releases_once_it_is_gone"),
    "non-hex-commit": ("weightkeeper/download.py",
                       "    if not isinstance(snapshot.commit, str) or not COMMIT.fullmatch(snapshot.commit):\n",
                       "    if False:\n",
                       "tests/test_hub_answers.py::test_a_commit_that_is_not_hex_fails_the_model_and_a_delete_still_releases_it"),
    "no-digest-accepted": ("weightkeeper/download.py", "        if problem := digest_problem(f):\n", "        if False:\n",
                           "tests/test_hub_answers.py::test_a_file_without_a_usable_digest_or_size_fails_the_model_before_any_byte"),
    "stall-watchdog": ("weightkeeper/watchdog.py", "                    _quietly(conn.abort)\n",
                       "                    pass\n",
                       "tests/test_hub_answers.py::test_a_dripping_body_fails_at_the_minimum_pace_and_is_retried"),
    "redirect-anywhere": ("weightkeeper/hub.py", "        if (to := route(location, home, redirect_hosts)).problem:",
                          "        if (to := Route(location)).problem:",
                          "tests/test_hub_answers.py::test_a_redirect_anywhere_else_is_refused_and_nothing_is_written"),
    "retired-path-decides-phase": ("weightkeeper/phase.py", "    current = [p for p in paths if not p.retired]\n",
                                   "    current = list(paths)\n",
                                   "tests/test_phase.py::test_retired_paths_never_fail_or_block_a_model"),
    "lease-dead-process-not-taken-over": (
        "weightkeeper/registry/leases.py",
        "    return lease.expires_at <= now or (h.host == here and h.pid > 0 and h.started > 0 and not alive(h))",
        "    return lease.expires_at <= now",
        "tests/test_leases.py::test_takeover_rule_over_every_combination "
        "tests/test_leases.py::test_a_dead_process_of_this_host_is_taken_over_at_once_and_a_reused_pid_is_not_alive"),
    "lease-reservation-taken-as-dead": (
        "weightkeeper/registry/leases.py", "(h.host == here and h.pid > 0 and h.started > 0 and not alive(h))",
        "(h.host == here and not alive(h))", "tests/test_leases.py::test_takeover_rule_over_every_combination"),
    "renewer-ignores-deletion": (
        "weightkeeper/registry/leases.py",
        "if key not in phases or phases[key] == DELETING and purposes.get(key) != CLEANUP}",
        "if key not in phases}",
        "tests/test_registry.py::test_stale_lease_can_be_taken_over "
        "tests/test_leases.py::test_one_renewer_thread_renews_every_lease_and_reports_lost_and_stopped"),
    "cleanup-failure-counted-twice": (
        "weightkeeper/registry/store.py", "            row.cleanup_attempts = max(row.cleanup_attempts, attempt)\n",
        "            row.cleanup_attempts += 1\n", "tests/test_registry.py::test_no_lost_updates_under_concurrent_writers"),
    "retry-what-is-not-idempotent": (
        "weightkeeper/registry/store.py", 'if not _name.startswith("_") and _name not in NOT_IDEMPOTENT:',
        'if not _name.startswith("_"):', "tests/test_registry.py::test_a_write_that_is_not_idempotent_is_never_retried"),
    "prefect-home-shared": ("weightkeeper/prefectserver.py", " PREFECT_HOME=str(home / PREFECT_DIR),", "",
                            "tests/test_prefectserver.py::test_each_home_keeps_its_own_prefect_server_under_it_and_"
                            "sees_only_its_own_runs"),
    "threads-find-no-prefect-api": ("weightkeeper/prefectserver.py",
                                    "    refresh_global_settings_context()\n    try:", "    try:",
                                    "tests/test_prefectserver.py::test_the_server_stops_when_the_process_that_started_"
                                    "it_is_killed"),
    "sqlite-check-always-passes": ("weightkeeper/prefectserver.py", "    if not writes_take_the_lock_first():",
                                   "    if False:", "tests/test_prefectserver.py::test_the_sqlite_write_patch_holds_or_"
                                   "the_server_refuses_to_start"),
    "prefect-ui-calls-a-fixed-api": ("weightkeeper/prefectserver.py",
                                     '    env.setdefault("PREFECT_UI_API_URL", "/api")', "    pass",
                                     "tests/test_serve.py::test_the_prefect_server_serve_starts_beyond_loopback_"
                                     "answers_only_to_its_credential"),
    "config-types-converted": ("weightkeeper/config.py", "Number = Annotated[float, Strict()]", "Number = float",
                               "tests/test_config.py::test_a_wrong_type_is_one_line_naming_the_key_and_the_file"),
    "slot-release-failure-fails-download": ("weightkeeper/runtime.py",
                                            "            except Exception as e:  # noqa: BLE001 - the lease",
                                            "            except ZeroDivisionError as e:  # noqa: BLE001 - the lease",
                                            "tests/test_server_restart.py::test_slot_requests_the_server_refuses_are_"
                                            "retried_or_outlived[refused-for-good]"),
    "slot-renewal-failure-cancels": ("weightkeeper/runtime.py", "raise_on_lease_renewal_failure=False)",
                                     "raise_on_lease_renewal_failure=True)",
                                     "tests/test_server_restart.py::test_slot_requests_the_server_refuses_are_"
                                     "retried_or_outlived[refused-for-good]"),
    "slot-wait-unstoppable": ("weightkeeper/runtime.py", "        on_wait(in_use, limit)\n", "        pass\n",
                              "tests/test_slots.py::test_while_every_slot_is_taken_on_wait_is_called_and_can_stop_"
                              "the_wait"),
    "slot-unlimited-takes-one": ("weightkeeper/runtime.py", "    if not settings.downloads_limited:\n        yield\n",
                                 "    if False:\n        yield\n",
                                 "tests/test_slots.py::test_a_missing_limit_fails_the_download_for_good_and_unlimited_"
                                 "downloads_need_none"),
    "slot-missing-limit-retried": ("weightkeeper/runtime.py", "creates it\", permanent=True)",
                                   "creates it\", permanent=False)",
                                   "tests/test_slots.py::test_a_missing_limit_fails_the_download_for_good_and_"
                                   "unlimited_downloads_need_none"),
    "path-job-dead-worker-waited-for": ("flows/jobs.py",
                                        "    return not (mine and abandoned(lease, utcnow(), this_host()))",
                                        "    return True",
                                        "tests/test_paths_flow.py::test_a_deployed_ensure_whose_worker_dies_ends_with_a_"
                                        "message tests/test_paths_flow.py::test_only_the_childs_own_abandoned_lease_"
                                        "tells_that_its_worker_died"),
    "path-job-crashed-by-anothers-lease": ("flows/jobs.py",
                                           '    mine = lease is not None and lease.holder.run == f"{run_id}/{path.id}"',
                                           "    mine = lease is not None",
                                           "tests/test_paths_flow.py::test_only_the_childs_own_abandoned_lease_tells_"
                                           "that_its_worker_died"),
    "path-job-no-start-deadline": ("flows/jobs.py", "        if now - child.created <= START_SECONDS:", "        if True:",
                                   "tests/test_paths_flow.py::test_a_pool_without_a_worker_fails_the_path_naming_the_pool"),
    "path-job-no-run-budget": ("flows/jobs.py", "        if now - child.started <= budget:", "        if True:",
                               "tests/test_paths_flow.py::test_a_deployed_run_past_its_budget_is_cancelled_and_the_"
                               "wait_ends"),
    "path-job-crash-not-recorded": ("flows/jobs.py", "                _record(registry, name, failure)\n", "",
                                    "tests/test_paths_flow.py::test_a_deployed_ensure_whose_worker_dies_ends_with_a_"
                                    "message tests/test_paths_flow.py::test_a_pool_without_a_worker_fails_the_path_"
                                    "naming_the_pool"),
    "path-job-failure-takes-a-live-lease": (
        "flows/jobs.py",
        "    holder = lease.holder if lease and abandoned(lease, utcnow(), this_host()) else NOBODY",
        "    holder = lease.holder if lease else NOBODY",
        "tests/test_paths_flow.py::test_a_failure_is_recorded_only_on_a_path_nobody_works_on"),
    "stop-waits-for-dead-holders": (
        "tasks/cleanup.py", "    return [w for w in work if not abandoned(w.lease, now, here) or _alive_here(w.lease.holder)]",
        "    return [w for w in work if w.lease.expires_at > now or _alive_here(w.lease.holder)]",
        "tests/test_leases.py::test_delete_wait_right_after_a_killed_create_releases_without_waiting_out_the_lease"),
    "cli-does-not-wait-for-the-lease": (
        "weightkeeper/runs.py", "        if isinstance(blocker, str) or not WAIT_FOR_LEASE.get():",
        "        if True:",
        "tests/test_leases.py::test_a_live_holder_on_another_host_is_waited_for_with_a_line_then_taken_over"),
    "limit-creation-race": ("weightkeeper/runtime.py", "            except ObjectAlreadyExists:  # another run",
                            "            except ZeroDivisionError:  # another run",
                            "tests/test_slots.py::test_a_limit_another_run_creates_meanwhile_is_resized_not_an_error"),
    "worker-outlives-serve": (
        "weightkeeper/__init__.py", "    exit_with_parent(int(parent))", "    pass",
        "tests/test_serve.py::test_a_worker_exits_with_the_serve_that_started_it_even_when_that_is_killed"),
    "mutants-of-flows-and-tasks-not-applied": (
        "tests/mutations.py", '    for package in ("flows", "tasks"):\n', "    for package in ():\n",
        "tests/test_mutations.py::test_every_module_of_a_scratch_copy_is_imported_from_the_copy"),
    "containers-share-a-host": (
        "weightkeeper/registry/common.py",
        "    return host if namespace == INIT_PID_NAMESPACE else f\"{host}/{namespace.removeprefix('pid:').strip('[]')}\"",
        "    return host", "tests/test_leases.py::test_a_container_is_a_host_of_its_own"),
    "subflows-of-a-crashed-run-stay-running": (
        "weightkeeper/runs.py", "            if child.deployment_id is None and child.state is not None and not child.state.is_final():",
        "            if False:",
        "tests/test_leases.py::test_create_wait_killed_mid_download_then_ensure_wait_takes_over_at_once"),
    "metrics-open-to-any-user": (
        "weightkeeper/api.py", "and not user(credentials).admin:", "and not user(credentials):",
        "tests/test_metrics.py::test_every_named_metric_is_present_for_an_admin_or_the_scrape_token_only"),
    "metrics-takeover-of-a-reservation": (
        "weightkeeper/registry/leases.py", "    if lease.holder == holder or lease.holder.is_reservation:\n",
        "    if lease.holder == holder:\n",
        "tests/test_metrics.py::test_a_takeover_is_of_another_runs_lease_not_a_reservation_nor_ones_own "
        "tests/test_metrics.py::test_lease_takeovers_count_a_dead_holders_and_a_preempted_run_not_a_reservations"),
    "metrics-cleanup-failure-per-call": (
        "weightkeeper/registry/store.py", "            if attempt > row.cleanup_attempts:\n                self._add(",
        "            if True:\n                self._add(",
        "tests/test_metrics.py::test_a_cleanup_failure_moves_its_counter_once_per_attempt"),
    "metrics-slot-waiters-without-live-lease": (
        "weightkeeper/registry/metrics.py", "live, waiting = LeaseRow.expires_at > utcnow(), {}",
        "live, waiting = LeaseRow.expires_at.is_not(None), {}",
        "tests/test_metrics.py::test_slot_waiters_are_counted_from_live_leases_so_a_crash_does_not_leak"),
    "metrics-served-when-downloaded": (
        "tasks/download.py", "ready = served = recorded.state == A_READY and is_ready(copy, snapshot.commit)",
        "served = True; ready = recorded.state == A_READY and is_ready(copy, snapshot.commit)",
        "tests/test_metrics.py::test_a_path_linked_to_a_shared_copy_counts_as_served_not_downloaded"),
    "metrics-failed-fetch-timed": (
        "tasks/download.py", "        if error is None:\n            self.registry.record(DOWNLOAD_SECONDS",
        "        if True:\n            self.registry.record(DOWNLOAD_SECONDS",
        "tests/test_metrics.py::test_a_fetch_counts_the_bytes_it_transferred_even_when_it_fails_and_its_time_only_when_complete"),
    "metrics-failed-fetch-bytes-lost": (
        "tasks/download.py", "        self.most = max(self.most, present)\n", "        self.most = present\n",
        "tests/test_metrics.py::test_a_fetch_counts_the_bytes_it_transferred_even_when_it_fails_and_its_time_only_when_complete"),
    "list-tie-breaker-dropped": (
        "weightkeeper/registry/listing.py", '"created": (ModelRow.created_at, ModelRow.name),',
        '"created": (ModelRow.created_at,),',
        "tests/test_listing.py::test_a_cursor_walk_sees_each_model_once_while_models_are_created_and_deleted"),
    "list-visibility-dropped": (
        "weightkeeper/registry/listing.py", "        where = [self._visible(viewer)]\n", "        where = []\n",
        "tests/test_listing.py::test_visibility_in_sql_is_the_rule_and_pages_stay_full"),
    "list-visibility-by-entries-dropped": (
        "weightkeeper/registry/listing.py",
        "no_targets, targets,\n                   ModelRow.paths.any(LocalPathRow.workspace.in_(public)))",
        "no_targets, targets)", "tests/test_listing.py::test_visibility_in_sql_is_the_rule_and_pages_stay_full"),
    "list-workspace-counts-hidden-entries": (
        "weightkeeper/registry/listing.py",
        "where.append(entry if sees_all or query.workspace in viewer.public else and_(mine, entry))",
        "where.append(entry)",
        "tests/test_listing.py::test_the_workspace_filter_counts_only_the_entries_the_caller_sees"),
    "list-search-reveals-hidden-sources": (
        "weightkeeper/registry/listing.py", "and_(source_shown, ModelRow.source.icontains(", "and_(true(), ModelRow.source.icontains(",
        "tests/test_listing.py::test_search_reaches_only_the_sources_the_caller_is_shown"),
    "list-search-wildcards": (
        "weightkeeper/registry/listing.py", "ModelRow.source.icontains(query.search, autoescape=True)",
        "ModelRow.source.icontains(query.search)", "tests/test_listing.py::test_filters"),
    "list-cursor-not-bound-to-filters": (
        "weightkeeper/registry/listing.py", "if sort != query.sort or digest != query.digest():",
        "if sort != query.sort:", "tests/test_listing.py::test_limits_and_bad_cursors_answer_422_in_one_line"),
    "list-last-page-unmarked": (
        "weightkeeper/registry/listing.py", "if len(models) > limit else None)", "if models else None)",
        "tests/test_listing.py::test_sort_orders"),
    "hub-budget-over-limit": (
        "weightkeeper/registry/budget.py", "    if sum(counts) < limit:", "    if True:",
        "tests/test_budget.py::test_a_budget_grants_its_limit_then_says_when_the_oldest_request_leaves_its_window"),
    "hub-budget-one-fixed-window": (
        "weightkeeper/registry/budget.py", "size = SLOTS + 1 + max(1, math.ceil(MARGIN_SECONDS / length))",
        "size = SLOTS", "tests/test_budget.py::test_no_window_of_the_budget_holds_more_than_its_limit_wherever_it_starts"),
    "hub-budget-429-block-ignored": (
        "weightkeeper/registry/budget.py", "if now < window.blocked_until <= now + seconds:", "if False:",
        "tests/test_budget.py::test_a_429_block_holds_every_request_but_a_block_or_counts_from_a_wrong_clock_do_not"),
    "hub-budget-row-unlocked": (
        "weightkeeper/registry/budget.py", "HubBudgetRow.bucket == bucket).with_for_update()",
        "HubBudgetRow.bucket == bucket)",
        "tests/test_budget.py::test_two_worker_processes_never_take_more_than_the_budget_together"),
    "hub-429-wait-unbounded": (
        "weightkeeper/hubbudget.py", "return min(max(wait, MIN_WAIT_SECONDS), window)",
        "return max(wait, MIN_WAIT_SECONDS)",
        "tests/test_budget.py::test_a_429_waits_the_longest_it_is_told_bounded_by_the_window_and_a_minimum"),
    "hub-ratelimit-past-its-window": (
        "weightkeeper/hubbudget.py", "return float(min(max(waits), max(windows))) if windows else float(max(waits))",
        "return float(max(waits))", "tests/test_budget.py::test_the_ratelimit_header_says_how_long_an_exhausted_bucket_waits"),
    "hub-ratelimit-not-exhausted": (
        "weightkeeper/hubbudget.py", 'if _seconds(item.get("r")) == 0', 'if _seconds(item.get("r")) is not None',
        "tests/test_budget.py::test_the_ratelimit_header_says_how_long_an_exhausted_bucket_waits"),
    "hub-429-not-absorbed": (
        "weightkeeper/hub.py", "if e.response is not None and e.response.status_code == 429:", "if False:",
        "tests/test_budget.py::test_garbage_and_huge_waits_are_bounded_and_cdn_requests_take_nothing"),
    "hub-429-not-counted": (
        "weightkeeper/registry/budget.py", "            row.throttled += 1\n", "",
        "tests/test_budget.py::test_garbage_and_huge_waits_are_bounded_and_cdn_requests_take_nothing"),
    "hub-cdn-counted": (
        "weightkeeper/hub.py", "            if _origin(to.url) == _origin(home):\n                response = budget.call(",
        "            if True:\n                response = budget.call(",
        "tests/test_budget.py::test_garbage_and_huge_waits_are_bounded_and_cdn_requests_take_nothing"),
    "serve-run-limit": ("weightkeeper/serve.py", '"--limit", str(settings.worker_run_limit), ', "",
                        "tests/test_serve.py::test_serve_runs_at_most_its_run_limit_at_once_and_a_burst_waits"),
    "bulk-check-misses-damage": (
        "tasks/verify.py", "            if problems:\n                damaged[copy.path] = str(problems[0])",
        "            if False:\n                damaged[copy.path] = str(problems[0])",
        "tests/test_reconcile.py::test_a_copy_not_due_is_only_size_checked_and_a_size_mismatch_is_repaired"),
    "hash-every-pass": (
        "weightkeeper/verify.py", "        if self.hashes(verified_at):",
        "        if True:",
        "tests/test_reconcile.py::test_a_ready_model_costs_no_hub_request_in_a_pass"),
    "bulk-check-follows-a-file-link": (
        "weightkeeper/verify.py", "st = os.stat(path, dir_fd=root.fd, follow_symlinks=False)",
        "st = os.stat(path, dir_fd=root.fd, follow_symlinks=True)",
        "tests/test_reconcile.py::test_the_bulk_check_never_follows_a_link_planted_in_a_copy"),
    "bulk-check-follows-a-dir-link": (
        "weightkeeper/anchored.py", "        return self._parent[1].descend(name)",
        "        return Dir(os.open(self._parent[1].path(name), os.O_RDONLY | os.O_DIRECTORY), path)",
        "tests/test_reconcile.py::test_the_bulk_check_never_follows_a_link_planted_in_a_copy "
        "tests/test_guard.py::test_opening_paths_in_a_row_never_follows_a_link_planted_at_one"),
    "healthy-copy-repaired": (
        "tasks/verify.py", "    if not problems:\n        if not deep:\n            return \"checked\"",
        "    if not problems and not deep:\n        if not deep:\n            return \"checked\"",
        "tests/test_reconcile.py::test_a_ready_model_costs_no_hub_request_in_a_pass"),
    "reconcile-reads-per-model": (
        "flows/reconcile.py",
        "    manifests = registry.manifests({c.model_id for c in own if due.get(c.path) is not None})\n",
        "    manifests = {k: v for c in own if due.get(c.path) is not None\n"
        "                 for k, v in registry.manifests({c.model_id}).items()}\n",
        "tests/test_reconcile.py::test_a_pass_reads_the_registry_in_the_same_statements_whatever_the_count"),
    "jobs-never-inline": (
        "weightkeeper/config.py", "return pool == self.work_pool and pool not in self.kubernetes_pools", "return False",
        "tests/test_kube.py::test_jobs_of_workspaces_in_the_control_process_pool_run_inside_the_lifecycle_run "
        "tests/test_api.py::test_create_through_the_api_runs_the_deployments_until_ready"),
    "kubernetes-jobs-inline": (
        "weightkeeper/config.py", "return pool == self.work_pool and pool not in self.kubernetes_pools",
        "return pool == self.work_pool",
        "tests/test_kube.py::test_jobs_of_workspaces_in_the_control_process_pool_run_inside_the_lifecycle_run"),
    "slot-423-error-line": (
        "weightkeeper/runtime.py", 'logging.getLogger("prefect._internal.concurrency").addFilter(_SlotRequestFailed())',
        "pass", "tests/test_slots.py::test_a_slot_taken_between_the_read_and_the_ask_is_waited_for_without_an_error_line"),
    "queued-run-gets-a-twin": (
        "flows/reconcile.py", "queued = still_queued(list(lapsed.values())) if lapsed else set()", "queued = set()",
        "tests/test_reconcile.py::test_a_run_queued_behind_busy_workers_keeps_its_reservation_and_gets_no_twin"),
    "reservation-names-no-run": (
        "weightkeeper/runs.py", "    registry.name_reserved_run(name, key, str(run.id))\n", "",
        "tests/test_reconcile.py::test_a_run_queued_behind_busy_workers_keeps_its_reservation_and_gets_no_twin"),
    "copy-checks-not-recorded": (
        "tasks/verify.py", "registry.mark_checked([c.id for c in passed if not c.artifact], [c.id for c in passed if c.artifact], deep)",
        "pass", "tests/test_reconcile.py::test_a_pass_checks_only_the_copies_due_and_records_each_check"),
    "pattern-dotdot": (
        "weightkeeper/layout.py", """        if p.startswith("/") or ".." in p.split("/"):""", """        if False:""",
        "tests/test_patterns.py::test_patterns_are_refused_outside_the_repository"),
    "copy-name-ignores-selection": (
        "weightkeeper/layout.py", "    if include is None and exclude is None:\n        return commit",
        "    if True:\n        return commit",
        "tests/test_patterns.py::test_each_selection_of_a_commit_has_its_own_copy_name "
        "tests/test_patterns.py::test_shared_copies_are_kept_apart_by_selection"),
    "guard-copy-any-suffix": (
        "weightkeeper/layout.py", r'''COPY = re.compile(r"[0-9a-f]{40}(\.[0-9a-f]{16})?")''',
        r'''COPY = re.compile(r"[0-9a-f]{40}(\..*)?")''',
        "tests/test_patterns.py::test_the_guard_takes_a_selection_copy_and_nothing_like_it"),
    "shared-path-any-selection": (
        "weightkeeper/registry/store.py", " and patterns == _patterns(include, excluded))]", ")]",
        "tests/test_patterns.py::test_a_path_is_not_shared_between_selections"),
    "include-adds-to-default": (
        "weightkeeper/planning.py", "allow_patterns=list(include), ignore_patterns=ignore))",
        "allow_patterns=[*include, *ALLOW_PATTERNS], ignore_patterns=ignore))",
        "tests/test_patterns.py::test_include_fetches_exactly_what_it_matches_and_exclude_never "
        "tests/test_patterns.py::test_a_gguf_repository_downloads_only_the_quantization_asked_for"),
    "capacity-off-by-one": (
        "weightkeeper/planning.py", "    if stored + adding <= capacity:", "    if stored + adding < capacity:",
        "tests/test_capacity.py::test_the_capacity_is_reached_exactly_and_never_passed "
        "tests/test_capacity.py::test_a_model_past_the_capacity_is_refused_with_both_numbers"),
    "slot-wait-writes-every-poll": (
        "weightkeeper/runtime.py", "beat(message=message, force=message != shown)",
        "beat(message=message, force=True)",
        "tests/test_lifecycle.py::test_download_cap_is_never_exceeded"),
    "capacity-ignores-filling-copies": (
        "weightkeeper/registry/store.py", "size if size is not None else sum(f.get(\"size\") or 0 for f in files or ())",
        "size or 0",
        "tests/test_capacity.py::test_a_shared_copy_being_filled_counts_at_its_files_then_at_its_measured_size"),
    "capacity-ignores-pending": (
        "weightkeeper/registry/store.py", "func.coalesce(LocalPathRow.size_bytes, ModelRow.size_bytes)",
        "LocalPathRow.size_bytes",
        "tests/test_capacity.py::test_a_pending_model_counts_at_its_size_so_a_burst_cannot_pass_the_capacity"),
    "reuse-unverified": (
        "weightkeeper/reuse.py", "good = os.fstat(fd).st_size == remote.size and _digest(fd, remote) == expected_digest(remote)",
        "good = True",
        "tests/test_reuse.py::test_a_copy_changed_since_it_was_verified_or_swapped_for_a_link_is_fetched_not_passed_on"),
    "reuse-follows-links": (
        "weightkeeper/anchored.py", "        fd = src.open(name, os.O_RDONLY)\n",
        "        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=src.fd)\n",
        "tests/test_reuse.py::test_a_copy_changed_since_it_was_verified_or_swapped_for_a_link_is_fetched_not_passed_on"),
    "repair-fetches-all": (
        "tasks/verify.py", "    if missing and reuse_into(settings, registry, model, snapshot, root, missing, workspace, cluster) and all(",
        "    if False and all(",
        "tests/test_reuse.py::test_a_repair_takes_a_lost_file_from_another_copy_before_fetching"),
    "switch-before-verified": (
        "tasks/download.py", "                recorded = registry.get_artifact(artifact.id)  # read",
        "                if switch:\n                    parent.symlink(link_target(entry.path, path), name)\n"
        "                recorded = registry.get_artifact(artifact.id)  # read",
        "tests/test_tracking.py::test_a_tracked_model_switches_to_the_new_commit_atomically_reusing_what_did_not_change"),
    "switched-copy-no-grace": (
        "weightkeeper/registry/updates.py", "                copy.released_at = now\n", "                pass\n",
        "tests/test_tracking.py::test_a_tracked_model_switches_to_the_new_commit_atomically_reusing_what_did_not_change"),
    "failed-switch-fails-path": (
        "weightkeeper/registry/updates.py", "                p.message, p.updated_at = scrub_message(failed), utcnow()",
        "                p.status, p.message = \"Failed\", scrub_message(failed)",
        "tests/test_tracking.py::test_a_failing_download_of_the_new_commit_leaves_the_model_ready_on_the_old_one"),
    "tracked-never-due": (
        "weightkeeper/desired.py", "    return head_checked_at is None or interval <= 0 or \\\n", "    return False and head_checked_at is None or interval <= 0 or \\\n",
        "tests/test_tracking.py::test_a_tracked_ready_model_is_due_once_per_interval_or_when_a_revision_is_asked_for"),
    "fill-trusts-found-files": (
        "tasks/download.py", "    found = {f.path for f in snapshot.files if in_place(copy, f)}\n", "    found = set()\n",
        "tests/test_sharing.py::test_shared_copy_is_verified_before_it_is_used"),
    "switch-fills-from-old-staging": (
        "weightkeeper/sources.py", " and staging_uri.endswith(f\"/{copy}/\")", "",
        "tests/test_tracking.py::test_a_staged_model_switches_from_the_hub_not_from_its_old_commits_staged_copy"),
    "reuse-across-tokens": (
        "weightkeeper/registry/copies.py", "        same_token = ModelRow.token_block.is_not_distinct_from(token_block)\n",
        "        same_token = ModelRow.id.is_not(None)\n",
        "tests/test_reuse.py::test_a_gated_repositorys_files_never_reach_a_model_without_its_token"),
    "shared-copy-without-access": (
        "tasks/download.py", "                    if not registry.fetched_with(artifact.id, model.token_block, model.name):",
        "                    if False:",
        "tests/test_reuse.py::test_a_gated_repositorys_files_never_reach_a_model_without_its_token"),
    "staged-copy-without-access": (
        "tasks/stage.py", "            if skipped:  # another model staged them", "            if False:  # another model staged them",
        "tests/test_s3.py::test_a_gated_repositorys_staged_copy_never_reaches_a_model_without_its_token"),
    "signed-path-query-kept": (
        "weightkeeper/errors.py", '    return _PATH.sub(lambda m: m[1] + "?…", _URL.sub(',
        '    return _PATH.sub(lambda m: m[0], _URL.sub(',
        "tests/test_hub_answers.py::test_a_signed_url_that_cannot_be_reached_never_reaches_a_message_or_a_log"),
    "urllib3-retries-log-signed-urls": (
        "weightkeeper/download.py", "    logging.getLogger(_name).addFilter(RedactUrls())", "    pass",
        "tests/test_hub_answers.py::test_a_signed_url_that_cannot_be_reached_never_reaches_a_message_or_a_log"),
    "link-swap-keeps-what-it-swapped-out": (
        "weightkeeper/anchored.py", "            if not self.is_link(tmp):  # what was swapped out",
        "            if False:  # what was swapped out",
        "tests/test_attacks.py::test_symlink_creates_or_swaps_a_link_and_leaves_anything_else_alone"),
    "link-renamed-over-anything": (
        "weightkeeper/anchored.py", ("        if not self.is_link(name):\n            raise refused\n",
                                     "            if not _rename2(self.fd, tmp, name, RENAME_EXCHANGE):"),
        ("", "            if True:"),
        "tests/test_attacks.py::test_symlink_creates_or_swaps_a_link_and_leaves_anything_else_alone "
        "tests/test_attacks.py::test_a_path_filled_while_its_shared_copy_downloads_is_left_to_the_user"),
    "ranges-trusted-beyond-the-file": (
        "weightkeeper/download.py", "        return [Part(p.start, p.end, min(p.done, max(have - p.start, 0))) for p in parts]",
        "        return parts",
        "tests/test_attacks.py::test_a_planted_ranges_file_neither_blocks_nor_floods_the_download"
        " tests/test_download.py::test_saved_progress_is_used_only_when_it_fits_the_file"),
    "model-dir-opened-by-name": (
        "weightkeeper/fsops.py", "        d = parent.make_dir(name)  # never one put there meanwhile",
        "        d = parent.descend(name, create=True)",
        "tests/test_attacks.py::test_a_directory_renamed_onto_the_path_while_it_is_made_is_never_adopted"),
    "made-dir-not-checked": (
        "weightkeeper/anchored.py", "            ours = not os.listdir(fd) and os.fstat(fd).st_uid == _owner_of_a_file_made_in(fd)",
        "            ours = True",
        "tests/test_attacks.py::test_make_dir_refuses_a_taken_name_and_a_swapped_directory"),
    "reuse-copies-before-the-size-check": (
        "weightkeeper/anchored.py", "            if st.st_size != size:\n", "            if False:\n",
        "tests/test_reuse.py::test_a_planted_file_of_another_size_is_refused_before_any_byte_is_copied"),
    "token-follows-to-hub-origins": (
        "weightkeeper/hub.py", "        if _origin(target) != _origin(home):\n            return target",
        "        if not __import__('huggingface_hub.utils._http', fromlist=['_']).\\\n"
        "                _is_same_or_hub_host(url, target):\n            return target",
        "tests/test_hub_answers.py::test_the_token_never_follows_a_redirect_to_huggingface_co_from_another_endpoint"),
    "listing-follows-any-redirect": (
        "weightkeeper/hub.py", "                if (to := route(_joined(to.url, hop), home, redirect_hosts)).problem:",
        "                if (to := Route(_joined(to.url, hop))).problem:",
        "tests/test_hub_answers.py::test_a_listing_redirected_to_another_origin_is_refused"),
    "redirect-host-resolved-again": (
        "weightkeeper/hub.py", "    if not to.addresses or isinstance(pool, urllib3.ProxyManager):",
        "    if True:",
        "tests/test_hub_answers.py::test_a_cdn_whose_dns_answer_changes_after_the_check_is_reached_where_it_was_checked"),
    "pinned-tls-name-unchecked": (
        "weightkeeper/hub.py", '"assert_hostname": tls_name})', '"assert_hostname": False})',
        "tests/test_hub_answers.py::test_a_cdn_whose_dns_answer_changes_after_the_check_is_reached_where_it_was_checked"),
    "own-copy-identity-unchecked": (
        "tasks/verify.py", "                    problems = _replaced(d, copy.path, copy.made) or (",
        "                    problems = (copy.artifact and _replaced(d, copy.path, copy.made)) or (",
        "tests/test_attacks.py::test_a_model_directory_replaced_after_it_was_made_fails_the_model_at_the_next_pass"),
    "own-copy-identity-unchecked-by-its-task": (
        "tasks/verify.py",
        "        problems = (own is not None and _replaced(own, entry.path, entry.made)) or _check(own, files, deep, settings)",
        "        problems = _check(own, files, deep, settings)",
        "tests/test_attacks.py::test_a_model_directory_replaced_after_it_was_made_fails_the_model_at_the_next_pass"),
    "ipv6-embedded-ipv4-ignored": (
        "weightkeeper/hub.py", ("        if ip.is_site_local or ip in LOCAL_NAT64:", "        ip = embedded or ip"),
        ("        if False:", "        ip = ip"),
        "tests/test_hub_answers.py::test_an_ipv6_address_that_carries_an_ipv4_address_is_of_that_ones_kind"),
    "s3-listed-key-outside-prefix": (
        "weightkeeper/s3.py", "    if not isinstance(key, str) or not key.startswith(prefix):",
        "    if not isinstance(key, str):",
        "tests/test_s3.py::test_a_listing_that_names_others_objects_never_gets_them_deleted"),
    "s3-listed-key-climbs-out": (
        "weightkeeper/s3.py", '    if segments and rest and {"", ".", ".."} & set(',
        '    if False and {"", ".", ".."} & set(',
        "tests/test_s3.py::test_a_listing_that_names_others_objects_never_gets_them_deleted"),
    "s3-listing-led-on": (
        "weightkeeper/s3.py", "        if empty >= EMPTY_PAGES:", "        if False:",
        "tests/test_s3.py::test_a_listing_that_never_ends_or_is_out_of_order_is_refused"),
    "s3-listing-page-unbounded": (
        "weightkeeper/s3.py", "        if len(contents) > LIST_PAGE:", "        if False:",
        "tests/test_s3.py::test_a_listing_that_never_ends_or_is_out_of_order_is_refused"),
    "s3-listing-order-unchecked": (
        "weightkeeper/s3.py", "    if previous is not None and key <= previous:", "    if False:",
        "tests/test_s3.py::test_a_listing_that_never_ends_or_is_out_of_order_is_refused"),
    "s3-listed-key-control-character": (
        "weightkeeper/s3.py", "    if any(ord(c) < 32 or ord(c) == 127 for c in key):", "    if False:",
        "tests/test_s3.py::test_a_listing_that_never_ends_or_is_out_of_order_is_refused"),
    "staging-scratch-shared-by-commits": (
        "tasks/stage.py", ("        for other in set(scratch.entries()) - {snapshot.copy}:",
                           "        workdir = scratch.descend(snapshot.copy, create=True)"),
        ("        for other in ():", "        workdir = scratch.descend('files', create=True)"),
        "tests/test_s3.py::test_a_staging_runs_leftovers_never_become_another_commits_objects"),
    "staging-scratch-kept-with-the-copy": (
        "tasks/cleanup.py", '    remove_under(settings.home, f"{SCRATCH}/{name}")  # this host\'s leftovers',
        "    0 and remove_under(settings.home, f\"{SCRATCH}/{name}\")  # this host's leftovers",
        "tests/test_s3.py::test_a_staging_runs_leftovers_never_become_another_commits_objects"),
    "api-body-unbounded": (
        "weightkeeper/api.py", "    app.add_middleware(BodyLimit)\n", "",
        "tests/test_api.py::test_a_body_too_big_is_refused_before_it_is_parsed_or_its_sender_checked"),
    "kube-job-token-lent": (
        "tasks/snapshot.py", "        if job_token_not_its_own(settings, model):", "        if False:",
        "tests/test_kube.py::test_a_model_that_names_any_token_block_never_borrows_the_namespaces_token"),
    "page-reads-manifests": (
        "weightkeeper/registry/listing.py",
        "        columns = [c for c in ModelRow.__table__.c if c.name not in MANIFESTS]",
        "        columns = list(ModelRow.__table__.c)",
        "tests/test_listing.py::test_a_page_or_a_models_answer_never_reads_the_manifests"),
    "cursor-key-unbounded": (
        "weightkeeper/registry/listing.py", "            raise ValueError(key)  # no column holds it: a forged cursor",
        "            pass", "tests/test_listing.py::test_a_forged_cursor_that_no_column_could_hold_answers_422"),
    "subpath-shown-to-others": (
        "weightkeeper/tenancy.py", 'OWNER_FIELDS = ("tokenBlock", "stagingUri", "message", "subpath")',
        'OWNER_FIELDS = ("tokenBlock", "stagingUri", "message")',
        "tests/test_tenancy.py::test_others_see_only_public_models_without_secrets_paths_or_messages"),
    "private-targets-shown-to-others": (
        "weightkeeper/tenancy.py", '    if out["targets"] is not None:', "    if False:",
        "tests/test_tenancy.py::test_others_see_only_public_models_without_secrets_paths_or_messages"),
    "nesting-names-others-model": (
        "weightkeeper/registry/store.py", "named(other.name, owner not in (None, other.owner_name))",
        "named(other.name, False)",
        "tests/test_tenancy.py::test_others_see_only_public_models_without_secrets_paths_or_messages"),
    "taken-path-names-others-model": (
        "weightkeeper/registry/store.py", "named(holder, not names_others and owner != spec.owner_name)",
        "named(holder, False)",
        "tests/test_tenancy.py::test_others_see_only_public_models_without_secrets_paths_or_messages"),
    "private-workspace-named-in-refusal": (
        "weightkeeper/planning.py", ("        usable = [w.name for w in workspaces if w.usable_by(owner)]",
                                     "        if (refused := next((n for n in names if n not in usable), None)) is not None:"),
        ("        usable, known = [w.name for w in workspaces if w.usable_by(owner)], list(by_name)",
         "        if (refused := next((n for n in names if n not in known), None)) is not None:"),
        "tests/test_layout.py::test_plan_private_workspace_rules tests/test_tenancy.py::test_others_see_only_public_models_without_secrets_paths_or_messages"),
    "names-that-collide-accepted": (
        "weightkeeper/download.py", "    if problem := collision([f.path for f in snapshot.files]):", "    if False:",
        "tests/test_hub_answers.py::test_a_repository_whose_folder_takes_the_ready_markers_place_is_refused_before_any_byte"),
    "listing-without-deadline": (
        "weightkeeper/watchdog.py", "    if late.is_set():\n        raise BodyRefused(", "    if False:\n        raise BodyRefused(",
        "tests/test_hub_answers.py::test_a_listing_that_drips_or_floods_is_cut"),
    "listing-deadline-waits-for-a-read": (
        "weightkeeper/watchdog.py", "        response.shutdown()\n", "        pass\n",
        "tests/test_hub_answers.py::test_a_listing_whose_chunked_trailers_never_end_is_cut_at_the_deadline"),
    "listing-unbounded": (
        "weightkeeper/watchdog.py", "            if len(body) > cap:", "            if False:",
        "tests/test_hub_answers.py::test_a_listing_that_drips_or_floods_is_cut"),
    "listing-inflated": (
        "weightkeeper/hub.py", '.strip().lower()) != "identity":', '.strip().lower()) == "never":',
        "tests/test_hub_answers.py::test_a_listing_sent_compressed_is_refused_before_it_is_inflated"),
    "redirect-first-address-only": (
        "weightkeeper/hub.py", ("    for address in to.addresses[:-1]:", "    return at(to.addresses[-1]).urlopen("),
        ("    for address in ():", "    return at(to.addresses[0]).urlopen("),
        "tests/test_hub_answers.py::test_a_cdn_whose_dns_answer_changes_after_the_check_is_reached_where_it_was_checked"),
    "copy-adopted-where-it-stands": (
        "weightkeeper/fsops.py", "        return own_directory(parent, name, path, made, COPY_REMEDY)",
        "        return parent.descend(name, create=True), made or LEGACY",
        "tests/test_attacks.py::test_a_shared_copy_planted_before_any_model_is_never_adopted_trusted_or_removed"),
    "copy-identity-unchecked": (
        "tasks/verify.py", "    if made_here(d, made):", "    if True:",
        "tests/test_attacks.py::test_a_shared_copy_replaced_after_it_was_made_fails_its_models_and_is_left_in_place"),
    "copy-collected-whatever-stands": (
        "tasks/cleanup.py", ("open_copy(artifact.path, settings.volume_rules, artifact.made)",
                             "remove_model_path(artifact.path, settings.volume_rules, artifact.made, artifact=True)"),
        ('open_copy(artifact.path, settings.volume_rules, "legacy")',
         'remove_model_path(artifact.path, settings.volume_rules, "legacy", artifact=True)'),
        "tests/test_attacks.py::test_a_shared_copy_replaced_after_it_was_made_fails_its_models_and_is_left_in_place"),
    "identity-with-device-number": (
        "weightkeeper/fsops.py", 'made.rpartition(":")[2] == d.identity().rpartition(":")[2]', "made == d.identity()",
        "tests/test_attacks.py::test_make_dir_refuses_a_taken_name_and_a_swapped_directory"),
    "collect-crashes-on-a-gone-copy": (
        "tasks/cleanup.py", '            except FileNotFoundError:\n                done = "forgotten (already gone)"\n', "",
        "tests/test_sharing.py::test_a_shared_copy_removed_by_hand_is_forgotten_when_its_last_model_goes"),
    "legacy-copy-never-adopted": (
        "tasks/verify.py", "                        found[copy.id] = d.identity()", "                        pass",
        "tests/test_sharing.py::test_a_copy_recorded_before_identities_gets_its_own_after_a_full_hash"),
    "listing-token-leaves-origin": (
        "weightkeeper/hub.py", "_get(to, headers if own else anonymous, urllib3.Timeout(left))",
        "_get(to, headers, urllib3.Timeout(left))",
        "tests/test_hub_answers.py::test_a_listing_redirected_to_another_origin_is_refused"),
    "sizing-waits-for-budget": (
        "weightkeeper/service.py", "        if seconds is not None:\n            raise UnavailableError(",
        "        if False:\n            raise UnavailableError(",
        "tests/test_capacity.py::test_sizing_at_creation_never_waits_for_a_spent_hub_budget"),
    "tracked-path-shared": (
        "weightkeeper/registry/store.py", "exclude.download_policy == REUSE_IF_EXISTS and not exclude.track",
        "exclude.download_policy == REUSE_IF_EXISTS",
        "tests/test_tracking.py::test_a_tracked_model_shares_its_path_with_no_other_model"),
    "hard-link-of-a-writable-inode": (
        "weightkeeper/anchored.py", "                if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):",
        "                if False:",
        "tests/test_reuse.py::test_a_file_someone_else_may_write_is_copied_never_linked"),
    "update-ignores-capacity": (
        "tasks/switch.py", "            return f\"update to {snapshot.commit} held: {problem}; it stays on {model.commit}\"",
        "            return None",
        "tests/test_tracking.py::test_an_update_past_the_workspace_capacity_is_held_with_a_message"),
    "shared-copy-across-owners": (
        "tasks/download.py", "                         maker_uid=model.owner_uid if owners else None)",
        "                         maker_uid=None)",
        "tests/test_kube.py::test_a_shared_copy_written_by_one_owners_job_never_reaches_another_owners_model"),
    "copy-shelf-open-to-others": (
        "weightkeeper/fsops.py", "    if not d.shut_to_others(maker):", "    if False:",
        "tests/test_kube.py::test_a_shared_copy_is_never_made_below_a_directory_someone_else_can_write"),
    "copy-shelf-mode-unchecked": (
        "weightkeeper/anchored.py", "        return not st.st_mode & 0o022 and (st.st_uid",
        "        return (st.st_uid",
        "tests/test_kube.py::test_a_shared_copy_is_never_made_below_a_directory_someone_else_can_write"),
    "artifacts-dir-of-a-uid-unguarded": (
        "weightkeeper/layout.py", 'ARTIFACTS = re.compile(r"_artifacts(\\.[1-9][0-9]{0,9})?")',
        'ARTIFACTS = re.compile(r"_artifacts")',
        "tests/test_guard.py::test_model_cleanup_never_enters_the_shared_copies "
        "tests/test_layout.py::test_subpath_never_enters_the_shared_copies"),
    "headers-without-deadline": (
        "weightkeeper/hub.py", "        timer.daemon = True\n        timer.start()\n", "        timer.daemon = True\n",
        "tests/test_hub_answers.py::test_an_answer_whose_headers_drip_is_cut_at_the_deadline"),
    "headers-cut-but-answer-kept": (
        "weightkeeper/hub.py", "        if late.is_set():  # cut: the headers read until then, as if they had ended",
        "        if False:",
        "tests/test_hub_answers.py::test_an_answer_whose_headers_drip_is_cut_at_the_deadline"),
    "cleanup-removes-by-name-after-check": (
        "weightkeeper/fsops.py",
        "                d.clear()  # through the directory checked: never the one renamed to its name meanwhile\n"
        "                if not parent.rmdir_if(name, os.fstat(d.fd), strict=True):",
        "                pass\n            if not parent.remove(name):",
        "tests/test_attacks.py::test_a_directory_exchanged_for_the_model_after_its_check_is_never_emptied"),
    "remove-rmdirs-what-took-the-name": (
        "weightkeeper/anchored.py", "        if not same(now):\n            return False",
        "        if False:\n            return False",
        "tests/test_attacks.py::test_a_directory_exchanged_for_the_model_after_its_check_is_never_emptied"),
    "owners-shelf-refused-to-the-service": (
        "weightkeeper/fsops.py", '    maker = shelf_uid(path)\n',
        "    maker = None\n", "tests/test_kube.py::test_the_service_repairs_a_copy_an_owners_job_made"),
    "link-scan-stops-at-an-unreadable-directory": (
        "weightkeeper/sharing.py", "        except OSError as e:  # a directory this process may not read",
        "        except ValueError as e:  # a directory this process may not read",
        "tests/test_sharing.py::test_a_directory_the_service_may_not_read_keeps_the_copy_and_the_pass_goes_on"),
    "size-of-whatever-stands-there": (
        "weightkeeper/fsops.py", "                if made == LINK or not made_here(d, made):", "                if False:",
        "tests/test_attacks.py::test_an_empty_directory_swapped_in_before_the_size_is_measured_is_never_recorded"),
    "shelf-unchecked-at-the-full-hash": (
        "weightkeeper/fsops.py",
        "    try:\n        with _shelf(path, volumes):\n            return None", "    try:\n        return None",
        "tests/test_sharing.py::test_a_copy_whose_directories_others_may_write_is_failed_and_hashed_before_it_is_used_again"),
    "marker-trusted-after-a-failed-repair": (
        "tasks/download.py", "ready = served = recorded.state == A_READY and is_ready(", "ready = served = is_ready(",
        "tests/test_sharing.py::test_a_copy_whose_directories_others_may_write_is_failed_and_hashed_before_it_is_used_again"),
    "lock-readable-by-all": (
        "weightkeeper/sharing.py", "    if st.st_mode & 0o077:\n        os.fchmod", "    if False:\n        os.fchmod",
        "tests/test_sharing.py::test_no_one_else_can_hold_a_shared_copys_lock"),
    "head-connection-reused-unread": (
        "weightkeeper/hub.py", "        response.drain_conn()  # a HEAD's answer", "        pass  # a HEAD's answer",
        "tests/test_hub_answers.py::test_a_file_the_hub_redirects_within_its_own_origin_is_found_on_the_same_connection"),
    "hub-pools-without-header-deadline": (
        "weightkeeper/hub.py", '            _pools[proxy].pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}\n', "",
        "tests/test_hub_answers.py::test_an_answer_whose_headers_drip_is_cut_at_the_deadline"),
    "cleanup-releases-a-directory-still-written": (
        "weightkeeper/fsops.py", "parent.rmdir_if(name, os.fstat(d.fd), strict=True)", "parent.rmdir_if(name, os.fstat(d.fd))",
        "tests/test_attacks.py::test_a_download_still_writing_after_the_directory_was_emptied_keeps_the_model_until_it_is_gone"),
    "another-process-of-the-run-is-own": (
        "weightkeeper/registry/leases.py", "    return lease is None or lease.holder == holder or abandoned(",
        "    return lease is None or lease.holder.run == holder.run or abandoned(",
        "tests/test_leases.py::test_takeover_rule_over_every_combination "
        "tests/test_leases.py::test_a_second_process_of_one_run_is_another_holder"),
    "lease-held-by-the-run-alone": (
        "weightkeeper/registry/leases.py",
        "    return (row.holder, row.host, row.pid, row.started) == (holder.run, holder.host, holder.pid, holder.started)",
        "    return row.holder == holder.run", "tests/test_leases.py::test_a_second_process_of_one_run_is_another_holder"),
    "ready-vouched-without-the-lease": (
        "weightkeeper/registry/store.py",
        "                    return status == p.status == READY and p.size_bytes == size_bytes",
        "                    pass",
        "tests/test_leases.py::test_a_run_whose_lease_was_dropped_never_marks_the_path_ready"),
    "holder-never-stops-unrenewed": (
        "weightkeeper/lease.py", "return self.lost.is_set() or self.stop.is_set() or self.lapsing",
        "return self.lost.is_set() or self.stop.is_set()",
        "tests/test_leases.py::test_a_holder_cut_off_from_the_registry_stops_before_its_lease_lapses"),
    "delete-blind-to-failed-over-workspaces": (
        "tasks/cleanup.py", "        if ws.kubernetes is not None and ws.cluster in clusters:",
        "        if ws.kubernetes is not None and ws.name in {p.workspace for p in model.local_paths}:",
        "tests/test_kube.py::test_delete_waits_for_a_pod_left_in_the_workspace_a_path_failed_over_from"),
    "delete-reads-one-page-of-runs": (
        "tasks/cleanup.py", "            read += len(page)\n", "            read += len(page)\n            break\n",
        "tests/test_kube.py::test_delete_waits_for_a_pod_left_in_the_workspace_a_path_failed_over_from"),
    "revision-moves-a-shared-link": (
        "weightkeeper/registry/updates.py",
        "            if shared := next((p.path for p in row.paths if not p.retired and self._shared(s, row, p)), None):",
        "            if shared := None:",
        "tests/test_tracking.py::test_model_update_refuses_a_revision_while_another_owners_model_shares_the_path"),
    "switch-claims-a-shared-link": (
        "weightkeeper/registry/updates.py",
        "            if not back and self._shared(s, row, p):  # another model took the path",
        "            if False:  # another model took the path",
        "tests/test_tracking.py::test_model_update_refuses_a_revision_while_another_owners_model_shares_the_path"),
    "switch-on-the-namespaces-token": (
        "tasks/switch.py",
        "    held = _refused(settings, registry, model, snapshot) or _held(settings, registry, model, snapshot)",
        "    held = _held(settings, registry, model, snapshot)",
        "tests/test_kube.py::test_a_switch_proves_the_models_own_token_on_the_new_commit"),
    "own-copy-repair-unhashed": (
        "tasks/verify.py",
        "        if not (problems := verify_copy(root, snapshot.files, deep=True, workers=settings.verify_workers)):",
        "        if not (problems := []):",
        "tests/test_reconcile.py::test_repairing_a_size_mismatch_hashes_the_whole_own_copy_before_it_counts_as_verified"),
    "job-process-dumpable": (
        "weightkeeper/kube.py", "    if not os.environ.get(JOB_MARK):\n        return", "    if True:\n        return",
        "tests/test_kube.py::test_a_jobs_secrets_are_not_readable_by_its_owners_other_processes"),
    "prefect-home-open-to-all": (
        "weightkeeper/prefectserver.py", "    _private(home / PREFECT_DIR)\n", "",
        "tests/test_prefectserver.py::test_each_home_keeps_its_own_prefect_server_under_it_and_sees_only_its_own_runs"),
    "prefect-home-left-open": (
        "weightkeeper/prefectserver.py", "    if stat.S_IMODE(directory.lstat().st_mode) & 0o077:", "    if False:",
        "tests/test_prefectserver.py::test_each_home_keeps_its_own_prefect_server_under_it_and_sees_only_its_own_runs"),
    "claim-names-another-users-model": (
        "weightkeeper/registry/store.py", "        return named(self.other, self.foreign)",
        "        return named(self.other, False)",
        "tests/test_tenancy.py::test_a_path_claim_names_no_model_of_another_user "
        "tests/test_s3.py::test_waiting_on_another_users_deleted_staging_names_no_model_of_theirs"),
    "repair-tells-one-users-error-to-all": (
        "tasks/verify.py", "registry.set_users(artifact.id, FAILED, others, {source.owner_name: final})",
        "registry.set_users(artifact.id, FAILED, final)",
        "tests/test_repair.py::test_a_failed_shared_repair_tells_why_only_to_the_owner_of_the_model_it_fetched_for"),
    "idempotency-key-across-users": (
        "weightkeeper/api.py", "return f\"api/{flow}/{model.name}/{model.id}/{mine}\"",
        "return f\"api/{flow}/{model.name}/{key or uuid.uuid4()}\"",
        "tests/test_api.py::test_an_idempotency_key_never_answers_with_another_users_or_an_earlier_models_run"),
    "botocore-debug-unfiltered": (
        "weightkeeper/download.py", "    logging.getLogger(_name).addFilter(DropDebug())", "    pass",
        "tests/test_s3.py::test_botocore_debug_logs_carry_no_session_token_or_signature"),
    "partial-switch-never-goes-back": (
        "weightkeeper/registry/updates.py", "                return self._switch_back(s, row, held)", "                return False",
        "tests/test_tracking.py::test_a_partly_switched_model_goes_back_together_once_its_branch_returns"),
    "claim-switch-relinks-a-settled-path": (
        "weightkeeper/registry/updates.py", "            if _commits(s, [p]).get(p.artifact_id) == row.pending_commit:",
        "            if False:",
        "tests/test_tracking.py::test_a_partly_switched_model_goes_back_together_once_its_branch_returns"),
    "switch-back-recorded-as-a-switch": (
        "weightkeeper/registry/updates.py", "            if row.pending_commit == row.commit:", "            if False:",
        "tests/test_tracking.py::test_a_partly_switched_model_goes_back_together_once_its_branch_returns"),
    "unchecked-head-never-switches-back": (
        "tasks/switch.py", '            return registry.head_checked(name, None, [], held=f"cannot check {revision}',
        '            return 0 * registry.head_checked(name, None, [], held=f"cannot check {revision}',
        "tests/test_tracking.py::test_a_partly_switched_model_goes_back_together_once_its_branch_returns[unknown]"),
    "revision-switch-left-half-done": (
        "flows/ensure_model.py", "        if not model.track and model.pending_commit",
        "        if False and model.pending_commit",
        "tests/test_tracking.py::test_model_update_that_switches_only_some_paths_switches_them_back"),
    "job-command-dumpable": (
        "weightkeeper/kubernetes/base-job-template.json", '                  "weightkeeper.job"\n',
        '                  "prefect"\n',
        "tests/test_kube.py::test_a_run_cannot_override_the_image_command_volumes_or_namespace_of_its_job"),
    "stale-run-fails-a-ready-path": (
        "weightkeeper/registry/store.py", "                if p.status == READY or status == READY:",
        "                if status == READY:", "tests/test_leases.py::test_a_run_whose_lease_was_dropped_never_marks_the_path_ready"),
    "retried-ready-refused": (
        "weightkeeper/registry/store.py",
        "                    return status == p.status == READY and p.size_bytes == size_bytes",
        "                    return False", "tests/test_leases.py::test_a_run_whose_lease_was_dropped_never_marks_the_path_ready"),
    "unheld-ready-over-a-live-run": (
        "weightkeeper/registry/store.py",
        "                if lease is not None and not abandoned(as_lease(lease), utcnow(), this_host()):",
        "                if False:", "tests/test_leases.py::test_a_run_whose_lease_was_dropped_never_marks_the_path_ready"),
    "delete-cancels-runs-named-alike": (
        "tasks/cleanup.py", '            runs += [run for run in page if run.parameters.get("name") == name]',
        "            runs += page",
        "tests/test_kube.py::test_delete_waits_for_a_pod_left_in_the_workspace_a_path_failed_over_from"),
    "switch-back-held-by-a-joined-path": (
        "weightkeeper/registry/updates.py", "if not back and self._shared(s, row, p):", "if self._shared(s, row, p):",
        "tests/test_tracking.py::test_a_partly_switched_path_no_other_model_may_join_until_the_switch_is_settled"),
    "full-hash-marks-a-busy-path-ready": (
        "tasks/verify.py", '            return "busy"  # complete and correct after all, but another run works on the path now',
        "            pass",
        "tests/test_reconcile.py::test_a_full_hash_never_marks_ready_a_path_another_run_works_on"),
    "empty-workspace-name-unchecked": (
        "weightkeeper/planning.py", "        if (refused := next((n for n in names if n not in usable), None)) is not None:",
        "        if refused := next((n for n in names if n not in usable), None):",
        "tests/test_cli.py::test_bad_input_gets_one_line_errors tests/test_api.py::test_refused_requests"),
    "uid-unbounded": ("weightkeeper/config.py", "Field(ge=0, lt=2**32 - 1)", "Field(ge=0)", "tests/test_config.py::test_a_wrong_type_is_one_line_naming_the_key_and_the_file"),
    "download-slots-unbounded": ("weightkeeper/config.py", "        if limit > MAX_DOWNLOAD_SLOTS:", "        if False:",
                                 "tests/test_config.py::test_a_wrong_type_is_one_line_naming_the_key_and_the_file"),
    "registry-url-traceback": ("weightkeeper/registry/store.py",
                               "    except (ArgumentError, ValueError) as e:\n        raise ConfigError(",
                               "    except ZeroDivisionError as e:\n        raise ConfigError(", "tests/test_cli.py::test_bad_input_gets_one_line_errors"),
    "registry-unreachable-traceback": ("weightkeeper/registry/store.py", "    except OperationalError as e:\n        why",
                                       "    except ZeroDivisionError as e:\n        why", "tests/test_cli.py::test_bad_input_gets_one_line_errors"),
    "subpath-unbounded": ("weightkeeper/layout.py", "    if len(subpath) > MAX_SUBPATH:", "    if False:", "tests/test_cli.py::test_bad_input_gets_one_line_errors"),
    "reconcile-every-zero": ("weightkeeper/cli.py", 'p.add_argument("--every", type=_seconds,',
                             'p.add_argument("--every", type=int,', "tests/test_cli.py::test_bad_input_gets_one_line_errors"),
    "runs-outlive-their-worker": (
        "weightkeeper/__init__.py", "if parent := os.environ.get(EXIT_WITH_PARENT_ENV):", "if parent := None:",
        "tests/test_serve.py::test_a_flow_run_of_a_serve_worker_ends_with_it_even_one_that_ignores_sigterm"),
    "orphan-ignoring-sigterm-never-killed": (
        "weightkeeper/prefectserver.py", "        os.kill(os.getpid(), signal.SIGKILL)\n", "",
        "tests/test_serve.py::test_a_flow_run_of_a_serve_worker_ends_with_it_even_one_that_ignores_sigterm"),
    "signal-swallowed-by-the-ranges-wait": (
        "weightkeeper/download.py",
        "                    if not (future.done() and (future.cancelled() or future.exception() is e)):\n"
        "                        raise\n", "",
        "tests/test_download.py::test_a_signal_while_the_ranges_download_stops_them_and_is_raised "
        "tests/test_serve.py::test_a_run_still_downloading_ends_with_serve"),
    "api-booleans-coerced": ("weightkeeper/api.py", "    keepFiles: StrictBool = False", "    keepFiles: bool = False",
                             "tests/test_api.py::test_refused_requests"),
    "api-route-errors-unshaped": ("weightkeeper/api.py", "    @app.exception_handler(StarletteHTTPException)",
                                  "    @app.exception_handler(HTTPException)", "tests/test_api.py::test_refused_requests"),
    "hf-endpoint-unchecked": ("weightkeeper/config.py", '        if url is not None and not http_url(url):',
                              '        if False and not http_url(url):',
                              "tests/test_config.py::test_a_wrong_type_is_one_line_naming_the_key_and_the_file"),
    "orphaned-fetch-goes-on": (
        "weightkeeper/watchdog.py", "                if ORPHANED.is_set():", "                if False:",
        "tests/test_download.py::test_a_download_in_any_thread_stops_once_its_process_is_orphaned"),
    'create-replay-ignored': (
        'weightkeeper/registry/store.py', 'if spec.request_key and existing.request_key == spec.request_key and existing.phase != DELETING:',
        'if False:',
        'tests/test_tenancy.py::test_a_create_repeated_with_its_key_answers_with_its_model_and_no_other_does'),
    'create-replay-any-body': (
        'weightkeeper/api.py', '{caller.name}\\0{key}\\0{body.model_dump_json()}',
        '{caller.name}\\0{key}',
        'tests/test_tenancy.py::test_a_create_repeated_with_its_key_answers_with_its_model_and_no_other_does'),
    'create-replay-any-caller': (
        'weightkeeper/api.py', '{caller.name}\\0{key}\\0{body.model_dump_json()}',
        '{key}\\0{body.model_dump_json()}',
        'tests/test_tenancy.py::test_a_create_repeated_with_its_key_answers_with_its_model_and_no_other_does'),
    'cleanup-undeclared-workspace-unexplained': (
        'tasks/cleanup.py', '        if settings.workspace(entry.workspace) is None:',
        '        if False:',
        'tests/test_lifecycle.py::test_a_path_whose_workspace_left_the_config_keeps_the_model_until_it_is_declared_again'),
    'missing-volume-unexplained': (
        'tasks/download.py', '        if not os.path.isdir(ws.volume):',
        '        if False:',
        'tests/test_lifecycle.py::test_a_volume_missing_on_this_host_fails_the_path_saying_so_and_makes_nothing'),
    'api-empty-workspaces-mean-all': (
        'weightkeeper/api.py', 'Field(default=None, min_length=1, max_length=64,',
        'Field(default=None, max_length=64,',
        'tests/test_tenancy.py::test_over_long_or_control_input_answers_422_and_writes_nothing'),
    'act-on-a-name-not-the-model-seen': (
        'weightkeeper/registry/store.py', 'if row is None or seen is not None and (row.id, _utc(row.created_at)) != (seen.id, seen.created_at):',
        'if row is None:',
        'tests/test_tenancy.py::test_a_delete_or_retry_never_lands_on_the_model_declared_under_its_name_since'),
    'model-seen-by-its-id-alone': (
        'weightkeeper/registry/store.py', 'if row is None or seen is not None and (row.id, _utc(row.created_at)) != (seen.id, seen.created_at):',
        'if row is None or seen is not None and row.id != seen.id:',
        'tests/test_tenancy.py::test_a_delete_or_retry_never_lands_on_the_model_declared_under_its_name_since'),
    'run-key-by-model-id-alone': (
        'weightkeeper/api.py', '{key or uuid.uuid4()}\\0{made}',
        '{key or uuid.uuid4()}',
        'tests/test_tenancy.py::test_a_run_key_is_bound_to_the_model_declared_even_where_its_id_is_reused'),
    'failover-across-tenancy': (
        'weightkeeper/planning.py', '(w.cluster, w.volume, w.public, w.owner) == (here.cluster, here.volume, here.public,\n                                                                                 here.owner)',
        '(w.cluster, w.volume) == (here.cluster, here.volume)',
        'tests/test_kube.py::test_failover_never_moves_a_path_into_or_out_of_sight_of_other_users'),
    'failed-entry-holds-the-path': (
        'weightkeeper/registry/store.py', 'or_(LocalPathRow.made.is_not(None), LocalPathRow.status != FAILED) if holding else true()',
        'true()',
        'tests/test_lifecycle.py::test_a_tokenless_model_of_a_gated_repository_never_keeps_its_files_once_their_owner_deletes_hers'),
    'refused-model-stays-a-copy-user': (
        'tasks/download.py', '            registry.link_path(model.name, entry.id, None)\n        raise',
        '            pass\n        raise',
        'tests/test_lifecycle.py::test_a_tokenless_model_of_a_gated_repository_never_keeps_its_files_once_their_owner_deletes_hers'),
    'api-prefect-down-is-500': (
        'weightkeeper/api.py', '        except (httpx.HTTPError, OSError) as e:  # recorded all the same',
        '        except KeyError as e:  # recorded all the same',
        'tests/test_tenancy.py::test_a_registry_or_prefect_out_of_reach_answers_503_or_records_the_request_for_reconcile'),
    'api-registry-down-is-500': (
        'weightkeeper/api.py', '    @app.exception_handler(OperationalError)\n',
        '',
        'tests/test_tenancy.py::test_a_registry_or_prefect_out_of_reach_answers_503_or_records_the_request_for_reconcile'),
    'budget-by-each-hosts-clock': (
        'weightkeeper/registry/budget.py', '        if self.engine.dialect.name == "postgresql":\n            return float(',
        '        if False:\n            return float(',
        'tests/test_budget.py::test_a_host_whose_clock_is_off_neither_resets_the_budget_nor_blocks_it_for_others'),
    'budget-far-block-kept': (
        'weightkeeper/registry/budget.py', 'kept = row.blocked_until if row.blocked_until <= now + window_seconds else 0.0',
        'kept = row.blocked_until',
        'tests/test_budget.py::test_a_host_whose_clock_is_off_neither_resets_the_budget_nor_blocks_it_for_others'),
    'budget-wait-is-download-time': (
        'weightkeeper/watchdog.py', '                if self.waiting and not self.busy:',
        '                if False:',
        'tests/test_budget.py::test_waiting_for_the_budget_is_no_download_time'),
    'budget-wait-outlives-deletion': (
        'tasks/snapshot.py', '        elif registry.set_message(model.name, budget_message(seconds), live=True):',
        '        elif registry.set_message(model.name, budget_message(seconds)) or True:',
        'tests/test_budget.py::test_a_deletion_stops_a_resolve_waiting_for_the_budget_and_keeps_its_message'),
    'budget-wait-message-left': (
        'tasks/snapshot.py', '                registry.set_message(model.name, model.message, live=True, replacing=BUDGET_WAIT)  # if still ours',
        '                pass',
        'tests/test_budget.py::test_a_head_check_that_waited_for_the_budget_leaves_the_models_message_as_it_was'),
    'repair-only-copies-once-complete': (
        'weightkeeper/registry/copies.py', '                   and_(LocalPathRow.status == FAILED, LocalPathRow.checked_at >= LocalPathRow.updated_at)),',
        '                   LocalPathRow.status == FAILED),',
        'tests/test_reconcile.py::test_a_path_whose_download_failed_is_left_to_its_owner_never_fetched_by_a_pass'),
    'repair-failed-stays-repairable': (
        'weightkeeper/registry/copies.py', '            p.updated_at = p.checked_at = utcnow()',
        '            p.updated_at = utcnow()',
        'tests/test_reconcile.py::test_a_repair_fetches_only_what_fits_from_the_hub_budget_and_a_failed_repair_is_repaired_next_pass'),
    'repair-free-space': (
        'tasks/verify.py', '    if problem := room_problem(d, files, settings.free_space_margin_bytes):',
        '    if False:',
        'tests/test_reconcile.py::test_a_repair_fetches_only_what_fits_from_the_hub_budget_and_a_failed_repair_is_repaired_next_pass'),
    "repair-hub-budget": (
        "tasks/verify.py", "deadline, budget, lambda d, files: _check_room(settings, d, files))",
        "deadline, room=lambda d, files: _check_room(settings, d, files))", 'tests/test_reconcile.py::test_a_repair_fetches_only_what_fits_from_the_hub_budget_and_a_failed_repair_is_repaired_next_pass'),
    'verify-bounded-read': (
        'weightkeeper/verify.py', '    while read <= size and (chunk := os.read(fd, min(READ_CHUNK, size + 1 - read))):',
        '    while chunk := os.read(fd, READ_CHUNK):',
        'tests/test_reconcile.py::test_a_full_hash_never_reads_past_the_recorded_size_of_a_file_its_owner_grows'),
    'verify-opened-file-checked': (
        'weightkeeper/verify.py', '        if problem := _problem(os.fstat(fd), path, size):\n            return problem\n',
        '',
        'tests/test_reconcile.py::test_a_full_hash_never_reads_past_the_recorded_size_of_a_file_its_owner_grows'),
    'links-checked-each-pass': (
        'flows/reconcile.py', '    outcomes = dict(check_links(quote(links))) if links else {}',
        '    outcomes = {}',
        'tests/test_tracking.py::test_a_switch_killed_before_the_registry_recorded_it_is_rolled_back_by_the_next_pass tests/test_sharing.py::test_a_directory_put_in_place_of_the_link_fails_the_path_and_is_left_alone'),
    'links-unrecorded-switch-rolled-back': (
        'tasks/verify.py', '        if not what or target in _switch_targets(settings, link):',
        '        if not what:',
        'tests/test_tracking.py::test_a_switch_killed_before_the_registry_recorded_it_is_rolled_back_by_the_next_pass'),
    'links-others-fail-the-path': (
        'weightkeeper/registry/copies.py', '            if failed and row.phase != DELETING:',
        '            if False:',
        'tests/test_sharing.py::test_a_directory_put_in_place_of_the_link_fails_the_path_and_is_left_alone'),
    'dead-run-lease-kept': (
        'flows/reconcile.py', '            registry.release_run(model.name, lease.lease.holder, abandoned_only=True)  # marked once\n',
        '',
        'tests/test_reconcile.py::test_a_dead_runs_lease_on_a_ready_model_is_marked_crashed_once_then_let_go'),
    'open-regular-removes-a-planted-directory': (
        'weightkeeper/anchored.py', '            self.unlink(name)  # never a directory, even one renamed there since it was opened',
        '            self.remove(name)  # never a directory, even one renamed there since it was opened',
        'tests/test_attacks.py::test_open_regular_never_removes_a_directory_planted_at_its_name tests/test_sharing.py::test_a_lock_someone_else_put_on_an_owners_shelf_is_refused_and_left_alone'),
    'lock-of-another-uid-chmodded': (
        'weightkeeper/sharing.py', '    if st.st_uid != owner and not d.mine(st.st_uid):\n        raise',
        '    if False:\n        raise',
        'tests/test_sharing.py::test_a_lock_someone_else_put_on_an_owners_shelf_is_refused_and_left_alone'),
    'removal-enters-another-owners-directory': (
        'weightkeeper/anchored.py', '            if st.st_uid != here.st_uid:\n                raise LinkInTheWayError',
        '            if False:\n                raise LinkInTheWayError',
        'tests/test_attacks.py::test_removal_never_enters_a_directory_another_user_owns tests/test_sharing.py::test_collecting_a_copy_on_an_owners_shelf_never_empties_another_users_directory'),
    'discard-enters-another-owners-directory': (
        'weightkeeper/sharing.py', '            if (uid := os.fstat(current.fd).st_uid) != os.fstat(copy.fd).st_uid:',
        '            if (uid := os.fstat(current.fd).st_uid) is None:',
        'tests/test_attacks.py::test_removal_never_enters_a_directory_another_user_owns'),
    'made-here-ignores-the-owner': (
        'weightkeeper/fsops.py', '        not maker or int(maker) == owner or owner == shelf_uid(d.where))',
        '        True)',
        'tests/test_attacks.py::test_a_directory_made_again_at_its_inode_by_another_user_is_never_weightkeepers'),
    'identity-without-owner': (
        'weightkeeper/anchored.py', '        return f"{st.st_uid}@{st.st_dev}:{st.st_ino}"',
        '        return f"{st.st_dev}:{st.st_ino}"',
        'tests/test_attacks.py::test_a_directory_made_again_at_its_inode_by_another_user_is_never_weightkeepers'),
    'made-here-refuses-the-shelf-owner': (
        'weightkeeper/fsops.py', 'int(maker) == owner or owner == shelf_uid(d.where))',
        'int(maker) == owner)',
        'tests/test_sharing.py::test_collecting_a_copy_on_an_owners_shelf_never_empties_another_users_directory'),
    'old-identity-never-gets-its-owner': (
        'weightkeeper/fsops.py', '            return d, d.identity() if upgrade else made',
        '            return d, made',
        'tests/test_attacks.py::test_a_directory_made_again_at_its_inode_by_another_user_is_never_weightkeepers'),
    'walk-keeps-every-level-open': (
        'weightkeeper/anchored.py', '                if len(levels) > WALK_OPEN + 1:\n                    levels[-WALK_OPEN - 1].close()',
        '                if False:\n                    levels[-WALK_OPEN - 1].close()',
        'tests/test_attacks.py::test_walk_holds_a_bounded_number_of_descriptors_however_wide_or_deep_the_tree'),
    'walk-reopens-whatever-has-the-name': (
        'weightkeeper/anchored.py', '    if (st.st_dev, st.st_ino) != last.id:',
        '    if False:',
        'tests/test_attacks.py::test_walk_holds_a_bounded_number_of_descriptors_however_wide_or_deep_the_tree'),
    'create-repeat-starts-a-run-again': (
        'weightkeeper/api.py', '        if model.created_at < received:',
        '        if False:',
        'tests/test_tenancy.py::test_a_create_repeated_with_its_key_answers_with_its_model_and_no_other_does'),
    "shared-repair-restores-only-what-it-failed": (
        "weightkeeper/registry/artifacts.py", "if model.phase == DELETING or not (p.status == READY or by_repair(p)):",
        "if model.phase == DELETING:", "tests/test_repair.py::test_a_repaired_shared_copy_never_makes_ready_a_path_whose_link_was_replaced"),
    "shared-repair-marks-what-it-failed": (
        "weightkeeper/registry/artifacts.py", "                p.updated_at = p.checked_at = utcnow()  # Failed so: `by_repair`",
        "                p.updated_at = utcnow()", "tests/test_repair.py::test_a_repaired_shared_copy_never_makes_ready_a_path_whose_link_was_replaced"),
    "shared-repair-short-of-space-or-time-fails-the-copy": (
        "tasks/verify.py", "    except Waits as e:  # the copy stays under repair, every user told why",
        "    except DownloadCancelled as e:  # the copy stays under repair, every user told why", "tests/test_repair.py::test_a_repair_short_of_space_or_time_waits_and_says_why_to_every_user"),
    "repair-no-space-not-told-apart": (
        "tasks/verify.py", "        raise Waits(f\"no space to fetch its files again",
        "        raise DownloadError(f\"no space to fetch its files again", "tests/test_repair.py::test_a_repair_short_of_space_or_time_waits_and_says_why_to_every_user[space]"),
    "repair-deadline-not-told-apart": (
        "tasks/verify.py", "        raise Waits(f\"fetching its files again took",
        "        raise DownloadError(f\"fetching its files again took", "tests/test_repair.py::test_a_repair_short_of_space_or_time_waits_and_says_why_to_every_user[deadline]"),
    "restored-path-unmeasured-escapes": (
        "tasks/verify.py", "    except (OSError, UnsafePathError, NotOursError) as e:\n        _unmeasured(",
        "    except NotFoundError as e:\n        _unmeasured(", "tests/test_repair.py::test_a_link_swapped_in_after_a_repair_fails_the_path_not_the_task"),
    "pod-list-read-deadline": (
        "weightkeeper/pods.py", "read_whole(response, MAX_ANSWER_BYTES, max(0.0, deadline - time.monotonic()))",
        "read_whole(response, MAX_ANSWER_BYTES, 1e9)", "tests/test_kube.py::test_the_pod_check_gives_up_on_an_api_server_that_drips_floods_or_lies[drip]"),
    "pod-list-shape-checked": (
        "weightkeeper/pods.py", "    if not isinstance(items, list) or not all(",
        "    if False and not all(", "tests/test_kube.py::test_the_pod_check_gives_up_on_an_api_server_that_drips_floods_or_lies[not-a-list]"),
    "pods-found-by-model-label": (
        "weightkeeper/pods.py", "        [f\"{MODEL_LABEL}={model_label(model)},{FLOW_LABEL}={DOWNLOAD_FLOW}\"] if model else [])",
        "        [] if model else [])", "tests/test_kube.py::test_a_pod_of_a_run_prefect_no_longer_knows_still_counts"),
    "delete-pods-by-model-label": (
        "tasks/cleanup.py", "for pod in live_pods(target, ids, model=model.name)",
        "for pod in live_pods(target, ids)", "tests/test_kube.py::test_delete_waits_for_a_pod_of_the_model_whose_run_prefect_no_longer_knows"),
    "serve-ignores-later-signals": (
        "weightkeeper/serve.py", "signal.signal(sig, signal.SIG_IGN)",
        "signal.getsignal(sig)", "tests/test_serve.py::test_repeated_sigterms_still_stop_every_worker_before_serve_exits"),
    "serve-exits-when-a-worker-dies": (
        "weightkeeper/serve.py", "                server.should_exit = True",
        "                pass", "tests/test_serve.py::test_serve_exits_with_an_error_when_a_worker_dies_under_the_api"),
    "start-workers-stops-started-on-interrupt": (
        "weightkeeper/serve.py", "        stop(*workers)\n        raise",
        "        raise", "tests/test_serve.py::test_workers_already_started_are_stopped_when_serve_is_interrupted_starting_the_next"),
    "s3-headers-in-time": (
        "weightkeeper/s3.py", "session._pool_classes_by_scheme.update(http=_HTTPPool, https=_HTTPSPool)",
        "session._pool_classes_by_scheme.update()", "tests/test_s3_attacks.py::test_a_listing_that_drips_or_never_ends_is_cut[headers-drip]"),
    "s3-answer-seconds": (
        "weightkeeper/s3.py", "return read_whole(raw, ANSWER_BYTES, ANSWER_SECONDS)",
        "return read_whole(raw, ANSWER_BYTES, ANSWER_SECONDS * 1000)", "tests/test_s3_attacks.py::test_a_listing_that_drips_or_never_ends_is_cut[body-drips]"),
    "s3-answer-bytes": (
        "weightkeeper/s3.py", "return read_whole(raw, ANSWER_BYTES, ANSWER_SECONDS)",
        "return read_whole(raw, ANSWER_BYTES * 1000, ANSWER_SECONDS)", "tests/test_s3_attacks.py::test_a_listing_that_drips_or_never_ends_is_cut[page-without-end]"),
    "s3-error-body-bounded": (
        "weightkeeper/s3.py", "if not streamed or response.status_code >= 300:",
        "if not streamed:", "tests/test_s3_attacks.py::test_an_object_whose_answer_drips_or_never_ends_is_cut[error-without-end]"),
    "s3-list-deadline": (
        "weightkeeper/s3.py", "        if time.monotonic() > deadline:\n            raise DownloadError(",
        "        if False:\n            raise DownloadError(", "tests/test_s3_attacks.py::test_a_listing_that_goes_on_slowly_is_cut_at_its_deadline"),
    "s3-malformed-answers": (
        "weightkeeper/s3.py", "except (BotoCoreError, ClientError, *MALFORMED) as e:",
        "except (BotoCoreError, ClientError) as e:", "tests/test_s3_attacks.py::test_a_listing_out_of_shape_is_refused_in_one_line[no-key]"),
    "s3-listed-size": (
        "weightkeeper/s3.py", "RemoteFile(name, o.get(\"Size\"), \"\", md5=plain.group(1))",
        "RemoteFile(name, o[\"Size\"], \"\", md5=plain.group(1))", "tests/test_s3_attacks.py::test_a_listing_out_of_shape_is_refused_in_one_line[no-size]"),
    "name-length": (
        "weightkeeper/download.py", "any(len(s) > NAME_CHARS for s in p.split(\"/\"))",
        "any(len(s) > 255 for s in p.split(\"/\"))", "tests/test_s3_attacks.py::test_names_a_volume_cannot_all_hold_are_refused[name-too-long] tests/test_hub_answers.py::test_names_that_cannot_all_be_written_are_refused"),
    "name-case-twins": (
        "weightkeeper/download.py", "folded.setdefault(path.casefold(), path)",
        "folded.setdefault(path, path)", "tests/test_s3_attacks.py::test_names_a_volume_cannot_all_hold_are_refused[case-twins] tests/test_hub_answers.py::test_names_that_cannot_all_be_written_are_refused"),
    "name-case-file-and-folder": (
        "weightkeeper/download.py", "    if problem := _collision(list(folded)):",
        "    if problem := None:", "tests/test_s3_attacks.py::test_names_a_volume_cannot_all_hold_are_refused[case-file-and-folder] tests/test_hub_answers.py::test_names_that_cannot_all_be_written_are_refused"),
    "s3-error-redacts-credentials": (
        "weightkeeper/s3.py", "response._content = response._content.replace(secret, b\"...\")",
        "response._content = response._content.replace(secret, secret)", "tests/test_s3_attacks.py::test_an_error_that_repeats_the_credentials_never_shows_them"),
    "s3-error-one-line": (
        "weightkeeper/errors.py", "return line if len(line) <= SAID_CHARS else f\"{line[:SAID_CHARS]}...\"",
        "return line", "tests/test_s3_attacks.py::test_an_error_that_repeats_the_credentials_never_shows_them"),
    "s3-staged-without-size": (
        "weightkeeper/s3.py", "return head.get(\"ContentLength\") == remote.size",
        "return head[\"ContentLength\"] == remote.size", "tests/test_s3_attacks.py::test_a_staged_object_answered_without_a_size_is_staged_again"),
    "stage-deadline-after-slot": (
        "tasks/stage.py", ("    deadline = float(\"inf\")  # set once", "                deadline, before = by, counts[\"uploaded\"]\n"),
        ("    deadline = time.monotonic() + settings.download_timeout_seconds  # set once", "                deadline, before = min(deadline, by), counts[\"uploaded\"]\n"), "tests/test_s3.py::test_waiting_for_a_download_slot_does_not_count_against_the_staging_timeout"),
    "s3-source-object-changed": (
        "weightkeeper/s3.py", "            if _changed(response, remote):\n",
        "            if False:\n", "tests/test_s3_attacks.py::test_a_source_object_replaced_after_listing_fails_at_once_saying_so[same-size]"),
    "cli-broken-pipe-quiet": (
        "weightkeeper/cli.py", "    except BrokenPipeError as e:",
        "    except ZeroDivisionError as e:", "tests/test_cli.py::test_a_reader_that_leaves_stops_the_listing_quietly"),
    "cli-no-markup": (
        "weightkeeper/cli.py", "made = Console(stderr=stderr, markup=False, emoji=False)",
        "made = Console(stderr=stderr)", "tests/test_cli.py::test_messages_and_paths_are_printed_as_they_are_never_as_markup"),
    "cli-redact-error-urls": (
        "weightkeeper/cli.py", "f\"error: {redact_urls(message)}\"",
        "f\"error: {message}\"", "tests/test_cli.py::test_an_error_line_never_shows_a_urls_credentials"),
    "cli-log-unwritable": (
        "weightkeeper/cli.py", "    except OSError as e:\n        raise WeightkeeperError(f\"{flow} not started",
        "    except ValueError as e:\n        raise WeightkeeperError(f\"{flow} not started", "tests/test_cli.py::test_failures_outside_the_registry_get_one_line_without_credentials"),
    "cli-quiet-prefect-setup": (
        "weightkeeper/cli.py", "    ensure_logging_setup()  # else",
        "    pass  # else", "tests/test_cli.py::test_the_terminal_shows_a_runs_log_lines_but_no_traceback"),
    "cli-quiet-no-tracebacks": (
        "weightkeeper/cli.py", "    return not record.exc_info",
        "    return True", "tests/test_cli.py::test_the_terminal_shows_a_runs_log_lines_but_no_traceback"),
    "cli-registry-error-line": (
        "weightkeeper/cli.py", "    except DBAPIError as e:",
        "    except ZeroDivisionError as e:", "tests/test_cli.py::test_a_registry_failing_mid_command_gets_one_line"),
    "cli-interrupt-delete": (
        "weightkeeper/cli.py", "    if args.action == \"delete\":",
        "    if args.action == \"remove\":", "tests/test_cli.py::test_an_interrupt_says_what_resumes_it"),
    "cli-wait-outcome-one-line": (
        "weightkeeper/cli.py", "err_console.print(f\"model {name} is {model.phase}: {model.message}\", soft_wrap=True, highlight=False)",
        "err_console.print(f\"model {name} is {model.phase}: {model.message}\", highlight=False)", "tests/test_cli.py::test_a_failed_wait_ends_with_the_models_message"),
    "cli-phase-choices": (
        "weightkeeper/cli.py", "choices=[phase.value for phase in Phase]",
        "choices=list(Phase)", "tests/test_cli.py::test_a_bad_phase_names_the_phases_as_typed"),
    "metrics-prefect-read-bounded": (
        "weightkeeper/metrics.py", "        return read.result(timeout=PREFECT_READ_SECONDS)",
        "        return read.result()", "tests/test_metrics.py::test_a_prefect_that_hangs_costs_a_scrape_its_slot_gauges_only"),
    "metrics-one-prefect-read": (
        "weightkeeper/metrics.py", "            if self._read is None or self._read.done():",
        "            if True:", "tests/test_metrics.py::test_a_prefect_that_hangs_costs_a_scrape_its_slot_gauges_only"),
    "config-digest-secret-shown": (
        "weightkeeper/config.py", "\"64 hex digits\", secret=True)]",
        "\"64 hex digits\")]", "tests/test_config.py::test_a_token_pasted_where_its_digest_goes_is_never_shown"),
    "registry-url-query-shown": (
        "weightkeeper/registry/store.py", "return parsed.set(query={}).render_as_string(hide_password=True)",
        "return parsed.render_as_string(hide_password=True)", "tests/test_cli.py::test_bad_input_gets_one_line_errors"),
    "registry-url-driver-traceback": (
        "weightkeeper/registry/store.py", "    except ImportError as e:\n        raise ConfigError(",
        "    except ZeroDivisionError as e:\n        raise ConfigError(", "tests/test_cli.py::test_bad_input_gets_one_line_errors"),
    "cleanup-renamed-workspace-removed": (
        "tasks/cleanup.py", "            raise UnsafePathError(_undeclared(settings, entry))",
        "            pass", "tests/test_repair.py::test_a_workspace_renamed_in_the_config_keeps_the_files_and_says_what_to_do"),
    "s3-parts-etag-not-changed": (
        "weightkeeper/s3.py", "    return bool(PARTS_ETAG.fullmatch(etag))",
        "    return False", "tests/test_s3_attacks.py::test_a_source_object_replaced_after_listing_fails_at_once_saying_so[multipart]"),
    "pods-label-finds-cleanups-too": (
        "weightkeeper/pods.py", "[f\"{MODEL_LABEL}={model_label(model)},{FLOW_LABEL}={DOWNLOAD_FLOW}\"]",
        "[f\"{MODEL_LABEL}={model_label(model)}\"]", "tests/test_kube.py::test_a_pod_of_a_run_prefect_no_longer_knows_still_counts"),
    "stale-head-answer-recorded": (
        "weightkeeper/registry/updates.py", "            if asked is not None and asked != (row.next_revision or row.revision):",
        "            if False:", "tests/test_tracking_attacks.py::test_a_revision_asked_for_while_a_check_is_out_is_never_taken_for_the_commit_switched_to[checking]"),
    "switch-settles-a-revision-asked-since": (
        "weightkeeper/registry/updates.py", "            if row.head_checked_at is not None:  # else",
        "            if True:  # else", "tests/test_tracking_attacks.py::test_a_revision_asked_for_while_a_check_is_out_is_never_taken_for_the_commit_switched_to[switching]"),
    "check-drops-a-killed-switchs-commit": (
        "tasks/switch.py", "    _mend_links(settings, registry, model)\n",
        "", "tests/test_tracking_attacks.py::test_a_killed_switch_is_rolled_back_before_a_check_drops_its_pending_commit[reverted]"),
    "capacity-ignores-recorded-switches": (
        "tasks/switch.py", "        coming = registry.switches_coming(model.name, w)",
        "        coming = 0", "tests/test_tracking_attacks.py::test_two_switches_that_each_fit_the_capacity_but_not_together_are_not_both_recorded"),
    "failed-switch-names-the-models-commit": (
        "tasks/switch.py", "    return f\"update to {commit} failed: {why}; {path} stays on {on or model.commit}\"",
        "    return f\"update to {commit} failed: {why}; {path} stays on {model.commit}\"", "tests/test_tracking_attacks.py::test_a_failed_switch_names_the_commit_the_path_is_on_not_the_models"),
    "budget-long-wait-gives-slot-back": (
        "weightkeeper/hubbudget.py", "if self._in_slot and seconds > SLOT_WAIT_SECONDS:",
        "if False:", "tests/test_budget.py"),
    "cli-follow-says-what-stopped-the-run": (
        "weightkeeper/cli.py", "return registry.find_model(name), outcome[0] if outcome else None",
        "return registry.find_model(name), None", "tests/test_cli.py"),
    "api-echoes-made-up-keys": (
        "weightkeeper/api.py", "str(p) if isinstance(p, int) or KEY.fullmatch(p) else \"<key>\" for p in loc",
        "str(p) for p in loc", "tests/test_tenancy.py"),
    "api-lists-every-validation-error": (
        "weightkeeper/api.py", "for e in errors[:SHOWN_ERRORS])",
        "for e in errors)", "tests/test_tenancy.py"),
    "metrics-logs-prefect-url-user-info": (
        "weightkeeper/metrics.py", "redact_urls(str(e)))",
        "e)", "tests/test_metrics.py"),
    "head-unknown-drops-the-pending-switch": (
        "weightkeeper/registry/updates.py", "            if commit is None and not permanent:",
        "            if False:", "tests/test_tracking_attacks.py::test_a_hub_outage_during_the_check_forgets_neither_the_asked_revision_nor_the_pending_switch"),
    "check-drops-a-busy-killed-switchs-commit": (
        "tasks/switch.py", "\"relinked\", \"linked\", \"failed\"):",
        "\"relinked\", \"linked\", \"failed\", \"busy\"):", "tests/test_tracking_attacks.py::test_a_killed_switch_whose_path_is_still_held_keeps_its_pending_commit_until_its_link_is_back[reverted]"),
    "hold-drops-a-failed-switchs-commit": (
        "tasks/switch.py", "        _mend_links(*current(), model)",
        "        pass", "tests/test_tracking_attacks.py::test_a_switch_on_demand_that_fails_after_its_rename_is_put_back_before_the_revision_is_held[released]"),
    "unanswered-check-marks-a-new-request-asked": (
        "flows/ensure_model.py", "f\"{model.commit}; {again}\", asked=asked)",
        "f\"{model.commit}; {again}\")", "tests/test_tracking_attacks.py::test_a_revision_asked_for_while_a_check_is_out_is_never_taken_for_the_commit_switched_to[failing]"),
    "reuse-copies-ignore-the-margin": (
        "weightkeeper/anchored.py", "            room(size)\n",
        "            pass\n", "tests/test_reuse.py"),
    "open-before-looking": (
        "weightkeeper/anchored.py", "                probe = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)\n",
        "                probe = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.fd)\n", "tests/test_reuse.py"),
    "clear-keeps-every-level-open": (
        "weightkeeper/anchored.py", "                    if len(levels) > WALK_OPEN + 1:\n",
        "                    if len(levels) > WALK_OPEN << 20:\n", "tests/test_attacks.py"),
    "gc-keeps-pending-switch-copy": (
        "weightkeeper/registry/artifacts.py", "return bool(self.users or self.switching)",
        "return bool(self.users)", "tests/test_tracking.py::test_a_failed_switchs_copy_is_kept_only_while_its_commit_is_pending"),
    "switching-copy-same-volume": (
        "weightkeeper/registry/artifacts.py", "new.cluster == now.cluster, new.volume == now.volume))",
        "new.cluster == now.cluster))", "tests/test_tracking.py::test_a_failed_switchs_copy_is_kept_only_while_its_commit_is_pending"),
    "switching-copy-same-patterns": (
        "weightkeeper/registry/artifacts.py", "if posixpath.basename(path) == copy_name(commit, include, exclude) and name not in out.get(artifact_id, ()):",
        "if name not in out.get(artifact_id, ()):", "tests/test_tracking.py::test_a_failed_switchs_copy_is_kept_only_while_its_commit_is_pending"),
    "collect-checks-switching": (
        "tasks/cleanup.py", "    if artifact.in_use:\n        return \"in use\"",
        "    if artifact.users:\n        return \"in use\"", "tests/test_tracking.py::test_a_failed_switchs_copy_is_kept_only_while_its_commit_is_pending"),
    "unused-damaged-copy-set-aside": (
        "tasks/verify.py", "        return _set_aside(settings, registry, artifact, problems) if artifact.state == A_READY else \"unused\"",
        "        return \"unused\"", "tests/test_tracking.py::test_a_damaged_copy_no_path_links_to_is_filled_again_before_a_switch_back_links_it"),
    "tracked-checks-staggered": (
        "weightkeeper/planning.py", "    offset = model_id % TURNS * interval / TURNS\n",
        "    offset = 0\n", "tests/test_tracking.py::test_tracked_models_asked_together_are_asked_again_at_turns_of_their_own_once_per_interval"),
    "tracked-turn-sql": (
        "weightkeeper/registry/updates.py", "and_(ModelRow.id % TURNS == turn, ",
        "and_(ModelRow.id % TURNS >= 0, ", "tests/test_registry.py::test_a_pass_reads_a_tracked_model_exactly_when_its_turn_makes_it_due"),
    "reuse-sha1-file-from-a-users-inode": (
        "weightkeeper/anchored.py", "                    if not others:  # its bytes may be someone's choice\n",
        "                    if False:  # its bytes may be someone's choice\n", "tests/test_reuse.py::test_a_file_checked_only_by_its_git_sha1_is_never_taken_from_bytes_a_user_could_choose"),
    "reuse-sha1-trusted-as-sha256": (
        "weightkeeper/reuse.py", "room, others=bool(remote.sha256),",
        "room, others=True,", "tests/test_reuse.py::test_a_file_checked_only_by_its_git_sha1_is_never_taken_from_bytes_a_user_could_choose"),
    "move-drops-a-killed-switchs-pending-commit": (
        "weightkeeper/registry/store.py", "            row.subpath, row.download_policy = subpath, download_policy\n",
        "            row.subpath, row.download_policy = subpath, download_policy\n            row.pending_commit = row.pending_files = row.next_revision = None\n", "tests/test_tracking_attacks.py::test_a_move_after_a_killed_switch_keeps_its_pending_commit_so_the_pass_still_knows_its_link"),
    "plain-ensure-never-finishes-a-switch-back": (
        "flows/ensure_model.py", "(model.track or model.next_revision or model.pending_commit) and model.local_paths",
        "(model.track or model.next_revision) and model.local_paths", "tests/test_tracking_attacks.py::test_a_switch_back_left_unfinished_is_finished_by_a_plain_ensure"),
    "plain-ensure-asks-an-untracked-models-head": (
        "flows/ensure_model.py", "    if not (model.track or model.next_revision):\n        switching = True",
        "    if False:\n        switching = True", "tests/test_tracking_attacks.py::test_a_switch_back_left_unfinished_is_finished_by_a_plain_ensure"),
    "job-label-of-another-model": (
        "weightkeeper/kube.py", "labels = {f\"{LABEL}/model\": model_label(model),",
        "labels = {f\"{LABEL}/model\": model,", "tests/test_kube.py::test_a_jobs_labels_reach_its_pod_as_weightkeeper_set_them_and_the_api_server_takes_them"),
    "job-label-refused": (
        "weightkeeper/kube.py", "    if owner := _label_value(owner_name):",
        "    if owner := owner_name:", "tests/test_kube.py::test_a_jobs_labels_reach_its_pod_as_weightkeeper_set_them_and_the_api_server_takes_them"),
    "job-without-deadline": (
        "weightkeeper/kubernetes/base-job-template.json", "        \"activeDeadlineSeconds\": \"{{ workspace.deadline_seconds }}\",\n",
        "", "tests/test_kube.py::test_rendered_job_runs_as_the_owner_with_the_workspace_volume"),
    "job-deadline-before-cleanup-wait": (
        "weightkeeper/deployments.py", "max(run_budget(flow, settings) for flow in (DOWNLOAD_FLOW, CLEAN_FLOW))",
        "run_budget(DOWNLOAD_FLOW, settings)", "tests/test_kube.py::test_a_job_that_never_starts_or_never_ends_is_ended_by_kubernetes_once_its_run_gave_up"),
    "job-imports-from-working-directory": (
        "weightkeeper/kubernetes/base-job-template.json", "                  \"-P\",\n",
        "", "tests/test_kube.py::test_the_jobs_command_runs_no_code_its_owner_planted"),
    "job-runs-user-site": (
        "weightkeeper/kubernetes/base-job-template.json", "                  \"-s\",\n",
        "", "tests/test_kube.py::test_the_jobs_command_runs_no_code_its_owner_planted"),
    "job-seccomp-unconfined": (
        "weightkeeper/kubernetes/base-job-template.json", "              \"runAsUser\": \"{{ run_as_user }}\",\n              \"seccompProfile\": {\n                \"type\": \"RuntimeDefault\"\n              }\n",
        "              \"runAsUser\": \"{{ run_as_user }}\"\n", "tests/test_kube.py::test_rendered_job_runs_as_the_owner_with_the_workspace_volume"),
    "job-needs-token-secret": (
        "weightkeeper/kube.py", "{\"secretRef\": {\"name\": target.token_secret, \"optional\": True}}",
        "{\"secretRef\": {\"name\": target.token_secret}}", "tests/test_kube.py::test_rendered_job_runs_as_the_owner_with_the_workspace_volume"),
    "pods-of-a-model-by-its-label": (
        "weightkeeper/pods.py", "[f\"{MODEL_LABEL}={model_label(model)},",
        "[f\"{MODEL_LABEL}={model},", "tests/test_kube.py::test_a_pod_of_a_run_prefect_no_longer_knows_still_counts"),
    "pods-headers-in-time": (
        "weightkeeper/pods.py", "    pool.pool_classes_by_scheme = {scheme: _headers_in_time(c) for scheme, c in pool.pool_classes_by_scheme.items()}",
        "    pool.pool_classes_by_scheme = dict(pool.pool_classes_by_scheme)", "tests/test_kube.py"),
    "jobs-pending-not-started": (
        "flows/jobs.py", "_not_started(flow, child, taken=state is not None and state.is_pending())",
        "_not_started(flow, child, taken=False)", "tests/test_paths_flow.py"),
    "retired-clean-after-registry-ready": (
        "flows/ensure_model.py", "    live_ready = all(p.status == READY for p in model.local_paths if not p.retired)",
        "    live_ready = True", "tests/test_paths_flow.py"),
    "tracked-check-cleans-retired": (
        "flows/ensure_model.py", "        _clean_retired(name)  # a move's old path whose cleanup failed: tried again at each check\n",
        "", "tests/test_paths_flow.py::test_a_tracked_models_old_path_whose_cleanup_failed_is_cleaned_at_its_next_check"),
    "budget-429s-counted-across-yields": (
        "weightkeeper/hubbudget.py", "                    attempt = self._throttled.get((key, bucket, what), 0)\n",
        "                    attempt = 0\n", "tests/test_budget.py::test_a_hub_that_always_answers_429_fails_the_fetch_however_often_its_slot_was_given_back"),
    "budget-yield-moves-deadline": (
        "weightkeeper/hubbudget.py", "deadline = deadline + now - stopped if deadline else",
        "deadline = deadline if deadline else", "tests/test_budget.py::test_a_hub_that_always_answers_429_fails_the_fetch_however_often_its_slot_was_given_back"),
    "verify-swapped-entry-one-problem": (
        "weightkeeper/verify.py", "        if e.errno in (errno.EISDIR, errno.ENXIO):\n",
        "        if False:\n", "tests/test_attacks.py::test_a_file_swapped_after_its_stat_is_a_problem_of_the_copy_never_an_error"),
    "job-registry-url-not-from-secret": (
        "weightkeeper/kubernetes/base-job-template.json", "\"name\": \"WEIGHTKEEPER_REGISTRY_URL\",\n        \"valueFrom\"",
        "\"name\": \"WEIGHTKEEPER_REGISTRY_URI\",\n        \"valueFrom\"", "tests/test_kube.py::test_rendered_job_runs_as_the_owner_with_the_workspace_volume"),
    "job-registry-secret-overridable": (
        "weightkeeper/kubernetes/base-job-template.json", "\"name\": \"{{ workspace.registry_secret }}\"",
        "\"name\": \"{{ registry_secret }}\"", "tests/test_kube.py::test_a_runs_variables_never_point_its_job_at_another_registry tests/test_kube.py::test_a_run_cannot_override_the_image_command_volumes_or_namespace_of_its_job"),
    "job-registry-secret-required": (
        "weightkeeper/kubernetes/base-job-template.json", "\"key\": \"WEIGHTKEEPER_REGISTRY_URL\",\n            \"optional\": true",
        "\"key\": \"WEIGHTKEEPER_REGISTRY_URL\",\n            \"optional\": false", "tests/test_kube.py::test_rendered_job_runs_as_the_owner_with_the_workspace_volume"),
    "worker-keeps-registry-url": (
        "weightkeeper/kube.py", "\"HUGGING_FACE_HUB_TOKEN\",\n                                                                               REGISTRY_ENV)}",
        "\"HUGGING_FACE_HUB_TOKEN\")}", "tests/test_kube.py::test_jobs_get_no_prefect_setting_or_token_of_the_process_that_starts_the_worker"),
    "registry-secret-name-unchecked": (
        "weightkeeper/config.py", "\"prefect_auth_secret\", \"registry_secret\") and value",
        "\"prefect_auth_secret\") and value", "tests/test_kube.py::test_workspace_kubernetes_config_is_validated"),
    "registry-url-file-over-env": (
        "weightkeeper/config.py", "return _Environment(settings_cls), init_settings",
        "return init_settings, _Environment(settings_cls)", "tests/test_config.py::test_the_registry_url_of_the_environment_overrides_the_files"),
    "new-registry-unannounced": (
        "weightkeeper/registry/store.py", "            if made:  # a typo",
        "            if False:  # a typo", "tests/test_cli.py::test_a_registry_url_naming_no_registry_yet_says_it_made_one"),
    "update-due-pending-untracked": (
        "weightkeeper/desired.py", "    if not (track or pending):\n",
        "    if not track:\n", "tests/test_tracking.py::test_a_switch_left_pending_on_a_model_not_tracked_is_due_at_its_turn_never_at_every_pass tests/test_tracking.py::test_a_switch_left_pending_on_a_model_not_tracked_is_finished_by_a_reconcile_pass"),
    "update-due-pending-every-pass": (
        "weightkeeper/desired.py", "    if not (track or pending):\n        return False\n",
        "    if pending:\n        return True\n    if not track:\n        return False\n", "tests/test_tracking.py::test_a_switch_left_pending_on_a_model_not_tracked_is_due_at_its_turn_never_at_every_pass tests/test_registry.py::test_a_pass_reads_a_tracked_model_exactly_when_its_turn_makes_it_due"),
    "update-due-sql-pending": (
        "weightkeeper/registry/updates.py", "    following = or_(ModelRow.track.is_(True), ModelRow.pending_commit.is_not(None))\n",
        "    following = ModelRow.track.is_(True)\n", "tests/test_registry.py::test_a_pass_reads_a_tracked_model_exactly_when_its_turn_makes_it_due tests/test_tracking.py::test_a_switch_left_pending_on_a_model_not_tracked_is_finished_by_a_reconcile_pass"),
    "untracked-switch-try-recorded": (
        "flows/ensure_model.py", "        registry.head_checked(name, None, [], asked=asked)  # tried now, whatever becomes of this run\n",
        "", "tests/test_tracking.py::test_a_switch_left_pending_that_cannot_finish_is_tried_once_per_interval_not_at_every_pass"),
    "reconcile-passes-pending": (
        "flows/reconcile.py", ", pending=model.pending_commit is not None)",
        ")", "tests/test_tracking.py::test_a_switch_left_pending_on_a_model_not_tracked_is_finished_by_a_reconcile_pass"),
    "coming-switch-matches-any-copy-of-the-commit": (
        "weightkeeper/registry/updates.py", ("ArtifactRow.volume == ws.volume, ArtifactRow.path.in_(wanted)))} if wanted else set()", "if o.id in goes and not goes[o.id] & made)"),
        ("ArtifactRow.volume == ws.volume, ArtifactRow.repo_id.in_({o.repo_id for o in others})))} if wanted else set()", "if o.id in goes and not {p.rsplit('/', 1)[1].split('.')[0] for _, p in goes[o.id]} & {p.rsplit('/', 1)[1].split('.')[0] for _, p in made})"),
        "tests/test_tracking_attacks.py::test_two_switches_that_each_fit_the_capacity_but_not_together_are_not_both_recorded"),
    "registry-url-unescaped-at-shown": (
        "weightkeeper/registry/store.py", "    if _ats(url) > 1:  # the parser",
        "    if False:  # the parser", "tests/test_cli.py::test_bad_input_gets_one_line_errors"),
    "job-makes-a-sqlite-registry": (
        "weightkeeper/config.py", "        if os.environ.get(JOB_MARK) and self.registry_url.startswith(\"sqlite\"):",
        "        if False:", "tests/test_config.py::test_a_workspace_job_without_the_registry_secret_names_it"),
    "new-registry-notice-reads-the-query": (
        "weightkeeper/registry/store.py", "                db = make_url(url).database",
        "                db = url.split(\"///\", 1)[-1]", "tests/test_cli.py::test_a_registry_url_naming_no_registry_yet_says_it_made_one"),
    "new-registry-notice-for-the-default-too": (
        "weightkeeper/registry/store.py", "made = db if announce_new and not Path(db).exists() else None",
        "made = db if not Path(db).exists() else None", "tests/test_prefectserver.py::test_the_demo_starts_its_own_prefect_server_runs_the_lifecycle_and_stops_it"),
    "progress-lines-every-message": (
        "weightkeeper/cli.py", "(p.status != status or time.monotonic() - at >= LINE_SECONDS)",
        "True", "tests/test_cli.py::test_progress_into_a_pipe_is_a_line_when_a_status_changes_and_messages_at_most_each_interval"),
    "progress-lines-cut-at-80-columns": (
        "weightkeeper/cli.py", "    made.soft_wrap = not made.is_terminal\n",
        "", "tests/test_cli.py::test_create_list_get_delete"),
    "hub-error-page-token-kept": (
        "weightkeeper/hub.py", "            e.args = (str(e).replace(token, \"\u2026\"),)",
        "            pass", "tests/test_hub_answers.py::test_an_error_page_that_repeats_the_token_never_carries_it_into_a_message"),
    "hub-error-page-quoted-whole": (
        "weightkeeper/hub.py", "heard = said(getattr(error, \"reason\", None) or error, [token])",
        "heard = str(error)", "tests/test_hub_answers.py::test_an_error_page_that_repeats_the_token_never_carries_it_into_a_message"),
    "download-error-many-lines": (
        "weightkeeper/errors.py", "    text = \" \".join(text.splitlines())\n",
        "", "tests/test_hub_answers.py::test_an_error_page_that_repeats_the_token_never_carries_it_into_a_message"),
    "download-error-unbounded": (
        "weightkeeper/errors.py", "return text if len(text) <= MESSAGE_LIMIT else",
        "return text if True else", "tests/test_hub_answers.py::test_an_error_page_that_repeats_the_token_never_carries_it_into_a_message"),
    "listing-values-unbounded": (
        "weightkeeper/hub.py", "        if body.count(b\",\") + body.count(b\"[\") + body.count(b\"{\") > values:",
        "        if False:", "tests/test_hub_answers.py::test_a_listing_that_drips_or_floods_is_cut"),
    "listing-nesting-escapes": (
        "weightkeeper/hub.py", "        except Exception as e:  # noqa: BLE001 - any value of any type",
        "        except (ValueError, TypeError, KeyError, AttributeError) as e:  #", "tests/test_hub_answers.py::test_a_listing_nested_deeper_than_the_parser_goes_or_an_error_page_of_many_values_is_refused_in_one_line"),
    "run-reserved-by-name-alone": (
        "weightkeeper/registry/runs.py", "model = self._model(s, name, seen=seen)  # locked",
        "model = self._model(s, name)  # locked", "tests/test_tenancy.py::test_a_delete_or_retry_never_lands_on_the_model_declared_under_its_name_since"),
    "api-starts-a-run-by-name-alone": (
        "weightkeeper/api.py", "run_key(flow, model, caller, key),\n                                      seen=model)",
        "run_key(flow, model, caller, key))", "tests/test_tenancy.py::test_a_delete_or_retry_never_lands_on_the_model_declared_under_its_name_since"),
    "run-acts-on-whatever-holds-its-name": (
        "weightkeeper/runs.py", "if bound and (seen is None or bound_to(seen) != bound):",
        "if False:", "tests/test_tenancy.py::test_a_run_started_for_a_model_leaves_the_one_declared_under_its_name_since_alone"),
    "run-started-with-its-name-alone": (
        "weightkeeper/runs.py", "parameters={\"name\": name, \"bound\": bound_to(seen)}",
        "parameters={\"name\": name}", "tests/test_tenancy.py::test_a_run_started_for_a_model_leaves_the_one_declared_under_its_name_since_alone"),
    "create-tells-a-hidden-models-phase": (
        "weightkeeper/registry/store.py", "if sees is not None and not sees(_view(existing)):",
        "if False:", "tests/test_tenancy.py::test_create_refuses_a_name_taken_by_a_model_the_caller_cannot_see_without_saying_its_phase"),
    "api-create-sees-every-model": (
        "weightkeeper/api.py", "sees=lambda m: visible(m, caller, settings),",
        "sees=None,", "tests/test_tenancy.py::test_create_refuses_a_name_taken_by_a_model_the_caller_cannot_see_without_saying_its_phase"),
    "api-get-reads-the-manifests": (
        "weightkeeper/api.py", "        model = registry.shown_model(name)",
        "        model = registry.get_model(name)", "tests/test_listing.py::test_a_page_or_a_models_answer_never_reads_the_manifests"),
    "partial-resumed-only-if-own": (
        "weightkeeper/download.py", "and st.st_nlink == 1 and d.mine(st.st_uid):",
        "and st.st_nlink == 1:", "tests/test_space.py::test_a_partial_file_counts_the_bytes_it_holds_on_disk_and_only_when_it_is_weightkeepers"),
    "partial-new-file-when-nothing-resumed": (
        "weightkeeper/download.py", "self.fd = self.part_dir.make_new(self.part_name, os.O_RDWR)",
        "self.fd = self.part_dir.open_regular(self.part_name, os.O_RDWR | os.O_CREAT)", "tests/test_attacks.py::test_a_repair_never_writes_another_users_file_moved_in_as_a_partial_file"),
    "partial-resumed-still-own-when-opened": (
        "weightkeeper/download.py", "            if not self.part_dir.mine(os.fstat(fd).st_uid):",
        "            if False:", "tests/test_download.py::test_a_partial_file_that_becomes_another_users_after_it_was_measured_is_never_written"),
    "reuse-source-owner-rule": (
        "weightkeeper/anchored.py", "if st.st_uid not in (os.geteuid(), owner):",
        "if False:", "tests/test_reuse.py::test_a_repair_never_lets_the_shelf_owner_read_a_file_they_moved_into_their_copy[victims] tests/test_reuse.py::test_a_file_someone_else_may_write_is_copied_never_linked"),
    "reuse-scratch-private": (
        "weightkeeper/anchored.py", "os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)",
        "os.O_RDWR | os.O_CREAT | os.O_EXCL)", "tests/test_reuse.py::test_a_repair_never_lets_the_shelf_owner_read_a_file_they_moved_into_their_copy[roots]"),
    "reuse-copy-opened-after-digest": (
        "weightkeeper/reuse.py", "if good and how == \"copy\":",
        "if False:", "tests/test_reuse.py::test_a_file_someone_else_may_write_is_copied_never_linked"),
    "space-partial-counts-blocks": (
        "weightkeeper/download.py", "self.allocated = min(self.resumed, held)",
        "self.allocated = self.resumed", "tests/test_space.py::test_a_partial_file_counts_the_bytes_it_holds_on_disk_and_only_when_it_is_weightkeepers"),
    "cache-dir-any-case": (
        "weightkeeper/download.py", "segments[0].casefold() == CACHE_DIR",
        "segments[0] == CACHE_DIR", "tests/test_download.py::test_a_listed_name_outside_the_copy_or_in_weightkeepers_folder_in_any_case_is_an_unsafe_file_name"),
    "refetch-checks-room": (
        "weightkeeper/download.py", "room(target, [f.remote for f in files])  # the bytes dropped",
        "None  # the bytes dropped", "tests/test_space.py::test_a_resumed_partial_file_that_fails_its_digest_is_fetched_again_only_if_it_fits[download] tests/test_space.py::test_a_resumed_partial_file_that_fails_its_digest_is_fetched_again_only_if_it_fits[repair] tests/test_download.py::test_damaged_progress_costs_a_refetch_never_a_wrong_file"),
    "refetch-needs-a-room-check": (
        "weightkeeper/download.py", "if not file.resumed or room is None:",
        "if not file.resumed:", "tests/test_download.py::test_damaged_progress_costs_a_refetch_never_a_wrong_file"),
    "refetch-room-download": (
        "tasks/download.py", "deadline, budget, lambda d, files: check_free_space(\n",
        "deadline, budget, lambda d, files: None and check_free_space(\n", "tests/test_space.py::test_a_resumed_partial_file_that_fails_its_digest_is_fetched_again_only_if_it_fits[download]"),
    "refetch-room-repair": (
        "tasks/verify.py", "deadline, budget, lambda d, files: _check_room(settings, d, files))",
        "deadline, budget, lambda d, files: None)", "tests/test_space.py::test_a_resumed_partial_file_that_fails_its_digest_is_fetched_again_only_if_it_fits[repair]"),
    "said-cuts-before-scrubbing": (
        "weightkeeper/errors.py", "        line = line.replace(secret, \"\u2026\")",
        "        pass", "tests/test_hub_answers.py::test_an_error_page_that_repeats_the_token_never_carries_it_into_a_message"),
    "listing-error-body-parsed-unbounded": (
        "weightkeeper/hub.py", "        if body.count(b\",\") + body.count(b\"[\") + body.count(b\"{\") > values:",
        "        if response.status < 400 and body.count(b\",\") + body.count(b\"[\") + body.count(b\"{\") > values:", "tests/test_hub_answers.py::test_a_listing_nested_deeper_than_the_parser_goes_or_an_error_page_of_many_values_is_refused_in_one_line"),
    "run-bound-in-the-registrys-zone": (
        "weightkeeper/runs.py", "model.created_at.astimezone(timezone.utc).isoformat()",
        "model.created_at.isoformat()", "tests/test_tenancy.py::test_a_run_is_bound_to_its_model_whatever_time_zone_the_registry_answers_in"),
    "pod-list-nested-json-uncaught": (
        "weightkeeper/pods.py", "    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes",
        "    except ValueError:", "tests/test_kube.py::test_the_pod_check_refuses_answers_no_api_server_gives_in_one_short_line[nested]"),
    "pod-names-unchecked": (
        "weightkeeper/pods.py", "\n                                              and POD_NAME.fullmatch(p[\"metadata\"][\"name\"]) for p in items):",
        " for p in items):", "tests/test_kube.py::test_the_pod_check_refuses_answers_no_api_server_gives_in_one_short_line[pod-names]"),
    "pod-list-reason-unbounded": (
        "weightkeeper/pods.py", "{said(response.reason)}",
        "{response.reason}", "tests/test_kube.py::test_the_pod_check_refuses_answers_no_api_server_gives_in_one_short_line[long-reason]"),
    "worker-name-cut-collides": (
        "weightkeeper/kube.py", "    return name if len(name) <= 63 else f\"{name[:54]}-{hashlib.sha256(pool.encode()).hexdigest()[:8]}\"",
        "    return name[:63]", "tests/test_kube.py::test_pools_whose_names_begin_alike_get_worker_objects_of_their_own"),
    "delete-unlinks-a-link-it-never-made": (
        "weightkeeper/fsops.py", "made in (LEGACY, LINK) and _names_a_copy(path, parent.readlink(name), volumes)",
        "made in (LINK, None)", "tests/test_attacks.py::test_a_link_a_user_put_at_the_path_is_never_removed_by_the_delete"),
    "delete-unlinks-any-link": (
        "weightkeeper/fsops.py", "made in (LEGACY, LINK) and _names_a_copy(path, parent.readlink(name), volumes)",
        "made == LINK", "tests/test_attacks.py::test_a_link_a_user_put_at_the_path_is_never_removed_by_the_delete"),
    "guard-first-rule-of-a-volume-only": (
        "weightkeeper/guard.py", "    for volume in sorted((v for v in volumes if v.root.rstrip(\"/\") == root), key=lambda v: v.models_dir not in segments):",
        "    for volume in [next(v for v in volumes if v.root.rstrip(\"/\") == root)]:", "tests/test_guard.py::test_workspaces_of_one_volume_each_remove_below_their_own_models_dir"),
    "switch-relisted-commit-checked": (
        "weightkeeper/registry/updates.py", "and not held and (name := _relisted(s, row, commit, files)):",
        "and not held and (name := None):", "tests/test_tracking_attacks.py::test_a_commit_the_hub_lists_otherwise_than_its_copy_on_the_volume_is_never_recorded[checked]"),
    "shared-copy-listing-unchecked": (
        "tasks/download.py", "        if relisted := listed_otherwise(artifact.files, files):",
        "        if relisted := None:", "tests/test_tracking_attacks.py::test_a_commit_the_hub_lists_otherwise_than_its_copy_on_the_volume_is_never_recorded"),
    "switch-claims-for-a-commit-no-longer-pending": (
        "weightkeeper/registry/updates.py", "if row.phase != READY or row.pending_commit != commit or p.status != READY or p.retired:",
        "if row.phase != READY or not row.pending_commit or p.status != READY or p.retired:", "tests/test_tracking_attacks.py::test_a_switch_run_started_for_a_commit_no_longer_pending_switches_nothing"),
    "cli-interrupt-exits-at-once": (
        "weightkeeper/cli.py", "        _exit_now(130)\n",
        "        return 130\n", "tests/test_cli.py::test_an_interrupted_wait_exits_at_once_and_a_rerun_resumes_to_ready"),
    "cli-argparse-errors-one-line": (
        "weightkeeper/cli.py", "    parser = _Parser(prog=\"weightkeeper\", description=__doc__)",
        "    parser = argparse.ArgumentParser(prog=\"weightkeeper\", description=__doc__)", "tests/test_cli.py::test_bad_input_gets_one_line_errors"),
    "cli-retry-resets-failed": (
        "weightkeeper/cli.py", "    model = registry.retry_model(args.name)",
        "    model = registry.get_model(args.name)", "tests/test_cli.py::test_retry_makes_a_failed_model_pending_and_runs_it_again"),
    "demo-ignores-env-overrides": (
        "weightkeeper/demo.py", "    saved = {name: os.environ.pop(name) for name in list(os.environ) if name.startswith(ENV_PREFIX)}",
        "    saved = {}", "tests/test_cli.py::test_the_demo_keeps_to_its_own_config_whatever_the_environment_says"),
    "cli-workspace-table-whole": (
        "weightkeeper/cli.py", "        table.add_column(column, overflow=\"fold\")  # a path or a number is shown whole, on several lines if need be",
        "        table.add_column(column)", "tests/test_cli.py::test_workspace_list"),
    "cli-run-logs-above-bars": (
        "weightkeeper/cli.py", "        handler.console = shown\n",
        "        pass\n", "tests/test_cli.py::test_run_log_lines_go_through_the_console_that_draws_the_bars"),
    "config-s3-bucket-required": (
        "weightkeeper/config.py", "                                    BeforeValidator), BeforeValidator(_required)] = Field(None, validate_default=True)",
        "                                    BeforeValidator)] = Field(None, validate_default=True)", "tests/test_config.py::test_a_wrong_type_is_one_line_naming_the_key_and_the_file"),
    "failure-record-keeps-will-retry": (
        "weightkeeper/errors.py", "    return f\"{str(error).removesuffix(RETRIES)}; `weightkeeper model retry {name}` tries again\"",
        "    return str(error)", "tests/test_cli.py::test_a_transient_failure_left_after_the_retries_says_what_retries_it"),
    "resolve-failure-in-prefects-words": (
        "flows/ensure_model.py", "f\"cannot {step} {model.source}: {_failure(snapshot, name)}\"",
        "f\"cannot {step} {model.source}: {snapshot.message}\"", "tests/test_cli.py::test_a_transient_failure_left_after_the_retries_says_what_retries_it[resolve]"),
    "download-failure-keeps-will-retry": (
        "tasks/download.py", "str(e) if e.permanent else gave_up(e, name)",
        "str(e)", "tests/test_cli.py::test_a_transient_failure_left_after_the_retries_says_what_retries_it[download]"),
    "declare-records-a-workspace-twice": (
        "weightkeeper/service.py", "targets=list(dict.fromkeys(workspaces)) if workspaces else None",
        "targets=list(workspaces) if workspaces else None", "tests/test_cli.py::test_a_workspace_named_twice_is_recorded_once"),
    "switch-pending-path-shared": (
        "weightkeeper/registry/store.py", "and not track and pending in (None, their_commit)",
        "and not track", "tests/test_tracking_attacks.py::test_another_users_model_never_joins_a_path_while_its_model_switches"),
    "delete-unlinks-whatever-stands-at-a-legacy-path": (
        "weightkeeper/fsops.py", "made in (LEGACY, LINK) and _names_a_copy(path, parent.readlink(name), volumes)",
        "made == LEGACY or made == LINK and _names_a_copy(path, parent.readlink(name), volumes)", "tests/test_attacks.py::test_a_link_a_user_put_at_the_path_is_never_removed_by_the_delete[legacy]"),
    "cli-bars-without-run-logs": (
        "weightkeeper/cli.py", "transient=False) as progress, _run_logs_through(progress.console):",
        "transient=False) as progress:", "tests/test_cli.py::test_run_log_lines_go_through_the_console_that_draws_the_bars"),
    "delete-collects-only-copies-its-paths-still-name": (
        "flows/delete_model.py", "    return sorted(unused | {p.artifact_id for p in paths if p.artifact_id})",
        "    return sorted({p.artifact_id for p in paths if p.artifact_id})", "tests/test_chaos.py::test_a_delete_killed_once_a_link_is_gone_collects_its_shared_copy_when_run_again"),
    "delete-leaves-multipart-uploads": (
        "weightkeeper/s3.py", "        _abort_uploads(client, bucket, prefix, uri)\n",
        "", "tests/test_s3.py::test_a_delete_aborts_the_multipart_uploads_a_killed_staging_left_and_no_neighbours"),
    "abort-uploads-outside-the-prefix": (
        "weightkeeper/s3.py", "            problem = _key_problem(key, prefix, None, segments=True)\n",
        "            problem = None\n", "tests/test_s3.py::test_a_delete_aborts_the_multipart_uploads_a_killed_staging_left_and_no_neighbours"),
    "collected-repo-dir-left": (
        "tasks/cleanup.py", "            remove_repo_dir(artifact.path, settings.volume_rules)  # once empty",
        "            pass  # once empty", "tests/test_sharing.py::test_a_repositorys_directory_goes_with_its_last_copy tests/test_sharing.py::test_two_models_share_one_copy_and_it_goes_with_the_last"),
    "repo-dir-removed-though-not-empty": (
        "weightkeeper/fsops.py", "            return shelf.rmdir_if(repo, st)",
        "            return shelf.remove(repo)", "tests/test_sharing.py::test_a_repositorys_directory_goes_with_its_last_copy"),
    "copy-made-once-though-its-repo-dir-went": (
        "weightkeeper/fsops.py", "            if e.errno not in (errno.ENOENT, errno.ESTALE) or not attempts:",
        "            if True:", "tests/test_sharing.py::test_a_copy_is_made_again_when_a_collection_removed_its_repositorys_directory_meanwhile"),
    "repo-dir-of-anyone-removed": (
        "weightkeeper/fsops.py", "            if st is None or not stat.S_ISDIR(st.st_mode) or not (st.st_uid == shelf_uid(path) or\n                                                                  shelf.mine(st.st_uid)):",
        "            if st is None or not stat.S_ISDIR(st.st_mode):", "tests/test_sharing.py::test_only_an_empty_repository_directory_of_its_own_is_removed_after_a_collection"),
    "secret-set-any-block-name": (
        "weightkeeper/cli.py", "    if not MODEL_NAME.fullmatch(value):  # what a model may name as its token block",
        "    if False:", "tests/test_cli.py::test_a_token_saved_with_secret_set_downloads_a_private_model_and_is_never_shown"),
    "secret-set-keeps-spaces": (
        "weightkeeper/cli.py", "    value = value.strip()\n",
        "", "tests/test_cli.py::test_a_token_saved_with_secret_set_downloads_a_private_model_and_is_never_shown"),
    "secret-set-quotes-the-refusal": (
        "weightkeeper/cli.py", "f\"({f'HTTP {status}' if status else type(e).__name__}); check its log and \"",
        "f\"({e}); check its log and \"", "tests/test_cli.py::test_a_secret_the_prefect_server_refuses_is_never_quoted_back"),
    "secret-set-takes-an-argument": (
        "weightkeeper/cli.py", "    if args.value is not None:\n",
        "    if False:\n", "tests/test_cli.py::test_a_token_saved_with_secret_set_downloads_a_private_model_and_is_never_shown"),
    "repair-os-error-escapes": (
        "tasks/verify.py", "    except (DownloadError, UnsafePathError, OSError) as e:  # OSError",
        "    except (DownloadError, UnsafePathError) as e:  # OSError", "tests/test_repair.py::test_a_repair_the_volume_refuses_fails_the_copy_lets_it_go_and_the_next_pass_repairs_it"),
    "repair-volume-error-blamed-on-the-source": (
        "tasks/verify.py", "            others = final if isinstance(e, (UnsafePathError, OSError)) else (",
        "            others = final if isinstance(e, UnsafePathError) else (", "tests/test_repair.py::test_a_repair_the_volume_refuses_fails_the_copy_lets_it_go_and_the_next_pass_repairs_it"),
    "patterns-matched-whatever-they-cost": (
        "weightkeeper/planning.py", "    if matching_cost(files, given) > MATCH_BUDGET:",
        "    if False:", "tests/test_patterns.py::test_patterns_a_listing_of_long_names_makes_costly_are_refused_before_any_matching tests/test_patterns.py::test_a_repository_listing_names_too_long_to_match_fails_the_model_saying_why"),
    "pattern-wildcards-unbounded": (
        "weightkeeper/layout.py", "        if sum(map(p.count, \"*?[\")) > MAX_WILDCARDS:",
        "        if False:", "tests/test_patterns.py::test_pattern_lists_are_bounded_and_deduplicated"),
    "content-length-digits-unbounded": (
        "weightkeeper/api.py", "(len(declared) > 12 or int(declared) > MAX_BODY_BYTES)",
        "(int(declared) > MAX_BODY_BYTES)", "tests/test_api.py::test_a_content_length_of_thousands_of_digits_answers_413_not_500"),
    "user-quota-unenforced": (
        "weightkeeper/registry/store.py", "                if held >= max_models:",
        "                if False:", "tests/test_tenancy.py::test_a_user_holds_at_most_their_max_models_counting_those_being_deleted"),
    "s3-errors-hide-no-credentials": (
        "weightkeeper/s3.py", "    return [s for s in (frozen.access_key, frozen.secret_key, frozen.token) if s] if frozen else []",
        "    return []", "tests/test_s3_attacks.py::test_credentials_a_server_repeats_however_it_encodes_them_are_never_shown"),
    "s3-200-answers-repeat-what-was-sent": (
        "weightkeeper/s3.py", "            for secret in _sent_secrets(request.headers):  # an answer may repeat",
        "            for secret in []:  # an answer may repeat", "tests/test_s3_attacks.py::test_credentials_a_server_repeats_however_it_encodes_them_are_never_shown"),
    "s3-signature-looked-for-in-a-repr": (
        "weightkeeper/s3.py", "        authorization = authorization.decode(\"latin-1\")",
        "        authorization = str(authorization)", "tests/test_s3_attacks.py::test_credentials_a_server_repeats_however_it_encodes_them_are_never_shown"),
    "s3-keys-of-any-length": (
        "weightkeeper/s3.py", "    if len(key.encode(\"utf-8\", \"surrogatepass\")) > KEY_BYTES:",
        "    if False:", "tests/test_s3_attacks.py::test_keys_longer_than_s3_allows_are_refused_as_they_are_listed"),
    "paths-of-any-depth": (
        "weightkeeper/download.py", "    if deep := next((p for p in paths if p.count(\"/\") >= MAX_DEPTH), None):",
        "    if deep := None:", "tests/test_hub_answers.py::test_names_that_cannot_all_be_written_are_refused"),
    "collision-folders-by-name-only": (
        "weightkeeper/download.py", "            parent = folders.setdefault((parent, name), len(folders) + 1)",
        "            parent = folders.setdefault((0, name), len(folders) + 1)", "tests/test_hub_answers.py::test_names_that_cannot_all_be_written_are_refused"),
    "abort-uploads-any-page-size": (
        "weightkeeper/s3.py", "        if len(uploads) > LIST_PAGE:",
        "        if False:", "tests/test_s3_attacks.py::test_a_listing_of_uploads_out_of_bounds_aborts_none_of_them"),
    "abort-uploads-twice": (
        "weightkeeper/s3.py", " or not upload_id or (key, upload_id) in seen:",
        " or not upload_id:", "tests/test_s3_attacks.py::test_a_listing_of_uploads_out_of_bounds_aborts_none_of_them"),
    "admin-quota-applied": (
        "weightkeeper/api.py", "max_models=None if caller.admin else caller.max_models",
        "max_models=caller.max_models", "tests/test_tenancy.py::test_a_user_holds_at_most_their_max_models_counting_those_being_deleted"),
    "free-space-mount-lookup-raises": (
        "weightkeeper/space.py", "    try:\n        mount = os.path.realpath(path)\n    except OSError:\n        return path\n",
        "    mount = os.path.realpath(path)\n", "tests/test_attacks.py::test_a_parent_link_swapped_back_while_the_room_is_measured_is_no_error"),
    "list-ties-by-model-id": (
        "weightkeeper/registry/listing.py", "\"created\": [model.created_at.isoformat(), model.name],\n            \"size\": [model.size_bytes, model.name]}",
        "\"created\": [model.created_at.isoformat(), model.id],\n            \"size\": [model.size_bytes, model.id]}", "tests/test_listing.py::test_a_cursor_holds_only_the_users_own_models_so_no_count_of_others_private_ones"),
    "reuse-sha1-linked-from-an-unsealed-directory": (
        "weightkeeper/reuse.py", "if not (remote.sha256 or sealed):  # weightkeeper's inode",
        "if False:  # weightkeeper's inode", "tests/test_reuse.py::test_a_file_checked_only_by_its_git_sha1_is_never_linked_from_where_a_user_may_rename[swapped-in]"),
    "reuse-seal-trusts-any-owner": (
        "weightkeeper/reuse.py", "    return st.st_uid in (0, os.geteuid())\n",
        "    return True\n", "tests/test_reuse.py::test_a_file_checked_only_by_its_git_sha1_is_never_linked_from_where_a_user_may_rename[moved-in-by-owner]"),
    "reuse-seal-ignores-the-mode": (
        "weightkeeper/reuse.py", "    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:\n        return False\n",
        "", "tests/test_reuse.py::test_a_file_checked_only_by_its_git_sha1_is_never_linked_from_where_a_user_may_rename[moved-in-by-mode]"),
    "s3-commit-of-the-listing-alone": (
        "weightkeeper/s3.py", "listing = \"\\n\".join([source.uri, *(",
        "listing = \"\\n\".join([*(", "tests/test_s3.py::test_two_users_s3_sources_that_list_the_same_files_never_share_a_copy"),
    "config-relative-config-path": (
        "weightkeeper/config.py", "config_path = (Path(explicit) if explicit else _default_home() / \"config.toml\").absolute()",
        "config_path = (Path(explicit) if explicit else _default_home() / \"config.toml\")", "tests/test_config.py::test_the_config_files_path_is_absolute_and_a_file_that_cannot_be_read_is_one_line"),
    "config-read-oserror-escapes": (
        "weightkeeper/config.py", "    except OSError as e:  # a directory, unreadable, a loop of links, a name too long, ...",
        "    except IsADirectoryError as e:  # a directory, unreadable, a loop of links, a name too long, ...", "tests/test_config.py::test_the_config_files_path_is_absolute_and_a_file_that_cannot_be_read_is_one_line"),
    "config-home-relative": (
        "weightkeeper/config.py", "if not home.is_absolute() or \"\\0\" in str(home):",
        "if \"\\0\" in str(home):", "tests/test_config.py::test_home_and_a_sqlite_registry_are_absolute_paths"),
    "config-sqlite-relative": (
        "weightkeeper/config.py", "if not database or database == \":memory:\" or not database.startswith(\"/\") or \"\\0\" in database:",
        "if not database or database == \":memory:\":", "tests/test_config.py::test_home_and_a_sqlite_registry_are_absolute_paths"),
    "config-seconds-infinite": (
        "weightkeeper/config.py", "Seconds = Annotated[float, Strict(), Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]",
        "Seconds = Annotated[float, Strict(), Field(ge=0, le=MAX_SECONDS)]", "tests/test_config.py::test_a_duration_is_a_finite_number_of_seconds_within_ten_years"),
    "config-seconds-unbounded": (
        "weightkeeper/config.py", "IntSeconds = Annotated[StrictInt, Field(gt=0, le=MAX_SECONDS)]",
        "IntSeconds = Annotated[StrictInt, Field(gt=0)]", "tests/test_config.py::test_a_duration_is_a_finite_number_of_seconds_within_ten_years"),
    "config-seconds-negative": (
        "weightkeeper/config.py", "Seconds = Annotated[float, Strict(), Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]",
        "Seconds = Annotated[float, Strict(), Field(le=MAX_SECONDS, allow_inf_nan=False)]", "tests/test_config.py::test_a_duration_is_a_finite_number_of_seconds_within_ten_years"),
    "config-nul-in-volume": (
        "weightkeeper/config.py", "posixpath.normpath(value) == value and \"\\0\" not in value",
        "posixpath.normpath(value) == value", "tests/test_config.py::test_values_that_cannot_work_are_refused_by_name"),
    "config-token-env-and-digest": (
        "weightkeeper/config.py", "if \"token_env\" in raw and \"token_sha256\" in raw:",
        "if False:", "tests/test_config.py::test_values_that_cannot_work_are_refused_by_name"),
    "config-s3-endpoint-unchecked": (
        "weightkeeper/config.py", "endpoint_url: Annotated[Text, _checked(http_url,",
        "endpoint_url: Annotated[Text, _checked(lambda v: True,", "tests/test_config.py::test_values_that_cannot_work_are_refused_by_name"),
    "cli-undecodable-arguments": (
        "weightkeeper/cli.py", "if problem := _not_text(args):",
        "if problem := None:", "tests/test_cli.py::test_arguments_that_are_not_text_or_out_of_range_get_one_line_before_anything_starts"),
    "cli-undecodable-secret": (
        "weightkeeper/cli.py", "if not _utf8(value):  # bytes a C locale's stdin decoded as surrogates",
        "if False:  # bytes a C locale's stdin decoded as surrogates", "tests/test_cli.py::test_arguments_that_are_not_text_or_out_of_range_get_one_line_before_anything_starts"),
    "cli-port-range": (
        "weightkeeper/cli.py", "not 1 <= int(value) <= 65535",
        "not 1 <= int(value) <= 99999", "tests/test_cli.py::test_arguments_that_are_not_text_or_out_of_range_get_one_line_before_anything_starts"),
    "cli-every-unbounded": (
        "weightkeeper/cli.py", "if _positive(value) > MAX_SECONDS:",
        "if _positive(value) > MAX_SECONDS ** 3:", "tests/test_cli.py::test_arguments_that_are_not_text_or_out_of_range_get_one_line_before_anything_starts"),
    "cli-demo-offline-source": (
        "weightkeeper/cli.py", "if args.offline and args.source:",
        "if False:", "tests/test_cli.py::test_arguments_that_are_not_text_or_out_of_range_get_one_line_before_anything_starts"),
    "serve-sighup-stops-cleanly": (
        "weightkeeper/serve.py", "    signal.signal(signal.SIGHUP, _hang_up)",
        "    pass", "tests/test_serve.py::test_a_hang_up_stops_serve_as_sigterm_does"),
    "serve-api-stop-bounded": (
        "weightkeeper/serve.py", "timeout_graceful_shutdown=API_STOP_SECONDS",
        "timeout_graceful_shutdown=None", "tests/test_serve.py::test_a_request_left_open_does_not_keep_serve_from_stopping"),
    "serve-api-port-checked-first": (
        "weightkeeper/serve.py", "    if api_port is not None and not port_free(api_port, api_host):",
        "    if False:", "tests/test_serve.py::test_a_second_serve_on_a_taken_api_port_starts_nothing"),
    "reconcile-every-runs-end-with-it": (
        "weightkeeper/cli.py", "            os.environ[EXIT_WITH_PARENT_ENV] = str(os.getpid())",
        "            pass", "tests/test_serve.py::test_a_pass_of_reconcile_every_ends_with_the_command_even_when_that_is_killed"),
    "cli-worker-manifests-api-url-unchecked": (
        "weightkeeper/cli.py", "p.add_argument(\"--api-url\", required=True, type=_api_url, help=",
        "p.add_argument(\"--api-url\", required=True, help=", "tests/test_kube.py::test_worker_manifests_from_the_cli"),
    "jobs-cut-off-switch-keeps-its-progress": (
        "flows/jobs.py", "elif lease and holder != NOBODY and lease.purpose == SWITCH:",
        "elif False:", "tests/test_tracking.py::test_a_switch_cut_off_with_its_process_says_so_instead_of_its_last_progress"),
    "jobs-cut-off-switch-told-over-a-live-run": (
        "flows/jobs.py", "lease and holder != NOBODY and lease.purpose",
        "lease and lease.purpose", "tests/test_tracking.py::test_a_switch_cut_off_with_its_process_says_so_instead_of_its_last_progress"),
    "hub-route-read-alike": (
        "weightkeeper/hub.py", "    if not _read_alike(location):\n",
        "    if False:\n", "tests/test_hub_answers.py::test_a_redirect_whose_host_urllib3_reads_otherwise_is_refused_and_the_token_stays_home"),
    "hub-origin-read-alike": (
        "weightkeeper/hub.py", "    if not _read_alike(url):\n        return \"?\", url, None\n",
        "", "tests/test_hub_answers.py::test_a_redirect_whose_host_urllib3_reads_otherwise_is_refused_and_the_token_stays_home"),
    "hub-joined-raises": (
        "weightkeeper/hub.py", "    except ValueError:\n        return location\n",
        "    except KeyError:\n        return location\n", "tests/test_hub_answers.py::test_a_redirect_to_what_is_not_a_url_or_no_host_name_is_refused_in_one_line"),
    "hub-route-bad-name": (
        "weightkeeper/hub.py", "    except ValueError:  # UnicodeError: a label empty or over 63 characters, which no name resolves to\n",
        "    except KeyError:  # UnicodeError: a label empty or over 63 characters, which no name resolves to\n", "tests/test_hub_answers.py::test_a_redirect_to_what_is_not_a_url_or_no_host_name_is_refused_in_one_line"),
    "hub-modelinfo-any-error": (
        "weightkeeper/hub.py", "        except Exception as e:  # noqa: BLE001 - any value of any type (`\"lastModified\": 1` raises AttributeError)\n",
        "        except (ValueError, TypeError, KeyError, RecursionError) as e:\n", "tests/test_hub_answers.py::test_a_listing_of_values_of_the_wrong_type_is_refused_not_a_traceback"),
    "hub-rfilename-falsy": (
        "weightkeeper/hub.py", "    if bad := [s.rfilename for s in listed if not isinstance(s.rfilename, str)]:",
        "    if bad := [s.rfilename for s in listed if not isinstance(s.rfilename, str) and s.rfilename]:", "tests/test_hub_answers.py::test_a_listing_of_values_of_the_wrong_type_is_refused_not_a_traceback"),
    "hub-redirect-addresses-unbounded": (
        "weightkeeper/hub.py", "    picked = addresses[:MAX_ADDRESSES]",
        "    picked = addresses", "tests/test_hub_answers.py::test_a_redirect_host_of_many_addresses_is_tried_at_its_first_four_only"),
    "prune-removes-what-it-did-not-list": (
        "weightkeeper/fsops.py", "                    parent.rmdir(leaf)  # only ever an empty one",
        "                    parent.remove(leaf)", "tests/test_fs_attacks.py::test_a_deep_tree_planted_in_an_adopted_directory_never_crashes_its_cleanup"),
    "never-made-directory-emptied": (
        "weightkeeper/fsops.py", "                    if parent.rmdir_if(name, os.fstat(d.fd)):  # only ever an empty one, whatever was written since",
        "                    if not d.entries() and (d.clear() or parent.rmdir_if(name, os.fstat(d.fd))):", "tests/test_fs_attacks.py::test_a_user_writing_into_an_empty_directory_at_a_path_weightkeeper_never_made_keeps_their_files"),
    "unreadable-file-raises": (
        "weightkeeper/verify.py", "        return _unreadable(path, e)\n    try:",
        "        raise\n    try:", "tests/test_fs_attacks.py::test_a_file_the_service_may_not_read_is_a_problem_of_the_copy_repaired_never_a_crash"),
    "own-repair-os-error-escapes": (
        "tasks/verify.py", "    except (DownloadError, UnsafePathError, OSError) as e:  # and the volume's own errors",
        "    except (DownloadError, UnsafePathError) as e:  # and the volume's own errors", "tests/test_fs_attacks.py::test_a_repair_of_an_own_copy_the_volume_refuses_fails_the_path_never_the_task"),
    "unreadable-takes-a-want-of-descriptors": (
        "weightkeeper/verify.py", "    if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR, errno.EAGAIN, errno.ESTALE, errno.ETIMEDOUT):\n        raise e\n",
        "", "tests/test_fs_attacks.py::test_a_want_of_descriptors_or_memory_is_raised_never_taken_for_a_damaged_file"),
    "config-endpoint-host-any-characters": (
        "weightkeeper/config.py", "(?i:https?)://(?:[A-Za-z0-9._-]+|\\[[0-9A-Fa-f:.]+\\])(?::[0-9]{0,5})?(/",
        "(?i:https?)://[^/?#\\s@]+(/", "tests/test_config.py::test_a_wrong_type_is_one_line_naming_the_key_and_the_file"),
    "config-endpoint-port-unchecked": (
        "weightkeeper/config.py", "        urlsplit(url).port  # raises for 99999",
        "        pass  # raises for 99999",
        "tests/test_config.py::test_a_wrong_type_is_one_line_naming_the_key_and_the_file"),
    "model-switched-ignores-copy-listing": (
        "weightkeeper/registry/updates.py", "            if relisted := _made_otherwise(s, live, row.pending_files):",
        "            if relisted := None and _made_otherwise(s, live, row.pending_files):", "tests/test_tracking_attacks.py::test_a_switch_run_that_carries_another_listing_of_the_pending_commit_is_never_recorded"),
    "switch-replaced-link-called-own-copy": (
        "tasks/switch.py", "                if entry.made != LINK:",
        "                if entry.made != LINK or st is None or not stat.S_ISLNK(st.st_mode):", "tests/test_tracking_attacks.py::test_a_path_replaced_by_a_workspace_user_during_a_switch_is_left_as_they_put_it"),
    "stage-upload-cut": (
        "weightkeeper/s3.py", "        super().abort()\n        self.cut()\n",
        "        super().abort()\n", "tests/test_s3_attacks.py::test_an_upload_in_parts_to_a_bucket_that_takes_bytes_slowly_stops_at_once[silent-past-the-deadline]"),
    "stage-upload-pace": (
        "weightkeeper/s3.py", "            return bool(self.uploading), self.taken",
        "            return False, self.taken", "tests/test_s3_attacks.py::test_an_upload_in_parts_to_a_bucket_that_takes_bytes_slowly_stops_at_once[below-the-pace]"),
    "stage-upload-deadline": (
        "weightkeeper/s3.py", "        super().__init__(deadline, pace, poll, fail, what, stop)",
        "        super().__init__(float(\"inf\"), pace, poll, fail, what, stop)", "tests/test_s3_attacks.py::test_an_upload_in_parts_to_a_bucket_that_takes_bytes_slowly_stops_at_once[past-the-deadline]"),
    "stage-upload-deadline-not-passed": (
        "tasks/stage.py", "fetch_one, beat, counts, deadline, pace(settings),",
        "fetch_one, beat, counts, float(\"inf\"), pace(settings),", "tests/test_s3.py::test_a_staging_bucket_that_takes_bytes_slowly_fails_the_staging_promptly[past-the-deadline]"),
    "stage-upload-beat": (
        "weightkeeper/s3.py", "            value = counts[\"bytes\"]\n        on_progress(value)\n\n    def hold(",
        "            value = counts[\"bytes\"]\n\n    def hold(", "tests/test_s3_attacks.py::test_an_upload_in_parts_to_a_bucket_that_takes_bytes_slowly_stops_at_once[silent-deleted]"),
    "stage-upload-retried-after-stop": (
        "weightkeeper/s3.py", ("        if stop.is_set() and not event_name.endswith(\".AbortMultipartUpload\"):\n            raise _Stopped()", "    def no_retry(**kwargs) -> None:  # before botocore retries a request: none once stopped\n        poll()"),
        ("        if False:\n            raise _Stopped()", "    def no_retry(**kwargs) -> None:  # before botocore retries a request: none once stopped\n        pass"),
        "tests/test_s3_attacks.py::test_an_upload_in_parts_to_a_bucket_that_takes_bytes_slowly_stops_at_once[past-the-deadline]"),
    "download-pace-never-judged": (
        "weightkeeper/watchdog.py", "        if now - since >= window and moved - before < self.pace.min_bytes_per_second * window:",
        "        if False:", "tests/test_hub_answers.py::test_a_dripping_body_fails_at_the_minimum_pace_and_is_retried"),
    "verify-lstat-unreadable": (
        "weightkeeper/verify.py", "    except OSError as e:  # a directory on the way this process may list but not search\n        return _unreadable(path, e)",
        "    except FileNotFoundError:\n        st = None", "tests/test_fs_attacks.py::test_a_directory_the_service_may_list_but_not_search_is_a_problem_of_the_copy"),
    "redirect-addresses-one-of-each-family": (
        "weightkeeper/hub.py", "    return picked if other is None or other in picked else picked[:-1] + (other,)",
        "    return picked", "tests/test_hub_answers.py::test_a_redirect_host_of_both_families_has_one_of_the_other_tried"),
    "stage-first-error-cuts": (
        "weightkeeper/s3.py", "            if not isinstance(e, _Stopped):\n                watchdog.abort()",
        "            if False:\n                watchdog.abort()", "tests/test_s3_attacks.py::test_a_files_own_error_stops_the_other_uploads_at_once"),
}


CAUGHT, SURVIVED, BROKEN = "CAUGHT", "SURVIVED", "BROKEN"
TIMEOUT_SECONDS = 900


def mutated(root: Path, entry: tuple) -> str:
    """The entry's file under `root` with its edits made; ValueError saying why for a stale or unparsable one."""
    path, original, broken, _ = entry
    text = (root / path).read_text()
    pairs = zip(original, broken) if isinstance(original, tuple) else [(original, broken)]
    for old, new in pairs:
        if (count := text.count(old)) != 1:
            raise ValueError(f"stale: the text to break occurs {count} times in {path}, not once: {old[:60]!r}")
        text = text.replace(old, new)
    if "contextlib." in text and "import contextlib" not in text:
        text = text.replace("from __future__ import annotations\n",
                            "from __future__ import annotations\nimport contextlib\n", 1)
    try:
        if path.endswith(".py"):
            compile(text, path, "exec")
        elif path.endswith(".json"):
            json.loads(text)
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"the broken {path} no longer parses ({e}): the mutation must change a rule, "
                         "not the syntax") from None
    return text


def junit_name(test_id: str) -> str:
    """A pytest node id as its junit report names it (classname.name), as pytest's own mangling does."""
    path, bracket, params = test_id.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    return ".".join(names) + bracket + params


def named_failures(report: Path, tests: list[str]) -> list[str]:
    """The tests of the junit `report` that failed (not errored in a fixture) and are among `tests`."""
    wanted = [junit_name(t) for t in tests]
    failed = [f"{case.get('classname')}.{case.get('name')}" for case in ET.parse(report).getroot().iter("testcase")
              if case.find("failure") is not None]
    return [f for f in failed if any(f == w or f.startswith((w + ".", w + "[")) for w in wanted)]


def _why(proc: subprocess.CompletedProcess, tree: Path) -> str:
    """pytest's own word on a run in `tree`: its first error line (not a captured log line), else its summary."""
    out, err = (text.replace(f"{tree}/", "").strip().splitlines() for text in (proc.stdout, proc.stderr))
    return next((line for line in out + err if re.match(r"ERROR(:| \S+\.py)", line)), (out or err or ["?"])[-1])


def copy_tree(root: Path, tree: Path) -> None:
    """A scratch copy of the repository whose every module is imported from the copy (with PYTHONPATH=tree):
    flows/ and tasks/ are installed as weightkeeper.flows/.tasks, which the editable install maps to `root`."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = {".venv", ".git", "__pycache__"} & set(names)
        return skipped | ({"flows", "tasks"} & set(names) if Path(folder) == root / "weightkeeper" else set())

    shutil.copytree(root, tree, ignore=ignore)
    for package in ("flows", "tasks"):
        (tree / "weightkeeper" / package).symlink_to(f"../{package}")


def run(name: str, entry: tuple, root: Path = ROOT) -> tuple[str, str]:
    """Apply one mutation to a scratch copy of `root` and run its named tests there: (verdict, why)."""
    path, _, _, tests = entry
    try:
        text = mutated(root, entry)
    except ValueError as e:
        return BROKEN, str(e)
    scratch = Path(tempfile.mkdtemp(prefix=f"wk-mut-{name}-"))
    try:
        tree, report = scratch / "tree", scratch / "report.xml"
        copy_tree(root, tree)
        (tree / path).write_text(text)
        env = dict(os.environ, PYTHONPATH=str(tree), WK_TEST_DB="")
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                   *tests.split()]
        try:
            proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            return BROKEN, f"its tests did not end within {TIMEOUT_SECONDS} s"
        why = _why(proc, tree)
        if proc.returncode == 0:
            return SURVIVED, why
        if proc.returncode != 1 or not report.exists():
            return BROKEN, f"pytest exited {proc.returncode}, not 1 (no test failed): {why}"
        if not named_failures(report, tests.split()):
            return BROKEN, f"pytest exited 1 but none of the named tests failed: {why}"
        return CAUGHT, why
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check(entries: dict[str, tuple], root: Path = ROOT) -> dict[str, str]:
    """Each entry's problem found without running it: a stale or unparsable text, a named test not collected."""
    problems = {}
    for name, entry in entries.items():
        try:
            mutated(root, entry)
        except ValueError as e:
            problems[name] = str(e)
    tests = sorted({t for entry in entries.values() for t in entry[3].split()})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=root, env=dict(os.environ, WK_TEST_DB=""), capture_output=True, text=True)
    if proc.returncode == 0:
        return problems
    errors = [line + " " for line in (proc.stdout + "\n" + proc.stderr).replace(f"{root}/", "").splitlines()
              if line.startswith("ERROR")]
    lost = {}  # from "ERROR: not found: ID", "ERROR: file or directory not found: ID", "ERROR FILE - why"
    for name, entry in entries.items():
        if tests := [t for t in entry[3].split() if any(f" {t} " in e or f" {t.split('::')[0]} - " in e
                                                          for e in errors)]:
            lost[name] = f"named tests not collected: {' '.join(tests)}"
    return {**lost, **problems} if lost else {
        **problems, "(collection)": f"pytest --collect-only exited {proc.returncode}: {_why(proc, root)}"}


def main(args: list[str]) -> int:
    only_check = "--check" in args
    names = [a for a in args if a != "--check"] or list(MUTATIONS)
    if unknown := [n for n in names if n not in MUTATIONS]:
        print(f"no such mutation: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if only_check:
        problems = check({n: MUTATIONS[n] for n in names})
        for name, problem in problems.items():
            print(f"{BROKEN:8} {name:34} {problem}", flush=True)
        print(f"{len(names) - len(problems)} of {len(names)} entries sound")
        return 1 if problems else 0
    verdicts: dict[str, list[str]] = {CAUGHT: [], SURVIVED: [], BROKEN: []}
    for name in names:
        verdict, why = run(name, MUTATIONS[name])
        verdicts[verdict].append(name)
        print(f"{verdict:8} {name:34} {why}", flush=True)
    print(f"{len(verdicts[CAUGHT])} of {len(names)} mutations caught"
          + "".join(f"; {v.lower()}: {', '.join(n)}" for v, n in verdicts.items() if v != CAUGHT and n))
    return 0 if len(verdicts[CAUGHT]) == len(names) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
