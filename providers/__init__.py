"""Model clients shared by the write and read sides: tokenizer, embedders, enrichers.

Importing this package sets the offline switches first, so nothing phones home and
tiktoken finds the rank file shipped with Inlet, and defers the imports Inlet never uses.
"""

from providers.deferred import defer_unused_imports
from providers.offline import configure_offline_env

configure_offline_env()
defer_unused_imports()
