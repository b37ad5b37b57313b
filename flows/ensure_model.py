"""ensure-model: drive a declared model to Ready in every target path."""

from __future__ import annotations

from prefect import State, flow, get_run_logger

from weightkeeper.flows.jobs import deployed, download_paths
from weightkeeper.tasks.cleanup import clean_path
from weightkeeper.tasks.report import finish_model
from weightkeeper.tasks.snapshot import resolve_revision
from weightkeeper.tasks.stage import stage_to_s3
from weightkeeper.tasks.switch import check_head, finish_switch, hold_switch
from weightkeeper.config import ENSURE_FLOW
from weightkeeper.errors import DownloadError, gave_up
from weightkeeper.layout import HfSource, parse_source
from weightkeeper.registry import LocalPath, Model
from weightkeeper.registry.common import DELETING, FAILED, READY
from weightkeeper.runs import holds_run_lease
from weightkeeper.runtime import ensure_download_limit
from weightkeeper.context import current


@flow(name=ENSURE_FLOW, flow_run_name="ensure-{name}", log_prints=True)
@holds_run_lease(ENSURE_FLOW)
def ensure_model(name: str, bound: str | None = None) -> str:
    """Resolve the revision, download into each target path (capped by the global limit), record sizes; for a
    Ready model that follows a branch, was asked for another revision, or has a switch left pending, `follow` it.
    `bound`: the model a started run is for (`runs.start_deployment`), which `holds_run_lease` checks."""
    logger = get_run_logger()
    settings, registry = current()
    model = registry.get_model(name)
    if model.phase == DELETING:
        logger.info("%s is being deleted; nothing to ensure", name)
        return model.phase
    if model.phase == READY and (model.track or model.next_revision or model.pending_commit) and model.local_paths:
        _clean_retired(name)  # a move's old path whose cleanup failed: tried again at each check
        return follow(name)
    if model.local_paths:
        ensure_download_limit(settings)
        snapshot, step = resolve_revision(name, return_state=True), "resolve"
        if snapshot.is_completed() and settings.staging and isinstance(parse_source(model.source), HfSource):
            staged = stage_to_s3(name, snapshot.result(), return_state=True)  # once; workspaces fill from S3
            if not staged.is_completed():
                snapshot, step = staged, "stage"
        if snapshot.is_completed():
            paths = registry.get_model(name).local_paths  # each a download-to-path run, here or in its pool
            if download_paths(name, [p for p in paths if not p.retired], here=not deployed()):
                _clean_retired(name)
        elif registry.get_model(name).phase != FAILED:
            registry.set_phase(name, FAILED, f"cannot {step} {model.source}: {_failure(snapshot, name)}")
    phase = finish_model(name)
    model = registry.find_model(name)
    logger.info("%s is %s%s", name, phase, f": {model.message}" if model else "")
    return phase


def _failure(state: State, name: str) -> str:
    """What a failed resolve or stage said (its error's own words, not Prefect's around them), once no retry is left."""
    try:
        error = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - a state that keeps no result (crashed, cancelled): its message is all there is
        error = None
    if isinstance(error, DownloadError):
        return str(error) if error.permanent else gave_up(error, name)
    return state.message or "unknown error"


def _clean_retired(name: str) -> None:
    """Clean the paths a move left behind, once they may be (`retired_to_clean`)."""
    _, registry = current()
    for p in retired_to_clean(registry.get_model(name)):
        clean_path.with_options(task_run_name=f"clean-{name}-{p.workspace}-retired")(name, p.id, return_state=True)


def retired_to_clean(model: Model) -> list[LocalPath]:
    """The paths a move left behind, once the registry (the state of record) shows every live path Ready; none
    before: a child run's Completed state says nothing to rely on (whoever holds the Prefect credential can set
    it), and an old path cleaned too early leaves the model with no copy."""
    live_ready = all(p.status == READY for p in model.local_paths if not p.retired)
    return [p for p in model.local_paths if p.retired] if live_ready else []


def follow(name: str) -> str:
    """A Ready model's next commit: ask the head; when it moved, each path downloads it beside the current commit
    and switches to it (a download-to-path run each, here or in its pool); the model records it once all did.
    The model stays Ready on its commit throughout, and when a download fails. Paths an unfinished switch left
    on another commit go back to the model's when there is nothing to switch to (`head_checked`): at the next
    check, or at once for a model that is not tracked (no next check comes). A check that does not complete (the
    Hub down after its retries, a killed switch's link it cannot put back yet) records only why, and when. A
    model with nothing to ask (not tracked, no revision asked for) whose switch an earlier run left unfinished
    (back to its own commit, for paths left on another) is not asked: when it is tried is recorded first (reconcile
    tries one that cannot finish yet again at its next turn, not at every pass), then that switch is run and
    recorded."""
    settings, registry = current()
    ensure_download_limit(settings)
    model = registry.get_model(name)
    asked = model.next_revision or model.revision
    if not (model.track or model.next_revision):
        switching = True  # nothing to ask: only a switch an earlier run left pending, run again
        registry.head_checked(name, None, [], asked=asked)  # tried now, whatever becomes of this run
    elif (moved := check_head(name, return_state=True)).is_completed():
        switching = moved.result()
    else:  # no answer: the pending commit and the revision asked for stay, nothing switches (`head_checked`)
        again = "its next check asks again" if model.track or model.pending_commit else \
            f"`weightkeeper model ensure {name}` asks again"
        registry.head_checked(name, None, [], held=f"cannot check {asked}: {moved.message}; it stays on "
                                                   f"{model.commit}; {again}", asked=asked)
        switching = False
    if switching:
        _switch(name)
        model = registry.get_model(name)
        # not tracked, no check comes by itself: a revision some paths did not reach is held (asked again by the
        # next `model update` or `model ensure`, or at its turn while a switch back is left pending), and those
        # that did go back at once (`hold_switch`)
        if not model.track and model.pending_commit not in (None, model.commit) and hold_switch(model, asked):
            _switch(name)
    model = registry.get_model(name)
    get_run_logger().info("%s is %s on %s: %s", name, model.phase, model.commit, model.message)
    return model.phase


def _switch(name: str) -> None:
    """Each live path switches to the pending commit (a download-to-path run each, here or in its pool); the model
    records it once all did."""
    _, registry = current()
    download_paths(name, [p for p in registry.get_model(name).local_paths if not p.retired], here=not deployed())
    finish_switch(name)
