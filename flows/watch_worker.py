"""The watcher's worker process: models, tokenizer, great-expectations and LanceDB kept warm; runs on request.

`inlet watch` (flows/watch.py) starts it through runtime/worker.py (worker_main) and sends it one request at a time: ("ingest", sources, paths) runs a micro-batch, ("maintain",) live
maintenance; each is a flow run of its own in the Prefect UI.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows.ingest import ingest
from flows.maintenance import live_maintenance
from flows.watch import run_name
from runtime.worker import serve
from schemas.config import InletConfig, load_config
from schemas.errors import PublishHeldError
from store.tables import live_cache_bounds, works_for_watcher


def warm_up(cfg: InletConfig, api: bool = True) -> dict[str, float]:
    """Load what a micro-batch would otherwise load on its first change: models, tokenizer, great-expectations.

    api: reach the Prefect API first (False: the caller waits for it itself, while its server starts).
    """
    from providers import gx, tokenizer
    from providers.embedders import make_embedder, resolve_embedding
    from providers.enrichers import make_enricher, resolve_enrichment

    seconds: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], object]) -> None:
        begin = time.perf_counter()
        fn()
        seconds[name] = round(time.perf_counter() - begin, 3)

    # Without an API URL, the first client starts Prefect's temporary server: here, not in the first micro-batch.
    if api:
        timed("prefect", lambda: _healthy())
    timed("tokenizer", tokenizer.warm)
    for _, vcfg in cfg.all_variants():
        embedding, _ = resolve_embedding(vcfg.embedding)
        if embedding.kind != "gemini":  # a remote model has nothing to load
            timed(f"embedder {embedding.kind}", lambda e=embedding: make_embedder(e).embed(["warm up"]))
        enrichment, _ = resolve_enrichment(vcfg.enrichment)
        if enrichment.enabled:
            timed(f"enricher {enrichment.kind}", lambda e=enrichment: make_enricher(e))
    if cfg.quality.enabled:
        timed("great-expectations", gx.context)
    return seconds


def _healthy() -> None:
    """Reach the Prefect API once (starting the temporary server where no API URL is set)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        failed = client.api_healthcheck()
    if failed is not None:
        raise failed


def run_micro_batch(config_path: str, sources: list[str] | None, paths: list[str] | None = None) -> dict:
    """Run the ordinary ingest flow over these sources (None: all) as a run named watch-<time>; return its summary.

    paths: what events named; a local folder source holding any of them is listed there only.

    Called with heartbeats off (main): a sync flow run ends by joining its heartbeat thread, which sleeps
    in whole seconds (up to 1 s per micro-batch, most of a small change's latency). A watcher killed mid-run
    leaves that run Running; the watcher marks it Crashed (flows/watch.py, crash_dead_runs).
    """
    # Named, not tagged: a tag would reach every task run, and each task run then asks the API for the tag's
    # concurrency slots (~15 round trips per micro-batch).
    try:
        return ingest.with_options(flow_run_name=run_name())(config_path=config_path, sources=sources, paths=paths)
    except PublishHeldError as exc:  # committed, not published: the run is Held in the UI; the watcher goes on
        return exc.summary


def handle(config_path: str, request: tuple) -> Any:
    """Run one request from the watcher: ("ingest", sources, paths) or ("maintain",)."""
    if request[0] == "ingest":
        return run_micro_batch(config_path, request[1], request[2])
    if request[0] == "maintain":
        return live_maintenance.with_options(flow_run_name=run_name("maintenance"))(config_path=config_path)
    raise ValueError(f"unknown watcher request {request[0]!r}")


def worker_main(args: list[str]) -> None:
    """Warm up for this config (args: [config path]), then serve the watcher's requests until it closes the channel."""
    config_path = args[0]
    with contextlib.ExitStack() as stack:

        def init() -> dict:
            cfg = load_config(config_path)
            live_cache_bounds()  # long-lived: LanceDB's caches would otherwise grow with every version it opens
            works_for_watcher(cfg.store.uri)
            # Once for the worker's life, not per micro-batch (building settings costs ~10 ms): no run heartbeats.
            stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
            return {"warmed": warm_up(cfg)}

        serve(init, lambda request: handle(config_path, request))

