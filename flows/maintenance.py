"""Maintenance flow: compact and prune the store, refresh its indexes, check integrity, repair on request."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from providers.embedders import embedder_spec
from providers.enrichers import make_enricher, resolve_enrichment
from runtime.memory import release_memory
from schemas.config import InletConfig, load_config
from store.maintenance import published_at_latest, republish
from store.tables import use_store_options, writer_lock
from tasks.maintain import (
    CHECKS,
    cache_stage,
    compact_live_stage,
    compact_stage,
    index_stage,
    integrity_stage,
    prune_runs_stage,
    repair_stage,
)

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "inlet.yaml"


def _pairs(cfg: InletConfig) -> list[tuple[str, str, int]]:
    """The (chunks table, documents table, vector size) of the main index and of each variant."""
    return [(v.store.chunks_table, v.store.documents_table, embedder_spec(v.embedding).dim)
            for _, v in cfg.all_variants()]


def _fingerprints(cfg: InletConfig) -> tuple[dict[str, int | None], tuple[str, ...]]:
    """The models the config's indexes use (embedder -> vector size, enricher -> None), and the kinds judged.

    An enricher this machine cannot build (Gemini without a key) leaves enrichment entries unjudged: calling
    them foreign would be wrong.
    """
    found: dict[str, int | None] = {}
    judged = ["embed", "enrich"]
    for _, v in cfg.all_variants():
        spec = embedder_spec(v.embedding)
        found[spec.fingerprint] = spec.dim
        if v.enrichment.enabled:
            enrichment, notice = resolve_enrichment(v.enrichment)
            if notice is None:
                found[make_enricher(enrichment).fingerprint] = None
            elif "enrich" in judged:
                judged.remove("enrich")
    return found, tuple(judged)


def findings_markdown(tables: dict[str, dict], findings: pa.Table, repaired: dict[str, int] | None,
                      cache: dict[str, int] | None = None) -> str:
    """Render what maintenance did and found as the run's markdown artifact."""
    lines = []
    if cache is not None:
        lines += ["## Model cache", "", f"{cache['entries']} entries, {cache['unused']} used by no chunk, "
                  f"{cache['dropped']} dropped (unused past the retention).", ""]
    lines += ["## Tables", "", "| table | versions | fragments | rows | run tags removed |", "|---|---:|---:|---:|---|"]
    for name, t in tables.items():
        b, a = t["before"], t["after"]
        lines.append(f"| {name} | {b['versions']} → {a['versions']} | {b['fragments']} → {a['fragments']} | "
                     f"{a['rows']} | {', '.join(t['tags_removed']) or '-'} |")
    counts = {c: 0 for c in CHECKS}
    for check in findings["check"].to_pylist():
        counts[check] += 1
    lines += ["", "## Integrity", "", "| check | findings |", "|---|---:|", *(f"| {c} | {n} |" for c, n in counts.items())]
    if findings.num_rows:
        lines += ["", "| table | check | document | chunk | detail |", "|---|---|---|---|---|"]
        lines += [f"| {f['table']} | {f['check']} | {f['doc_id'] or ''} | {f['chunk_id'] or ''} | {f['detail']} |"
                  for f in findings.slice(0, 200).to_pylist()]
        if findings.num_rows > 200:
            lines.append(f"\n… and {findings.num_rows - 200} more")
    if repaired is not None:
        lines += ["", "## Repair", "", (f"{repaired['chunks_deleted']} chunks deleted, "
                                        f"{repaired['documents_requeued']} documents sent back to the next ingest run, "
                                        f"{repaired.get('cache_entries_deleted', 0)} model cache entries deleted.")]
    return "\n".join(lines)


@flow(name="maintenance", log_prints=True)
def maintenance(config_path: str = str(DEFAULT_CONFIG), retention_days: float | None = None,
                repair: bool | None = None) -> dict:
    """Compact every table, prune versions past the retention, refresh indexes, check integrity, repair on request.

    retention_days and repair default to the config's maintenance section. Run it when no ingest is
    writing: it takes the store's writer lock, as ingest does, so the two never write at once.
    """
    cfg = load_config(config_path)
    retention = cfg.maintenance.retention_days if retention_days is None else retention_days
    repair = cfg.maintenance.repair if repair is None else repair
    store = cfg.store.uri
    use_store_options(store, cfg.store.options)
    pairs = _pairs(cfg)
    now = datetime.now(UTC)
    with writer_lock(store, f"maintenance-{now:%Y%m%dT%H%M%S}", cfg.store.lock_wait_s):
        return _maintain(store, pairs, cfg, retention, repair, now)


def _maintain(store: str, pairs: list[tuple[str, str, int]], cfg: InletConfig, retention: float, repair: bool,
              now: datetime) -> dict:
    # The cache first: what it drops is then compacted away with the rest.
    cache = cache_stage(store, cfg.store.cache_table, [chunks for chunks, _, _ in pairs], retention,
                        cfg.maintenance.keep_model_cache, now)
    tables = compact_stage(store, retention, now)
    # Readers stay on the published version; where it is the latest, it follows the index refresh and repairs.
    current = published_at_latest(store, [chunks for chunks, _, _ in pairs])
    indexes = index_stage(store, [chunks for chunks, _, _ in pairs], cfg.query.fulltext_index,
                          cfg.query.ann_min_rows, cfg.query.fulltext_language)
    findings = integrity_stage(store, pairs, cfg.store.cache_table, *_fingerprints(cfg))
    repaired = None
    if repair and findings.num_rows:
        repaired = repair_stage(store, findings, pairs)
        indexes = index_stage(store, [chunks for chunks, _, _ in pairs], cfg.query.fulltext_index,
                              cfg.query.ann_min_rows, cfg.query.fulltext_language)
    republish(store, current)
    create_markdown_artifact(key="maintenance-findings", markdown=findings_markdown(tables, findings, repaired, cache),
                             description="Inlet maintenance: compaction, pruning, integrity")
    get_run_logger().info("maintenance: %d integrity findings%s", findings.num_rows,
                          f", repaired {repaired}" if repaired else "")
    return {"tables": tables, "indexes": indexes, "findings": findings.to_pylist(), "repaired": repaired,
            "cache": cache}


@flow(name="maintenance-live", log_prints=True)
def live_maintenance(config_path: str = str(DEFAULT_CONFIG)) -> dict:
    """Live mode's upkeep between micro-batches: compact in tiers, keep recent versions and hourly run tags, prune runs.

    Bounds (watch section): untagged versions live watch.keep_versions_s; run tags past that, one per hour for
    maintenance.retention_days; run folders, the newest watch.keep_run_folders; fragments, see
    store.maintenance.live_exclusions. No integrity check and no full compaction (the nightly maintenance flow).
    """
    cfg = load_config(config_path)
    store = cfg.store.uri
    use_store_options(store, cfg.store.options)
    chunks = [c for c, _, _ in _pairs(cfg)]
    now = datetime.now(UTC)
    with writer_lock(store, f"maintenance-live-{now:%Y%m%dT%H%M%S}", cfg.store.lock_wait_s):
        tables = compact_live_stage(store, cfg.maintenance.retention_days, cfg.watch.keep_versions_s, now)
        current = published_at_latest(store, chunks)
        indexes = index_stage(store, chunks, cfg.query.fulltext_index, cfg.query.ann_min_rows,
                              cfg.query.fulltext_language, live=True)
        republish(store, current)
        pruned = prune_runs_stage(cfg.store.artifacts, cfg.watch.keep_run_folders)
    release_memory()  # what the micro-batches since the last one freed goes back to the system, not to the next
    shape = {name: t["after"] for name, t in tables.items()}
    get_run_logger().info("live maintenance: %s; %d run folders pruned", shape, len(pruned))
    return {"tables": tables, "indexes": indexes, "run_folders_pruned": len(pruned)}
