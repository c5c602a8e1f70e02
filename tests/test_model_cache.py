"""The model cache: rows from model answers, lookups, maintenance's sweep and integrity check, seeding old stores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flows.ingest import ingest
from flows.maintenance import maintenance
from schemas.arrow import MODEL_CACHE_SCHEMA
from schemas.config import load_config
from store.model_cache import CacheWriter, cached_rows, open_cache
from tasks.cache_rows import embedding_rows, enrichment_rows, vectors_of
from tasks.maintain import cache_findings, cache_sweep

NOW = datetime(2026, 11, 26, 12, tzinfo=UTC)


def test_a_calls_usage_is_shared_among_its_answers_and_sums_to_the_call():
    rows = enrichment_rows(["a", "b", "c"], "enricher-1", ["x", "y", "z"], 100, 31, 0.03, NOW)
    assert rows.schema == MODEL_CACHE_SCHEMA
    assert sum(rows["prompt_tokens"].to_pylist()) == 100 and sum(rows["output_tokens"].to_pylist()) == 31
    assert sum(rows["cost_usd"].to_pylist()) == pytest.approx(0.03)
    vectors = np.arange(6, dtype=np.float32).reshape(3, 2)
    made = embedding_rows(["a", "b", "c"], "embedder-1", vectors, [False, True, False], 7, 0.0, NOW)
    assert made["vector"].to_pylist() == vectors.tolist() and made["prompt_tokens"].to_pylist() == [3, 2, 2]


def test_vectors_of_another_size_are_not_served():
    rows = pa.concat_tables([
        embedding_rows(["good"], "e", np.ones((1, 4), np.float32), [False], 0, 0.0, NOW),
        embedding_rows(["short"], "e", np.ones((1, 3), np.float32), [False], 0, 0.0, NOW)])
    served = vectors_of(rows.select(["key", "truncated", "vector"]), 4)
    assert served["embed_key"].to_pylist() == ["good"] and served.schema.field("vector").type.list_size == 4


def test_a_writer_appends_each_paid_call_at_once_and_a_free_one_when_due(tmp_path):
    store = str(tmp_path / "store")
    paid = CacheWriter(store, "model_cache", "enrich", flush_s=0.0)
    paid.add(enrichment_rows(["a"], "e", ["x"], 1, 1, 0.1, NOW))
    assert paid.written == 1, "a paid answer is in the table right after its call"
    free = CacheWriter(store, "model_cache", "embed", flush_s=3600)
    free.add(embedding_rows(["b"], "h", np.ones((1, 2), np.float32), [False], 0, 0.0, NOW))
    assert free.written == 0
    free.flush()
    found = cached_rows(store, "model_cache", ["a", "b", "missing"], ["key", "kind"])
    assert sorted(found["key"].to_pylist()) == ["a", "b"]


def _entries(rows: list[tuple[str, datetime | None]]) -> pa.Table:
    return pa.table({"key": [k for k, _ in rows],
                     "unused_since": pa.array([u for _, u in rows], pa.timestamp("us", tz="UTC"))})


def test_the_sweep_marks_the_unused_clears_the_used_again_and_drops_past_retention():
    entries = _entries([("used", None), ("newly unused", None), ("back in use", NOW - timedelta(days=9)),
                        ("unused a day", NOW - timedelta(days=1)), ("unused ten days", NOW - timedelta(days=10))])
    used = pa.array(["used", "back in use"])
    sweep = cache_sweep(entries, used, NOW, 7, keep=False)
    assert (sweep.mark, sweep.unmark, sweep.drop) == (["newly unused"], ["back in use"], ["unused ten days"])
    assert cache_sweep(entries, used, NOW, 7, keep=True).drop == [], "a kept cache drops nothing"


def test_cache_findings_name_vectors_of_the_wrong_size_and_count_models_the_config_does_not_use():
    entries = pa.table({"key": ["k1", "k2", "k3", "k4"], "kind": ["embed", "embed", "embed", "enrich"],
                        "fingerprint": ["hashing:64", "hashing:64", "old-model", "gemini-questions"],
                        "size": pa.array([64, 12, 32, None], pa.int32())})
    found = cache_findings("model_cache", entries, {"hashing:64": 64, "gemini-questions": None})
    assert [(f["check"], f["detail"].split(",")[0]) for f in found] == [
        ("cache_bad_vector", "entry k2 holds a 12-dim vector"),
        ("cache_foreign_model", "1 entries of old-model")]
    unjudged = cache_findings("model_cache", entries, {"hashing:64": 64}, judged=("embed",))
    assert [f["check"] for f in unjudged] == ["cache_bad_vector", "cache_foreign_model"], \
        "enrichment entries are not called foreign when the enricher cannot be built here"


@pytest.mark.usefixtures("prefect_harness")
def test_maintenance_keeps_unused_answers_for_the_retention_then_drops_them_and_repairs_bad_sizes(
        corpus, write_config):
    config = write_config(corpus, maintenance={"retention_days": 7})
    ingest(config_path=str(config))
    store = load_config(config).store
    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text().replace("2% hardener", "3% hardener"))
    edited = ingest(config_path=str(config))
    assert edited["texts_embedded"] >= 1 and edited["texts_embed_cached"] >= 1, "unchanged chunks: from the cache"
    cache = lancedb.connect(store.uri).open_table(store.cache_table)
    old = cache.count_rows()
    dim = len(cache.to_arrow()["vector"].drop_null()[0].as_py())
    cache.add(embedding_rows(["damaged"], _fingerprint(cache),
                             np.ones((1, dim - 1), np.float32), [False], 0, 0.0, NOW))

    first = maintenance(config_path=str(config), repair=True)
    assert first["cache"]["dropped"] == 0 and first["cache"]["unused"] >= 2, \
        "the edited chunk's old answer (and the damaged entry) are marked unused, not dropped"
    assert [f["check"] for f in first["findings"] if f["check"].startswith("cache")] == ["cache_bad_vector"]
    assert first["repaired"]["cache_entries_deleted"] == 1
    cache.checkout_latest()
    assert cache.count_rows() == old

    kept = write_config(corpus, name="kept.yaml", maintenance={"retention_days": 0, "keep_model_cache": True})
    assert maintenance(config_path=str(kept))["cache"]["dropped"] == 0, "a kept cache is never swept"
    later = maintenance(config_path=str(config), retention_days=0)
    assert later["cache"]["dropped"] == first["cache"]["unused"] - 1 and later["cache"]["unused"] == 0, \
        "past the retention the unused answers go (the damaged one went with the repair)"
    again = ingest(config_path=str(config))  # nothing changed: the answers in use are all still there
    assert (again["texts_embedded"], again["docs_changed"]) == (0, 0)


def _fingerprint(cache: lancedb.table.Table) -> str:
    rows = cache.to_arrow()
    return rows.filter(pc.equal(rows["kind"], "embed"))["fingerprint"][0].as_py()


@pytest.mark.usefixtures("prefect_harness")
def test_a_store_from_before_the_cache_is_seeded_from_its_chunks_and_pays_for_new_texts_only(corpus, write_config):
    config = write_config(corpus)
    first = ingest(config_path=str(config))
    store = load_config(config).store
    db = lancedb.connect(store.uri)
    db.drop_table(store.cache_table)  # as an older Inlet left it: the answers are in the chunks only
    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text().replace("2% hardener", "3% hardener"))
    edited = ingest(config_path=str(config))
    chunks = db.open_table(store.chunks_table).to_arrow()
    guide_chunks = chunks.filter(pc.match_substring(chunks["uri"], "boat-maintenance"))
    assert edited["texts_embedded"] >= 1
    assert edited["texts_embedded"] + edited["texts_embed_cached"] == len(set(guide_chunks["embed_key"].to_pylist()))
    assert edited["texts_embed_cached"] > 0, "the edited document's unchanged chunks came from the seeded cache"
    seeded = open_cache(db, store.cache_table).count_rows()
    assert seeded >= first["texts_embedded"]


def test_the_model_lock_lives_beside_a_local_store(tmp_path):
    from store.model_cache import models_lock, models_lock_path

    assert models_lock_path(str(tmp_path / "store")) == Path(tmp_path / "store" / ".inlet-models.lock")
    with models_lock(str(tmp_path / "store")):
        assert (tmp_path / "store" / ".inlet-models.lock").exists()


def test_tidying_merges_the_appends_small_fragments_and_indexes_the_keys_without_losing_an_answer(tmp_path):
    from store.model_cache import MOST_FRAGMENTS, tidy_cache

    store = str(tmp_path / "store")
    writer = CacheWriter(store, "model_cache", "embed", flush_s=0.0)
    keys = [f"k{n}" for n in range(MOST_FRAGMENTS + 6)]
    for n, key in enumerate(keys):  # one append a call, as a paid embedder's
        writer.add(embedding_rows([key], "e", np.full((1, 3), n, np.float32), [False], 1, 0.001, NOW))
    done = tidy_cache(store, "model_cache")
    assert done == {"fragments_before": len(keys), "fragments_after": 1}
    table = lancedb.connect(store).open_table("model_cache")
    assert [i.columns for i in table.list_indices()] == [["key"]]
    found = cached_rows(store, "model_cache", keys, ["key", "vector"])
    assert sorted(zip(found["key"].to_pylist(), found["vector"].to_pylist())) == sorted(
        (k, [float(n)] * 3) for n, k in enumerate(keys))
    assert tidy_cache(store, "model_cache") is None, "nothing to do twice"


def test_a_malformed_vector_is_not_kept_and_the_calls_cost_goes_to_the_good_answers():
    from schemas.config import EmbeddingConfig, PricingConfig
    from tasks.embed import cache_keeper

    class Embedder:
        fingerprint = "e"

        def truncated(self, texts: list[str]) -> list[bool]:
            return [False] * len(texts)

    kept: list[pa.Table] = []
    keep = cache_keeper(Embedder(), kept.append, {"good": "a", "nan": "b", "zero": "c"}, EmbeddingConfig(),
                        PricingConfig())
    keep(["good", "nan", "zero"], np.array([[1, 0], [np.nan, 1], [0, 0]], np.float32))
    assert [t["key"].to_pylist() for t in kept] == [["good"]], "non-finite and all-zero vectors are asked again"
    keep(["nan"], np.array([[np.inf, 0]], np.float32))
    assert len(kept) == 1, "a call with no usable answer writes nothing"
