"""How a task's failure is reported: the user's exception, not Spark's wrapper around it."""

from __future__ import annotations

from funke.taskmanager.operators import udf
from funke.taskmanager.task import failure_of


class PythonException(Exception):
    """Stands in for pyspark's PythonException (matched by name, as on Spark Connect)."""


WORKER = f'''An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "{udf.__file__}", line 380, in run
    writer.add(fn(value))
               ^^^^^^^^^
  File "/jobs/cursed.py", line 5, in check_record
    raise ValueError(f'record {{n}} is cursed')
ValueError: record 7 is cursed
'''


def test_a_user_exception_in_a_python_worker_is_unwrapped():
    failure = failure_of(PythonException(WORKER))
    assert (failure.exception_type, failure.message) == ("ValueError", "record 7 is cursed")
    assert failure.traceback.startswith("Traceback (most recent call last):")
    assert 'File "/jobs/cursed.py", line 5, in check_record' in failure.traceback
    assert udf.__file__ not in failure.traceback  # funke's runtime frames are dropped


def test_other_exceptions_keep_their_type_message_and_traceback():
    try:
        raise FileNotFoundError("no such file: /data/in.txt")
    except FileNotFoundError as exc:
        failure = failure_of(exc)
    assert (failure.exception_type, failure.message) == ("FileNotFoundError", "no such file: /data/in.txt")
    assert "test_other_exceptions_keep_their_type_message_and_traceback" in failure.traceback


def test_a_python_exception_without_a_worker_traceback_is_kept_as_is():
    failure = failure_of(PythonException("worker crashed"))
    assert (failure.exception_type, failure.message) == ("PythonException", "worker crashed")
