"""Imported once by the forkserver that worker processes are forked from: what every worker needs, loaded before any fork.

Workers forked from it start in milliseconds, sharing these pages with each other: the extraction and
chunking code, the cl100k tokenizer, the language identifier and pandas (~1.5 s together, paid once per run).
pandas because pyarrow imports it the first time a table is built from Python rows (its pandas check), which
every chunking part does: each worker paid ~0.3 s for it on its first part, on the run's critical path.
"""

import pandas  # noqa: F401

from providers import tokenizer
from providers.langid import language_identifier
from tasks import chunk, extract  # noqa: F401

tokenizer.warm()
language_identifier()
