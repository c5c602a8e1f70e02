"""Pipeline stages: each a pure function over Arrow tables plus a thin Prefect task."""

import providers  # noqa: F401 - sets the offline switches before any stage library loads
