"""Imported once by the forkserver that worker processes are forked from: what every worker needs, loaded before any fork.

Workers forked from it start in milliseconds, sharing these pages with each other: the extraction and
chunking code, the cl100k tokenizer and the language identifier (~1 s together, paid once per run).
"""

from providers import tokenizer
from providers.langid import language_identifier
from tasks import chunk, extract  # noqa: F401

tokenizer.warm()
language_identifier()
