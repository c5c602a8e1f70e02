"""Loaded by the forkserver when the extraction pool starts it: unstructured's partitioners and spaCy's model.

Every extraction worker is forked after this ran, so none imports them again: not the first, and not one
that replaces a worker killed at a document's time limit or by a parser crash (~5 s of CPU each before).
What failed is kept, not raised (partitioners_ready returns it), and each worker's documents report it.
"""

from tasks.extract import partitioners_ready

partitioners_ready()
