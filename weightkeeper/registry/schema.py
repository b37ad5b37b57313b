"""Registry tables (SQLAlchemy 2). Migrations in `migrations/` create exactly these."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text,
                        UniqueConstraint)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


class LeaseRow(Base):
    """Who does a piece of exclusive work (see `registry.leases`): a model's lifecycle run (`run`, keyed by the
    model id), its S3 staging (`staging`, model id), a local path (`path`, path id) or a shared copy
    (`artifact`, artifact id)."""

    __tablename__ = "leases"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    key: Mapped[int] = mapped_column(Integer, primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32), default="")  # e.g. the lifecycle flow of a run lease
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started: Mapped[float] = mapped_column(Float)  # process start time (clock ticks since boot; 0: not a process)
    acquired_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class ModelRow(Base):
    """A declared model."""

    __tablename__ = "models"
    # the list's sorts, alone and after an equality filter (phase, owner), so that a page is read in order
    __table_args__ = (Index("ix_models_created_at_name", "created_at", "name"),
                      Index("ix_models_size_bytes_name", "size_bytes", "name"),
                      Index("ix_models_phase_name", "phase", "name"),
                      Index("ix_models_phase_created_at_name", "phase", "created_at", "name"),
                      Index("ix_models_phase_size_bytes_name", "phase", "size_bytes", "name"),
                      Index("ix_models_owner_name_name", "owner_name", "name"),
                      Index("ix_models_owner_name_created_at_name", "owner_name", "created_at", "name"),
                      Index("ix_models_owner_name_size_bytes_name", "owner_name", "size_bytes", "name"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    owner_name: Mapped[str] = mapped_column(String(255))
    owner_uid: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(Text)
    repo_id: Mapped[str] = mapped_column(String(255))
    revision: Mapped[str] = mapped_column(String(255))
    commit: Mapped[str | None] = mapped_column(String(40))
    token_block: Mapped[str | None] = mapped_column(String(255))
    targets: Mapped[list | None] = mapped_column(JSON().with_variant(JSONB(), "postgresql"))  # `?|` in the list
    subpath: Mapped[str | None] = mapped_column(Text)
    files: Mapped[list | None] = mapped_column(JSON)
    phase: Mapped[str] = mapped_column(String(16), index=True)
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    deletion_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cleanup_attempts: Mapped[int] = mapped_column(Integer, default=0)
    download_policy: Mapped[str] = mapped_column(String(32), default="always-download")
    keep_files: Mapped[bool] = mapped_column(Boolean, default=False)
    staging_uri: Mapped[str | None] = mapped_column(Text, index=True)  # s3://bucket/prefix/<dir>/<commit>/
    staging_owned: Mapped[bool] = mapped_column(Boolean, default=False)  # weightkeeper uploaded it: delete it too
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # of its snapshot (0: unpinned)
    include_patterns: Mapped[list | None] = mapped_column(JSON)  # only files these match (null: the default set)
    exclude_patterns: Mapped[list | None] = mapped_column(JSON)  # never files these match
    track: Mapped[bool] = mapped_column(Boolean, default=False)  # follow the branch's head
    next_revision: Mapped[str | None] = mapped_column(String(255))  # `model update --revision`: switch to it once
    pending_commit: Mapped[str | None] = mapped_column(String(40))  # the commit being downloaded to switch to
    pending_files: Mapped[list | None] = mapped_column(JSON)
    # the last ask of the head, or try of a switch left pending
    head_checked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    switched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # the last switch of commit
    request_key: Mapped[str | None] = mapped_column(String(64))  # digest of the API request that declared it

    paths: Mapped[list[LocalPathRow]] = relationship(
        back_populates="model", cascade="all, delete-orphan", order_by="LocalPathRow.id"
    )


class LocalPathRow(Base):
    __tablename__ = "local_paths"
    __table_args__ = (UniqueConstraint("model_id", "cluster", "path"),
                      Index("ix_local_paths_workspace_model_id", "workspace", "model_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    workspace: Mapped[str] = mapped_column(String(63))
    cluster: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(Text, index=True)
    status: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text, default="")
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    bytes_done: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_total: Mapped[int] = mapped_column(BigInteger, default=0)
    owned: Mapped[bool] = mapped_column(Boolean, default=False)  # this entry put files at the path
    artifact_id: Mapped[int | None] = mapped_column(ForeignKey("artifacts.id"), index=True)  # a link to a shared copy
    verified_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # last full hash of an own copy
    checked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # last cheap check (or full hash)
    retired: Mapped[bool] = mapped_column(Boolean, default=False)  # the model moved away: clean this path
    adopted: Mapped[bool] = mapped_column(Boolean, default=False)  # held others' files before the first claim
    made: Mapped[str | None] = mapped_column(String(64))  # what weightkeeper made at the path (see fsops)
    failover_attempts: Mapped[int] = mapped_column(Integer, default=0)  # moves to another workspace of the cluster
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    model: Mapped[ModelRow] = relationship(back_populates="paths")


class ArtifactRow(Base):
    """One shared copy of a snapshot on one volume: `<models root>/_artifacts/<owner>--<name>/<commit>`."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("cluster", "path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    repo_id: Mapped[str] = mapped_column(String(255))
    commit: Mapped[str] = mapped_column(String(40))
    cluster: Mapped[str] = mapped_column(String(255))
    volume: Mapped[str] = mapped_column(Text)
    path: Mapped[str] = mapped_column(Text)
    files: Mapped[list] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text, default="")
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    verified_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    checked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    unreachable_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    released_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # a model switched away from it
    made: Mapped[str | None] = mapped_column(String(64))  # its directory's uid@dev:inode ("legacy": made before)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class HubBudgetRow(Base):
    """The Hub request budget of one bucket (`api`, `resolve`) of one endpoint and token (`key`: the sha256 of
    both, never the token): the requests of the last window by slot, a 429's block, and counters."""

    __tablename__ = "hub_budget"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    bucket: Mapped[str] = mapped_column(String(16), primary_key=True)
    slot: Mapped[int] = mapped_column(BigInteger, default=0)  # the latest slot counted (see registry.budget)
    counts: Mapped[list] = mapped_column(JSON, default=list)  # requests granted in the slots up to it
    blocked_until: Mapped[float] = mapped_column(Float, default=0.0)  # epoch seconds: a 429 said wait until then
    requests: Mapped[int] = mapped_column(BigInteger, default=0)  # requests sent, ever
    throttled: Mapped[int] = mapped_column(BigInteger, default=0)  # 429 answers received, ever


class MetricRow(Base):
    """A counter, or one bucket of a histogram (its observations above the bucket below, up to `le`, and their
    sum), added to by whichever process sees the event (`registry.metrics`)."""

    __tablename__ = "metric_counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    labels: Mapped[str] = mapped_column(String(255), primary_key=True)  # the label values, a JSON list
    le: Mapped[str] = mapped_column(String(16), primary_key=True)  # a histogram bucket's bound; "" for a counter
    count: Mapped[int] = mapped_column(BigInteger, default=0)  # a counter's value; a bucket's observations
    total: Mapped[float] = mapped_column(Float, default=0.0)  # a bucket's sum of observed values
