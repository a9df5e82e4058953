"""The data directory's schemes, as funke's own processes reach them (`runtime/datafs.py`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.fs as pafs
import pytest

from funke.runtime import datafs


def test_local_paths_and_file_uris(tmp_path):
    fs, path = datafs.filesystem(str(tmp_path / "a"))
    assert isinstance(fs, pafs.LocalFileSystem) and path == str(tmp_path / "a")
    assert datafs.filesystem(f"file://{tmp_path}/b")[1] == f"{tmp_path}/b"
    assert datafs.filesystem("relative/dir")[1] == os.path.abspath("relative/dir")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    assert datafs.file_type(f"file://{tmp_path}/d") is pafs.FileType.Directory
    datafs.remove(str(tmp_path / "d"))
    datafs.remove(str(tmp_path / "d"))  # gone already: fine
    assert datafs.file_type(str(tmp_path / "d")) is pafs.FileType.NotFound


@pytest.mark.parametrize("uri", ["s3a://bucket/funke/data", "s3://bucket/funke/data", "s3n://bucket/funke/data/"])
def test_hadoops_s3_schemes_are_pyarrows_s3(uri, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "eu-west-1")  # no region lookup over the network
    fs, path = datafs.filesystem(uri)
    assert fs.type_name == "s3" and path == "bucket/funke/data"


def test_gcs():
    fs, path = datafs.filesystem("gs://bucket/data")
    assert fs.type_name == "gcs" and path == "bucket/data"


def test_a_scheme_funke_cannot_reach_is_refused_naming_those_it_can():
    with pytest.raises(datafs.DataDirError) as e:
        datafs.check("ftp://host/data")
    assert "ftp://" in str(e.value) and "s3a://" in str(e.value) and "hdfs://" in str(e.value)


def test_hdfs_without_a_hadoop_client_is_refused_saying_what_it_needs(monkeypatch):
    monkeypatch.delenv("HADOOP_HOME", raising=False)
    monkeypatch.delenv("ARROW_LIBHDFS_DIR", raising=False)
    with pytest.raises(datafs.DataDirError) as e:
        datafs.check("hdfs://namenode:8020/funke")
    assert "libhdfs" in str(e.value) and "HADOOP_HOME" in str(e.value)


def test_a_jobmanager_on_a_data_dir_it_cannot_reach_refuses_to_start(tmp_path):
    result = subprocess.run([sys.executable, "-m", "funke.jobmanager.main", "--port", "0",
                             "--data-dir", "ftp://host/data"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "data directory: ftp://host/data: funke cannot reach files under ftp://" in result.stderr
