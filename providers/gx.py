"""Great Expectations, the engine behind the data-quality gates: one ephemeral context per process, public API only.

great_expectations is imported on first use: a run with no batch to validate (a no-op) never pays its import.
"""

from __future__ import annotations

import logging
import threading
from functools import cache
from typing import Any

import pandas as pd

_GX = threading.Lock()  # batches in threads share one context; a validation takes a few ms


@cache
def context() -> Any:
    """The process's ephemeral GX context, without progress bars or a data docs site (Inlet builds no docs)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    # Its INFO lines would reach cron mail; GX sets levels on its own loggers when imported, so these are set
    # after the import.
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("great_expectations")]:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    config = DataContextConfig(store_backend_defaults=InMemoryStoreBackendDefaults(),
                               progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False))
    return gx.get_context(mode="ephemeral", project_config=config)


@cache
def _whole_frame() -> Any:
    """The process's one dataframe asset and batch definition: each validation hands it its own frame.

    A dataframe asset takes its frame at get_batch, whatever its columns, so every view shares it. Each asset or
    source added makes the context save its whole config as YAML (~10 ms each, ~60 ms when a source was added
    and deleted per validation), paid by every run's first batch.
    """
    return _source().add_dataframe_asset("frames").add_batch_definition_whole_dataframe("whole")


@cache
def _source() -> Any:
    """The process's one pandas data source (added once: adding it again would drop the assets of the last one)."""
    return context().data_sources.add_or_update_pandas("inlet")


def expectation_suite(name: str, expectations: list[tuple[str, str, dict[str, Any]]]) -> Any:
    """A GX suite of (key, expectation class, kwargs): GX's own expectation classes, each tagged with its key."""
    import great_expectations as gx

    return gx.ExpectationSuite(name=name, expectations=[
        getattr(gx.expectations, cls)(**kwargs, meta={"check": key}) for key, cls, kwargs in expectations])


def check_frame(name: str, frame: pd.DataFrame, expectations: list[tuple[str, str, dict[str, Any]]]
                ) -> tuple[dict[str, bool], dict[str, tuple[int, ...]]]:
    """Validate a frame against (key, expectation class, kwargs); return pass/fail by key and failing rows by key.

    Pass or fail first (~3x cheaper than listing rows: GX skips the unexpected-value metrics); only the
    expectations that failed run again for their failing rows, so a clean frame never pays for the lists.
    """
    with _GX:
        batch = _whole_frame().get_batch(batch_parameters={"dataframe": frame})
        passed = {r.expectation_config.meta["check"]: bool(r.success)
                  for r in batch.validate(expectation_suite(name, expectations), result_format="BOOLEAN_ONLY").results}
        failed = [e for e in expectations if not passed[e[0]]]
        detail = (batch.validate(expectation_suite(name, failed), result_format="COMPLETE").results
                  if failed else [])
    rows = {r.expectation_config.meta["check"]: tuple(sorted(r.result.get("unexpected_index_list") or ()))
            for r in detail}
    return passed, rows
