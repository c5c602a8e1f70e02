"""Model clients shared by the write and read sides: tokenizer, embedders, enrichers.

Importing this package sets the offline switches first, so nothing phones home and
tiktoken finds the rank file shipped with Inlet.
"""

from providers.offline import configure_offline_env

configure_offline_env()
