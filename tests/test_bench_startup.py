"""bench/startup.py: the parts of its report that are pure (the top imports read from `python -X importtime`)."""

from __future__ import annotations

from bench import startup  # bench/ is a folder of scripts on the project root, importable as a namespace package

IMPORTTIME = """import time: self [us] | cumulative | imported package
import time:       120 |        120 |   _io
import time:      2000 |       2500 | site
import time:       300 |     900000 |     lancedb.db
import time:      1000 |    1900000 |   lancedb
import time:      5000 |    2100000 | query
import time:       700 |     260000 | fastapi.encoders
something a command printed
"""


def test_top_imports_are_the_top_level_ones_by_cumulative_time():
    assert startup.top_imports(IMPORTTIME, n=2) == [("query", 2.1), ("fastapi.encoders", 0.26)]
    assert [name for name, _ in startup.top_imports(IMPORTTIME)] == ["query", "fastapi.encoders", "site"]
