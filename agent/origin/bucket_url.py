"""Bucket URLs (`s3://bucket/prefix`, `gs://`, `az://`): told apart from hub ids and checked without the
object-store client (agent.origin.bucket), which the CLI and the daemon's request checks need not load."""

from __future__ import annotations

from urllib.parse import urlsplit

from agent.core.errors import ConfigError

BUCKET_SCHEMES = ("s3", "gs", "az")


def is_bucket_url(text: str) -> bool:
    return urlsplit(text).scheme.lower() in BUCKET_SCHEMES and "://" in text


def split_bucket_url(url: str) -> tuple[str, str, str]:
    """`s3://bucket/prefix` -> (scheme, bucket, prefix without slashes at its ends); ConfigError else."""
    parts = urlsplit(url)
    scheme, bucket, prefix = parts.scheme.lower(), parts.netloc, parts.path.strip("/")
    if scheme not in BUCKET_SCHEMES or not bucket or parts.query or parts.fragment:
        raise ConfigError(f"{url!r} is not a bucket URL: use s3://bucket/prefix, gs://bucket/prefix or az://container/prefix")
    if any(seg in ("", ".", "..") for seg in prefix.split("/")) and prefix:
        raise ConfigError(f"{url!r}: the prefix has an empty, '.' or '..' segment")
    return scheme, bucket, prefix


def allowed_bucket(source: str, allowed: tuple[str, ...]) -> str:
    """`source` normalised, when it lies under one of the `allowed` prefixes (whole path segments: `s3://b/m`
    allows `s3://b/m/x`, not `s3://b/mx`); ConfigError otherwise, saying what to set."""
    scheme, bucket, prefix = split_bucket_url(source)
    wanted = f"{scheme}://{bucket}/{prefix}".rstrip("/")
    for entry in allowed:
        s, b, p = split_bucket_url(entry)
        base = f"{s}://{b}/{p}".rstrip("/")
        if wanted == base or wanted.startswith(base + "/"):
            return wanted
    raise ConfigError(
        f"{wanted}: this agent reads no such bucket prefix for requests; its operator allows one with "
        "`agent serve --bucket URL` (the chart's buckets.allow)"
    )
