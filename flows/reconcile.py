"""reconcile: prove every copy complete and correct, repair what is not, collect unused shared copies."""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from tasks.cleanup import collect_shared_copy
from tasks.verify import verify_model_path, verify_shared_copy
from weightkeeper.registry.common import READY
from weightkeeper.runtime import ensure_download_limit, runtime


@flow(name="reconcile", flow_run_name="reconcile")
def reconcile() -> dict[str, str]:
    """One pass: a size check of every copy (a full hash when due), repairs, garbage collection."""
    logger = get_run_logger()
    settings, registry = runtime()
    ensure_download_limit(settings)  # repairs take download slots
    outcomes: dict[str, str] = {}
    shared = {a.path: verify_shared_copy.with_options(task_run_name=f"verify-{a.id}").submit(a.id)
              for a in registry.list_artifacts()}
    own = {p.path: verify_model_path.with_options(task_run_name=f"verify-{m.name}-{p.workspace}").submit(m.name, p.id)
           for m in registry.list_models() if m.files
           for p in m.local_paths if p.artifact_id is None and p.owned and p.status in (READY, "Failed")
           and m.phase in (READY, "Failed")}
    for path, future in {**shared, **own}.items():
        future.wait()
        outcomes[path] = future.result() if future.state.is_completed() else f"error: {future.state.message}"
    for artifact in registry.list_artifacts():
        if not artifact.users:
            outcomes[artifact.path] = collect_shared_copy(artifact.id)
    rows = "\n".join(f"| {path} | {outcome} |" for path, outcome in sorted(outcomes.items()))
    create_markdown_artifact(key="reconcile", markdown=f"| copy | outcome |\n|---|---|\n{rows}\n",
                             description="Last reconcile pass")
    logger.info("reconcile: %d copies: %s", len(outcomes),
                ", ".join(f"{v}={list(outcomes.values()).count(v)}" for v in sorted(set(outcomes.values()))))
    return outcomes
