"""derive_phase: a model's phase from its paths, over every combination of statuses, retired flags and plan."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from weightkeeper.phase import PathStatus, Phase, derive_phase
from weightkeeper.registry import common


@dataclass(frozen=True)
class P:
    workspace: str
    path: str
    status: str
    message: str
    size_bytes: int | None
    retired: bool


def paths_of(statuses, retired) -> list[P]:
    return [P(f"ws{i}", f"/v/models/m{i}", s, f"msg{i}", 10 ** i if s == PathStatus.READY else None, r)
            for i, (s, r) in enumerate(zip(statuses, retired))]


def combinations(n: int):
    """Every (phase, paths, skipped) with up to `n` paths."""
    for count in range(n + 1):
        for phase, statuses, retired, skipped in product(Phase, product(PathStatus, repeat=count),
                                                         product((False, True), repeat=count), ((), ("no volume",))):
            yield phase, paths_of(statuses, retired), skipped


def test_the_registry_constants_are_the_enums_and_keep_the_stored_strings():
    assert [common.PENDING, common.STAGING, common.DOWNLOADING, common.READY, common.FAILED, common.DELETING] == \
        ["Pending", "Staging", "Downloading", "Ready", "Failed", "Deleting"] == list(Phase)
    assert [common.WAITING, common.CLEANING] == ["Waiting", "Cleaning"]
    assert list(PathStatus) == ["Pending", "Waiting", "Downloading", "Ready", "Failed", "Cleaning"]
    assert isinstance(common.READY, Phase) and isinstance(common.CLEANING, PathStatus)
    assert {"Ready": 1}[Phase.READY] == 1 and PathStatus.FAILED == Phase.FAILED and f"{Phase.READY}" == "Ready"


def test_every_combination_follows_the_rules():
    seen = set()
    for phase, paths, skipped in combinations(3):
        got, message = derive_phase(phase, "before", paths, skipped)
        current = [p for p in paths if not p.retired]
        failed = [p for p in current if p.status == PathStatus.FAILED]
        if phase == Phase.DELETING:
            expected = (Phase.DELETING, "before")
        elif skipped or not current:
            expected = (Phase.FAILED, "no volume" if skipped else "the model has no download target")
        elif failed:
            expected = (Phase.FAILED, "; ".join(f"{p.workspace}: {p.message}" for p in failed))
        elif all(p.status == PathStatus.READY for p in current):
            expected = (Phase.READY, f"{len(current)} path(s) ready, {sum(p.size_bytes for p in current)} bytes")
        else:
            expected = (phase, "before")
        assert got == expected[0] and isinstance(got, Phase), (phase, paths, skipped, got)
        if expected[1] == "before":
            assert message == "before", (phase, paths, skipped, message)
        else:
            leftovers = "".join(f"; old path {p.path} not cleaned yet: {p.message}" for p in paths if p.retired)
            assert message == expected[1] + leftovers, (phase, paths, skipped, message)
        seen.add(got)
    assert seen == {Phase.PENDING, Phase.STAGING, Phase.DOWNLOADING, Phase.READY, Phase.FAILED, Phase.DELETING}


def test_retired_paths_never_fail_or_block_a_model():
    """The retired-path rule: whatever state a retired path is in, the phase is the one of the current paths
    alone; and its state is still reported in the message."""
    for phase, paths, skipped in combinations(3):
        current = [p for p in paths if not p.retired]
        if not current or len(current) == len(paths):
            continue
        alone, _ = derive_phase(phase, "before", current, skipped)
        got, message = derive_phase(phase, "before", paths, skipped)
        assert got == alone, (phase, paths, skipped)
        if got != phase or message != "before":
            assert all(f"old path {p.path} not cleaned yet: {p.message}" in message for p in paths if p.retired)


def test_a_moved_model_is_ready_while_its_old_path_failed_to_clean():
    old = P("team-a", "/v/models/old", PathStatus.CLEANING, "cannot remove: read-only file system", 5, True)
    new = P("team-a", "/v/models/new", PathStatus.READY, "7 bytes", 7, False)
    assert derive_phase(Phase.DOWNLOADING, "", [old, new]) == (Phase.READY, (
        "1 path(s) ready, 7 bytes; old path /v/models/old not cleaned yet: cannot remove: read-only file system"))
    failed_old = P("team-a", "/v/models/old", PathStatus.FAILED, "download failed", None, True)
    assert derive_phase(Phase.PENDING, "moving", [failed_old, new])[0] == Phase.READY
    downloading = P("team-a", "/v/models/new", PathStatus.DOWNLOADING, "", None, False)
    assert derive_phase(Phase.DOWNLOADING, "moving", [failed_old, downloading]) == (Phase.DOWNLOADING, "moving")


def test_a_model_with_only_retired_paths_has_no_target():
    old = P("team-a", "/v/models/old", PathStatus.READY, "5 bytes", 5, True)
    assert derive_phase(Phase.READY, "", [old]) == (
        Phase.FAILED, "the model has no download target; old path /v/models/old not cleaned yet: 5 bytes")


def test_a_failed_step_stays_failed_until_the_paths_decide():
    pending = P("team-a", "/v/models/m", PathStatus.PENDING, "", None, False)
    assert derive_phase(Phase.FAILED, "cannot resolve hf://x", [pending]) == (Phase.FAILED, "cannot resolve hf://x")
    assert derive_phase("Failed", "x", [pending]) == (Phase.FAILED, "x")  # as read back from the registry
