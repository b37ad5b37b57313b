"""Secrets a task loads when it runs, from Prefect blocks: a model's Hub token and the S3 credentials.

They are never returned from a task, logged, passed as parameters or stored.
"""

from __future__ import annotations

import json
import logging
import os

from prefect import get_run_logger
from prefect.blocks.system import Secret
from prefect.exceptions import MissingContextError, ObjectNotFound

from weightkeeper.errors import DownloadError

_warned: set[str] = set()  # old-style S3 credentials blocks already reported in this process


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


def load_token(block: str | None) -> str | None:
    """The token in a Prefect Secret block.

    In a Kubernetes workspace job the token comes from the namespace's Secret instead, as the
    variable that `WEIGHTKEEPER_TOKEN_ENV` names (set by the job template of a workspace with a token Secret).
    """
    if not block:
        return None
    if (variable := os.environ.get("WEIGHTKEEPER_TOKEN_ENV")) and os.environ.get(variable):
        return os.environ[variable]
    try:
        return Secret.load(block).get()
    except (ValueError, ObjectNotFound) as e:
        raise DownloadError(f"cannot load token block {block!r}: {e}; create it with `weightkeeper secret set "
                            f"{block}` (it reads the token from stdin) or the Prefect UI", permanent=True) from None


def load_s3_credentials(block: str | None) -> dict | None:
    """The keys in the prefect-aws `AwsCredentials` block `block` (None: boto3's own chain). A Secret block
    holding them as a JSON object (the old form) is still read, with a line saying how to migrate it."""
    if not block:
        return None
    from prefect_aws import AwsCredentials  # imported when used: it takes seconds

    try:
        aws = AwsCredentials.load(block)
    except (ValueError, ObjectNotFound):
        try:
            value = Secret.load(block).get()
        except (ValueError, ObjectNotFound) as e:
            raise DownloadError(f"cannot load S3 credentials block {block!r}: {e}; create it with "
                                f"`AwsCredentials(aws_access_key_id=..., aws_secret_access_key=...).save({block!r})` "
                                "(prefect-aws) or the Prefect UI", permanent=True) from None
        if block not in _warned:
            _warned.add(block)
            _logger().warning("S3 credentials block %r is a Secret holding JSON, which is deprecated: save them as "
                              "`AwsCredentials(aws_access_key_id=..., aws_secret_access_key=...).save(%r)` "
                              "(prefect-aws), which is read first", block, block)
        return _from_json(block, value)
    secret = aws.aws_secret_access_key
    keys = {"aws_access_key_id": aws.aws_access_key_id, "aws_session_token": aws.aws_session_token,
            "aws_secret_access_key": secret.get_secret_value() if secret else None}
    if not (keys["aws_access_key_id"] and keys["aws_secret_access_key"]):
        raise DownloadError(f"AwsCredentials block {block!r} needs aws_access_key_id and aws_secret_access_key "
                            "(for a profile or role, leave [s3] credentials_block unset: boto3 finds them)",
                            permanent=True)
    return {key: value for key, value in keys.items() if value}


def _from_json(block: str, value: object) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, dict):
        raise DownloadError(f"S3 credentials block {block!r} must hold a JSON object with aws_access_key_id and "
                            "aws_secret_access_key", permanent=True)
    return value
