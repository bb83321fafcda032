"""What the tests share besides conftest's fixtures: the modules they import and the scripts they start as child processes.

pytest collects nothing here (no `test_*.py`). Tests import these as `from testlib import trainer_testlib`,
with `tests/` on `sys.path` (conftest puts it there).
"""
