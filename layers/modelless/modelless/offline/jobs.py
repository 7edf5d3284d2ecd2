"""What an offline job is: its S3 paths, the keys its outputs get, how its id is derived, and the
watched prefixes whose objects become the inputs of a standing job (``Watch``).

Output keys are a pure function of the input key, so that every run of a job (a duplicate event,
a resume after a crash) writes the same objects and never a second copy.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import uuid
from dataclasses import dataclass

from modelless.exceptions import InvalidJobError

S3_SCHEME = "s3://"
MANIFEST_SUFFIX = ".job.json"  # an object with this suffix starts a job (see events.py)
RESULT_SUFFIX = ".result.json"  # never the manifest suffix: a result must not start a job
SUMMARY_DIR = "_jobs/"


@dataclass(frozen=True)
class S3Path:
    """``s3://bucket/prefix``: the objects whose keys start with ``prefix`` (S3's own meaning of
    a prefix, plain string matching: ``in`` also covers ``in-other/``)."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str, what: str) -> S3Path:
        if not isinstance(url, str) or not url.startswith(S3_SCHEME):
            raise InvalidJobError(f"{what} must be an s3://bucket/prefix URL; got {url!r}", field=what)
        bucket, _, prefix = url[len(S3_SCHEME) :].partition("/")
        if not bucket:
            raise InvalidJobError(f"{what} {url!r} names no bucket", field=what)
        if len(bucket) > 63 or not all(c.isalnum() or c in "-." for c in bucket):
            raise InvalidJobError(f"{what} {url!r}: {bucket!r} is not a valid bucket name", field=what)
        return cls(bucket, prefix)

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}"

    def covers(self, other: S3Path) -> bool:
        """Whether every key under ``other`` is also under this prefix."""
        return self.bucket == other.bucket and other.prefix.startswith(self.prefix)

    def url_of(self, key: str) -> str:
        return f"{S3_SCHEME}{self.bucket}/{key}"


@dataclass(frozen=True)
class JobSpec:
    """What a caller asks for: INFaaS ``offline_query(inputPath, outputPath, appID, accuracy)``
    or ``(…, modelName)``, or every input through one of the app's pipelines (``pipeline``)."""

    app_id: str
    input_path: str
    output_path: str
    min_accuracy: float = 0.0
    model_name: str | None = None
    pipeline: str | None = None


def is_input(key: str) -> bool:
    """Whether a listed key is one of a job's inputs: not a folder marker, not a manifest (a
    manifest kept next to its inputs describes the job; it is not part of it)."""
    return not key.endswith("/") and not key.endswith(MANIFEST_SUFFIX)


def relative_key(input_prefix: str, key: str) -> str:
    """The input's key below the job's input prefix; its base name when the prefix named the
    object itself."""
    relative = key[len(input_prefix) :] if key.startswith(input_prefix) else key
    relative = relative.lstrip("/")
    return relative or posixpath.basename(key) or key


def output_key(input_prefix: str, output_prefix: str, key: str) -> str:
    """The result object of one input: deterministic, so a rerun writes the same key."""
    return f"{output_prefix}{relative_key(input_prefix, key)}{RESULT_SUFFIX}"


def summary_key(output_prefix: str, job_id: str) -> str:
    """One summary per job (jobs may share an output prefix: each keeps its own)."""
    return f"{output_prefix}{SUMMARY_DIR}{job_id}.summary.json"


def job_id_for_object(bucket: str, key: str, etag: str) -> str:
    """The job an S3 object (a manifest, or an input under a watched prefix) starts: the same
    for every delivery of the event, a new one when the object is uploaded again with new content."""
    digest = hashlib.sha256(f"{bucket}\n{key}\n{etag.strip(chr(34))}".encode()).hexdigest()
    return f"job-{digest[:24]}"


def new_job_id() -> str:
    return f"job-{uuid.uuid4().hex[:24]}"


WATCH_SOURCE = "watch:"  # the source of a watch's standing job: "watch:s3://bucket/prefix"


def watch_source(prefix: S3Path) -> str:
    return f"{WATCH_SOURCE}{prefix}"


def is_watch_source(source: str) -> bool:
    """Whether a job is a watch's standing job: its inputs are added one S3 event at a time, it
    completes whenever it has caught up and is queued again by the next object."""
    return source.startswith(WATCH_SOURCE)


def watch_job_id(
    prefix: S3Path, app_id: str, output_path: str, min_accuracy: float, model_name: str | None
) -> str:
    """The standing job of a watch: one per watch configuration (a changed target or output
    makes a new one, whose results never mix with the old one's)."""
    text = f"{prefix}\n{app_id}\n{output_path}\n{min_accuracy!r}\n{model_name or ''}"
    return f"watch-{hashlib.sha256(text.encode()).hexdigest()[:24]}"


@dataclass(frozen=True)
class Watch:
    """A watched input prefix (``MODELLESS_OFFLINE_WATCHES``): one standing job, to which every
    object created under the prefix is added as an input."""

    prefix: S3Path
    app_id: str
    output_path: str
    min_accuracy: float = 0.0
    model_name: str | None = None

    @property
    def job_id(self) -> str:
        return watch_job_id(self.prefix, self.app_id, self.output_path, self.min_accuracy, self.model_name)

    @property
    def source(self) -> str:
        return watch_source(self.prefix)

    def spec(self) -> JobSpec:
        return JobSpec(self.app_id, str(self.prefix), self.output_path, self.min_accuracy, self.model_name)

    @classmethod
    def parse_all(cls, raw: str) -> list[Watch]:
        try:
            entries = json.loads(raw or "[]")
            return [
                cls(
                    S3Path.parse(entry["prefix"], "prefix"),
                    str(entry["appID"]),
                    str(entry["outputPath"]),
                    float(entry.get("accuracy") or 0.0),
                    entry.get("modelName"),
                )
                for entry in entries
            ]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"MODELLESS_OFFLINE_WATCHES is not a JSON list of watches: {error}") from error
