"""Prefect flows: one per job."""

import providers  # noqa: F401 - offline switches before Prefect and the stage libraries load
