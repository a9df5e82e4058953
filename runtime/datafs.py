"""The one way funke's own processes reach files under the data directory (and sink targets):
commits, collected results, result partitions, their release, markers.

Spark writes the data directory through Hadoop's filesystems; the JobManager and TaskManager
read, move and delete there themselves, through pyarrow. pyarrow knows some of Hadoop's schemes
under other names and some not at all, so every funke-side access goes through `filesystem`,
which maps what Spark accepts onto pyarrow:

| scheme                      | pyarrow filesystem                  | needs                           |
|-----------------------------|-------------------------------------|---------------------------------|
| a path, `file://`           | local                               | every process sees the same path|
| `s3://`, `s3a://`, `s3n://` | S3 (`s3a://bucket/p` = `bucket/p`)  | AWS_* credentials / endpoint    |
| `gs://`, `gcs://`           | Google Cloud Storage                | Google credentials              |
| `hdfs://`, `viewfs://`      | HDFS through libhdfs                | HADOOP_HOME, CLASSPATH, JAVA    |

`check` runs when a process starts: a scheme outside the table, or one whose client cannot be
created here (HDFS without libhdfs), stops the process with a message naming the schemes that
work, instead of failing the first commit (or, worse, treating output it cannot see as empty).

S3 is built from the environment (pyarrow reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_REGION, AWS_ENDPOINT_URL), never by `FileSystem.from_uri`, which would ask AWS for the
bucket's region over the network.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
from urllib.parse import urlparse

import pyarrow.fs as pafs

LOCAL_SCHEMES = ("", "file")
S3_SCHEMES = ("s3", "s3a", "s3n")
GCS_SCHEMES = ("gs", "gcs")
HDFS_SCHEMES = ("hdfs", "viewfs")
SUPPORTED = "a local or shared path (or file://), s3:// / s3a:// / s3n://, gs:// / gcs://, hdfs:// / viewfs://"


class DataDirError(ValueError):
    """A data directory (or sink target) funke's processes cannot reach."""


def scheme(uri: str) -> str:
    return urlparse(uri).scheme.lower() if "://" in uri else ""


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem for `uri` and the path inside it. Raises DataDirError for a scheme
    funke cannot reach (see the table above)."""
    kind = scheme(uri)
    if kind in LOCAL_SCHEMES:
        local = urlparse(uri).path if kind == "file" else uri
        return pafs.LocalFileSystem(), os.path.abspath(local or "/")
    parsed = urlparse(uri)
    inner = f"{parsed.netloc}{parsed.path}".rstrip("/") or parsed.netloc
    if kind in S3_SCHEMES:
        return pafs.S3FileSystem(), inner
    if kind in GCS_SCHEMES:
        return pafs.GcsFileSystem(), inner
    if kind in HDFS_SCHEMES:
        host = f"{kind}://{parsed.netloc}" if parsed.netloc else "default"
        try:
            return pafs.HadoopFileSystem(host, parsed.port or 0), parsed.path or "/"
        except (OSError, RuntimeError) as e:
            raise DataDirError(
                f"{uri}: cannot open HDFS here ({e}); it needs libhdfs from a Hadoop client: HADOOP_HOME, "
                "CLASSPATH=$(hadoop classpath --glob) and JAVA_HOME set for the JobManager and every "
                "TaskManager") from None
    raise DataDirError(f"{uri}: funke cannot reach files under {kind}:// itself (commits, partitions); "
                       f"the data directory must be {SUPPORTED}")


def check(uri: str) -> None:
    """At start-up: raises DataDirError when the scheme is not one funke can reach, or its
    client cannot be created here. Reaches no remote storage (credentials are checked by the
    first access)."""
    filesystem(uri)


def file_type(uri: str) -> pafs.FileType:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).type


def remove(uri: str) -> None:
    """Delete a directory tree or a file; nothing there is fine, and so is another process
    deleting entries of the same tree at the same time (the JobManager cleaning up a job while its
    TaskManagers release their partitions): an entry that vanished under the walk is what we
    wanted, so the walk goes on, and raises only if the tree is still there after several tries."""
    fs, path = filesystem(uri)
    if isinstance(fs, pafs.LocalFileSystem):
        _remove_local(path)
        return
    for attempt in range(_REMOVE_TRIES):
        try:
            kind = fs.get_file_info(path).type
            if kind is pafs.FileType.Directory:
                fs.delete_dir(path)
            elif kind is pafs.FileType.File:
                fs.delete_file(path)
            return
        except OSError as exc:
            if not _vanished(exc) or attempt == _REMOVE_TRIES - 1:
                raise


_REMOVE_TRIES = 5


def _vanished(exc: OSError) -> bool:
    """An error that only says an entry is not there (any more)."""
    return isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT or "No such file" in str(exc)


def _remove_local(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return

    def gone_already(_function, _entry, info) -> None:
        exc = info[1] if isinstance(info, tuple) else info
        if not (isinstance(exc, OSError) and _vanished(exc)):
            raise exc

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=gone_already)
    else:
        shutil.rmtree(path, onerror=gone_already)
