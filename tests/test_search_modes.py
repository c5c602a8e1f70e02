"""search(): modes, clearance, filters with fallback, time travel and neighbours, over a store the flow built."""

from __future__ import annotations

import shutil
import struct
import sys
from pathlib import Path

import lancedb
import pytest

from flows.ingest import ingest
from query import search, warm
from query.fusion import fuse
from schemas.config import load_config
from schemas.errors import QueryError
from store.commit import fulltext_index_name
from store.tables import FILE_FORMAT
from tests.conftest import SAMPLE, config_writer, run_artifact

pytestmark = pytest.mark.usefixtures("prefect_harness")
SECRET = "The harbour master's safe code is 4471 and the spare keys hang behind the chart table."


def build_store(folder: Path, corpus: Path, write_config) -> Path:
    """The sample corpus (public) plus one confidential and one internal document, ingested; its config."""
    vault = folder / "vault"
    vault.mkdir()
    (vault / "safe.md").write_text(f"# Safe\n\n{SECRET}\n")
    staff = folder / "staff"
    staff.mkdir()
    (staff / "rota.md").write_text("# Rota\n\nThe winter rota for the outboard engine checks is on the wall.\n")
    config = write_config(corpus, sources=[
        {"name": "sample", "path": str(corpus), "metadata": {"doc_type": "club-docs", "tags": ["sailing"]}},
        {"name": "vault", "path": str(vault), "metadata": {"doc_type": "secrets", "access_level": "confidential"}},
        {"name": "staff", "path": str(staff), "metadata": {"doc_type": "rota", "access_level": "internal"}},
    ])
    ingest(config_path=str(config))
    return config


@pytest.fixture
def store(tmp_path: Path, corpus: Path, write_config) -> Path:
    """A store of this test's own, which it may edit and ingest again."""
    return build_store(tmp_path, corpus, write_config)


@pytest.fixture(scope="module")
def read_store(prefect_harness, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same store built once for this file's tests that only search it (none of them writes to it)."""
    folder = tmp_path_factory.mktemp("read-store")
    shutil.copytree(SAMPLE, folder / "corpus")
    return build_store(folder, folder / "corpus", config_writer(folder))


@pytest.mark.parametrize("mode", ["vector", "fulltext", "hybrid"])
def test_a_confidential_chunk_never_reaches_a_public_caller_whatever_the_query(read_store, mode):
    for text in [SECRET, "safe code", "harbour master spare keys chart table", "4471"]:
        for hit in search(text, k=20, mode=mode, config=read_store):
            assert hit.metadata["access_level"] == "public", (text, hit.doc_id)
    assert any(h.doc_id == "vault:safe.md" for h in search(SECRET, k=3, mode=mode, clearance="confidential",
                                                           config=read_store))


def test_clearance_admits_levels_at_or_below_it(read_store):
    internal = {h.metadata["access_level"] for h in search("winter rota outboard engine", k=30, mode="fulltext",
                                                            clearance="internal", config=read_store)}
    assert internal == {"public", "internal"}
    with pytest.raises(QueryError, match="clearance 'secret' is not one of"):
        search("x", clearance="secret", config=read_store)


@pytest.mark.parametrize("mode", ["vector", "fulltext", "hybrid"])
def test_filters_apply_in_every_mode_and_fallback_says_so(read_store, mode):
    hits = search("engine", k=5, mode=mode, where={"doc_type": "club-docs"}, config=read_store)
    assert hits and all(h.metadata["doc_type"] == "club-docs" for h in hits)
    assert search("engine", mode=mode, where={"doc_type": "none-such"}, config=read_store) == []
    fell_back = search("engine", mode=mode, where={"doc_type": "none-such"}, fallback=True, config=read_store)
    assert fell_back and "ignore them" in fell_back.notices[0]
    assert all(h.metadata["access_level"] == "public" for h in fell_back), "the fallback keeps the clearance"


def test_fulltext_finds_exact_terms_and_hybrid_fuses_both_rankings(read_store):
    top = search("gelcoat hardener", k=1, mode="fulltext", config=read_store)[0]
    assert top.doc_id == "sample:guides/boat-maintenance.md" and "hardener" in top.text
    hybrid = search("gelcoat hardener", k=3, mode="hybrid", config=read_store)
    assert hybrid[0].chunk_id == top.chunk_id
    assert fuse([(1.0, ["a", "b"]), (1.0, ["b", "c"])], 60) == pytest.approx(
        {"a": 1 / 61, "b": 1 / 62 + 1 / 61, "c": 1 / 62})
    assert fuse([(0.0, ["a"]), (2.0, ["c"])], 60) == pytest.approx({"c": 2 / 61})


def test_zscore_fusion_follows_the_side_whose_best_hit_stands_out_where_rrf_does_not():
    from query.fusion import ranked, standardised, zscore_fusion

    # 40 candidates a side, as a hybrid search of k=10 fetches. Full-text: "a" stands far above the rest.
    # Vector: scores spread evenly, "a" last: its best standardised score is only sqrt(3) over the mean.
    ids = ["a", *(f"c{i:02d}" for i in range(39))]
    sharp = [("a", 9.0), *((c, 1.0 + 0.01 * i) for i, c in enumerate(ids[1:]))]
    flat = [(c, 0.51 - 0.0005 * i) for i, c in enumerate([*ids[1:], "a"])]
    assert ranked(zscore_fusion(flat, sharp, 1.0, 1.0))[0] == "a"
    assert ranked(zscore_fusion(flat, sharp, 1.0, 1.0))[0] != ranked(fuse([(1.0, ids[1:] + ["a"]), (1.0, ids)], 60))[0]
    assert standardised([("x", 0.5), ("y", 0.5)]) == {"x": 0.0, "y": 0.0}, "equal scores carry no signal"
    assert ranked(zscore_fusion(flat, sharp, 1.0, 0.0))[:2] == ["c00", "c01"], "weight 0: the other side alone"
    only = zscore_fusion(flat, [("e", 3.0)], 0.0, 1.0)
    assert list(only) == ["e"], "a side weighted 0 contributes no candidates"
    missing = zscore_fusion([("a", 0.9), ("b", 0.1)], [("c", 5.0), ("a", 1.0)], 1.0, 1.0)
    assert missing["b"] == pytest.approx(-1.0 + -1.0), "b: its own side's -1, and the other side's lowest z, -1"


def test_at_a_temperature_a_hit_far_above_its_side_outranks_one_both_sides_find_fair():
    from query.fusion import fuse_sides, ranked, standardised, tempered, zscore_fusion

    # Vector: "b" stands far above 18 evenly spread cosines (3.8 deviations), "a" among them (0.7). Full-text: "a"
    # tops an even spread of partial matches (1.6), "b" not matched at all (the side's lowest, -1.65).
    vec = sorted([("b", 0.95), ("a", 0.62), *((f"v{i:02d}", 0.60 - 0.01 * i) for i in range(18))], key=lambda x: -x[1])
    ft = sorted([("a", 8.2), *((f"f{i:02d}", 8.0 - 0.3 * i) for i in range(19))], key=lambda x: -x[1])
    assert ranked(zscore_fusion(vec, ft, 0.5, 0.5))[:2] == ["a", "b"], "plain z-scores: the fair-on-both hit first"
    assert ranked(zscore_fusion(vec, ft, 0.5, 0.5, 4.0))[:2] == ["b", "a"], "tempered: the standout first"
    z = standardised(ft)
    assert tempered(z, 0.0) == z, "temperature 0: the standardised scores themselves"
    warm = tempered(z, 4.0)
    assert sorted(warm, key=warm.get) == sorted(z, key=z.get), "tempering keeps each side's order"
    assert warm["a"] - warm["f00"] > z["a"] - z["f00"], "and widens the gaps at the top"
    assert fuse_sides(vec, ft, method="zscore", vector_weight=0.6, fulltext_weight=0.4, rrf_k=60, temperature=4.0) \
        == zscore_fusion(vec, ft, 0.6, 0.4, 4.0)


def test_a_vector_side_that_shares_little_with_full_text_loses_weight_in_proportion():
    from query.fusion import AGREEMENT_WINDOW, agreement_share, fuse_sides, ranked, side_overlap

    sparse = [(f"d{i:02d}", 20.0 - i) for i in range(40)]
    agreeing = [(f"d{i:02d}", 0.9 - 0.01 * i) for i in range(5, 45)]  # d05..d19 within both first 20: 15 of 20
    stray = [(f"x{i:02d}", 0.9 - 0.01 * i) for i in range(36)] + [(f"d{i:02d}", 0.5) for i in range(4)]
    assert side_overlap(agreeing, sparse) == 15 / AGREEMENT_WINDOW
    assert agreement_share(agreeing, sparse, 0.3) == 1.0, "sides that agree keep their weights"
    assert side_overlap(stray, sparse) == 0.0 and agreement_share(stray, sparse, 0.3) == 0.0
    assert agreement_share(stray, sparse, 0.0) == 1.0, "agreement 0: fixed weights"
    assert agreement_share(stray, [], 0.3) == 1.0, "full-text found nothing: the vector side is all there is"
    half = [(f"x{i:02d}", 0.9 - 0.01 * i) for i in range(17)] + [(f"d{i:02d}", 0.5) for i in range(3)]
    assert agreement_share(half, sparse, 0.3) == pytest.approx(0.15 / 0.3), "3 of 20 shared: half the weight"
    assert side_overlap([("a", 1.0), ("b", 0.5)], [("b", 3.0), ("c", 1.0), ("d", 0.5)]) == 0.5, "the shorter side's n"
    fixed = ranked(fuse_sides(stray, sparse, method="zscore", vector_weight=0.5, fulltext_weight=0.5, rrf_k=60))
    judged = ranked(fuse_sides(stray, sparse, method="zscore", vector_weight=0.5, fulltext_weight=0.5, rrf_k=60,
                               agreement=0.3))
    assert fixed[:4] == ["d00", "x00", "d01", "x01"], "fixed weights: the stray list's guesses interleave"
    assert judged[:5] == ["d00", "d01", "d02", "d03", "d04"], "no shared candidate: full-text's ranking alone"


def test_fusion_settings_left_unset_are_the_index_embedders_and_a_set_one_is_kept():
    import typing

    from schemas.config import EMBEDDER_FUSION, EmbeddingConfig, FusionPrior, QueryConfig

    assert set(EMBEDDER_FUSION) == set(typing.get_args(EmbeddingConfig.model_fields["kind"].annotation)), \
        "every embedder kind a config may name has its fusion"
    assert QueryConfig().fusion_for("e5") == FusionPrior(0.55, 0.45, 0.0, 3.0), "e5's, from the eval sets"
    for kind, prior in EMBEDDER_FUSION.items():
        assert QueryConfig().fusion_for(kind) == prior
        assert QueryConfig(vector_weight=0.9).fusion_for(kind) == FusionPrior(0.9, prior.fulltext_weight,
                                                                              prior.agreement, prior.temperature), \
            "a set weight is kept"
        assert QueryConfig(agreement=0.0).for_embedder(kind).agreement == 0.0
        assert QueryConfig(temperature=0.0).for_embedder(kind).temperature == 0.0
    with pytest.raises(ValueError, match="(?s)temperature.*0.5 is neither 0 .plain z-scores. nor at least 1"):
        QueryConfig(temperature=0.5)
    weak = EMBEDDER_FUSION["static"]
    assert weak.vector_weight < weak.fulltext_weight, "a weak embedder's side counts less"


def test_hybrid_search_fuses_with_its_index_embedders_weights_unless_the_config_sets_them(read_store, monkeypatch,
                                                                                           tmp_path):
    import yaml

    from schemas.config import EMBEDDER_FUSION, FusionPrior

    text = "winter engine checks and the harbour launch"
    fulltext = [h.chunk_id for h in search(text, k=8, mode="fulltext", config=read_store)]
    vector = [h.chunk_id for h in search(text, k=8, mode="vector", config=read_store)]
    assert fulltext != vector, "the sides disagree, so the weights decide the fused order"
    data = yaml.safe_load(read_store.read_text())
    data["query"] = {k: v for k, v in data.get("query", {}).items() if k not in ("vector_weight", "fulltext_weight")}
    (tmp_path / "unset.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setitem(EMBEDDER_FUSION, "hashing", FusionPrior(0.0, 1.0, 0.0, 0.0))  # the store's embedder: hashing
    assert [h.chunk_id for h in search(text, k=8, mode="hybrid", config=tmp_path / "unset.yaml")] == fulltext
    monkeypatch.setitem(EMBEDDER_FUSION, "hashing", FusionPrior(1.0, 0.0, 0.0, 0.0))
    assert [h.chunk_id for h in search(text, k=8, mode="hybrid", config=tmp_path / "unset.yaml")] == vector
    data["query"] = {**data["query"], "vector_weight": 0.0, "fulltext_weight": 0.5}
    (tmp_path / "set.yaml").write_text(yaml.safe_dump(data))
    assert [h.chunk_id for h in search(text, k=8, mode="hybrid", config=tmp_path / "set.yaml")] == fulltext, \
        "the config's own weights win over the embedder's"


def test_tied_cut_keeps_every_row_tied_with_the_last_one_kept():
    from query.search import tied_cut

    assert tied_cut({7: 0.9, 3: 0.5, 5: 0.5, 1: 0.2}, 2) == [7, 3, 5]
    assert tied_cut({7: 0.9, 3: 0.5}, 5) == [7, 3]
    assert tied_cut({}, 3) == []


def test_a_repeated_query_is_embedded_once_per_embedder_fingerprint():
    import numpy as np

    from query.search import query_vector

    class Counting:
        def __init__(self, fingerprint: str) -> None:
            self.fingerprint, self.calls = fingerprint, 0

        def embed(self, texts: list[str]) -> np.ndarray:
            self.calls += 1
            return np.full((len(texts), 3), float(len(self.fingerprint)), dtype=np.float32)

    a, same, other = Counting("test-a:dim=3"), Counting("test-a:dim=3"), Counting("test-bb:dim=3")
    assert query_vector(a, "tide tables") == query_vector(same, "tide tables") == [12.0] * 3
    assert (a.calls, same.calls) == (1, 0), "an equal fingerprint embeds alike: asked once"
    assert query_vector(other, "tide tables") == [13.0] * 3 and other.calls == 1


def test_hybrid_breaks_ties_between_identical_chunks_by_chunk_id(tmp_path, write_config):
    docs = tmp_path / "twins"
    docs.mkdir()
    body = "The quartermaster stores the spare winch handles in the port locker.\n"
    for name in ("c.md", "a.md", "b.md", "d.md"):  # written out of order: row order is not chunk id order
        (docs / name).write_text(f"# Winches\n\n{body}")
    config = write_config(docs, sources=[{"name": "twins", "path": str(docs)}])
    ingest(config_path=str(config))
    for k in (1, 2, 4):
        hits = search("spare winch handles", k=k, mode="hybrid", config=config)
        everything = search("spare winch handles", k=4, mode="hybrid", config=config)
        assert len({h.score for h in everything}) == 1, "identical chunks score alike"
        assert [h.chunk_id for h in hits] == sorted(h.chunk_id for h in everything)[:k]


def test_fulltext_finds_a_row_added_after_the_index_was_built(store, corpus):
    (corpus / "new-note.md").write_text("# Note\n\nThe zanzibar tide gauge was recalibrated on Tuesday.\n")
    summary = ingest(config_path=str(store))
    assert summary["docs_new"] == 1 and summary["indexes"]["fulltext"]["indexed"] > 0
    table = lancedb.connect(str(load_config(store).store.uri)).open_table("chunks")
    assert table.index_stats(fulltext_index_name(table)).num_unindexed_rows >= 1, "the new row is not in the index yet"
    assert search("zanzibar", k=1, mode="fulltext", config=store)[0].doc_id == "sample:new-note.md"


def test_as_of_a_run_tag_a_version_or_a_time_reads_the_table_as_it_was(store, corpus):
    cfg = load_config(store)
    table = lancedb.connect(str(cfg.store.uri)).open_table("chunks")
    first_tag, first_version = next((n, v) for n, v in table.tags.list().items() if n.startswith("run-"))
    first_version = first_version["version"]
    moment = max(v["timestamp"] for v in table.list_versions() if v["version"] == first_version)
    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text().replace("2% hardener", "3% hardener"))
    ingest(config_path=str(store))
    now = search("hardener percentage gelcoat", k=1, mode="fulltext", config=store)[0]
    assert "3% hardener" in now.text
    for as_of in (first_tag, first_version, moment.isoformat()):
        then = search("hardener percentage gelcoat", k=1, mode="fulltext", as_of=as_of, config=store)[0]
        assert "2% hardener" in then.text, as_of
    with pytest.raises(QueryError, match="neither a run tag"):
        search("x", as_of="no-such-run", config=store)


def test_neighbors_are_the_previous_and_next_chunks_in_order(read_store):
    hit = search("gelcoat hardener", k=1, mode="fulltext", neighbors=1, config=read_store)[0]
    i = hit.metadata["chunk_index"]
    assert [n.chunk_index for n in hit.before] == ([i - 1] if i > 0 else [])
    assert [n.chunk_index for n in hit.after] == ([i + 1] if i + 1 < hit.metadata["total_chunks"] else [])
    assert search("gelcoat hardener", k=1, mode="fulltext", config=read_store)[0].before == ()


def test_versions_list_runs_and_diff_names_edited_added_and_deleted_documents(store, corpus):
    from query import diff, versions

    (corpus / "guides" / "boat-maintenance.md").write_text(
        (corpus / "guides" / "boat-maintenance.md").read_text().replace("2% hardener", "3% hardener"))
    (corpus / "added.md").write_text("# Added\n\nA brand new page about mooring buoys.\n")
    (corpus / "policies" / "safety-policy.html").unlink()
    second = ingest(config_path=str(store))
    runs = versions(config=store)
    assert [r["run_id"] for r in runs][-1] == second["run_id"] and len(runs) == 2
    assert all(r["tag"] == r["run_id"] and r["chunks_version"] for r in runs)
    assert runs[-1]["docs_changed"] == 1 and runs[-1]["docs_deleted"] == 1

    change = diff(runs[0]["run_id"], runs[1]["run_id"], config=store)
    assert change.documents_added == ["sample:added.md"]
    assert change.documents_removed == ["sample:policies/safety-policy.html"]
    assert change.documents_changed == ["sample:guides/boat-maintenance.md"]
    assert len(change.chunks_added) == second["chunks_added"] and len(change.chunks_removed) == second["chunks_removed"]
    assert diff(runs[1]["run_id"], runs[1]["run_id"], config=store).documents_changed == []


def test_ann_index_is_built_past_the_size_threshold_and_reports_its_coverage(tmp_path, write_config):
    corpus = tmp_path / "many"
    corpus.mkdir()
    words = ["tide", "mooring", "engine", "gelcoat", "halyard", "spinnaker", "regatta", "buoy", "anchor", "winch", "rudder", "keel"]
    for i in range(70):
        sections = "\n\n".join(f"## Part {j}\n\n{words[(i + j) % 12]} notes {i}-{j}: " + " ".join(
            words[(i * j + n) % 12] for n in range(30)) for j in range(5))
        (corpus / f"doc{i:03d}.md").write_text(f"# Doc {i}\n\n{sections}\n")
    config = write_config(corpus, query={"ann_min_rows": 256})
    summary = ingest(config_path=str(config))
    assert summary["chunks_added"] >= 256
    assert summary["indexes"]["vector"] == {"indexed": summary["chunks_added"], "unindexed": 0}
    table = lancedb.connect(str(load_config(config).store.uri)).open_table("chunks")
    assert any(list(i.columns) == ["vector"] for i in table.list_indices())
    hit = search("doc 7 part 3 notes 7-3", k=1, mode="fulltext", config=config)[0]
    assert search(hit.text, k=1, mode="vector", config=config)[0].chunk_id == hit.chunk_id
    # More hits than the graph's search breadth (query.ef, 100): the breadth grows to the hits asked for, in every
    # mode (a hybrid search asks each side for k x candidates).
    for mode in ("vector", "hybrid"):
        assert len(search(hit.text, k=50, mode=mode, config=config)) == 50


def test_expired_documents_are_left_out_of_every_mode(tmp_path, corpus, write_config):
    old, fresh = tmp_path / "old", tmp_path / "fresh"
    for folder, word in ((old, "obsolete"), (fresh, "current")):
        folder.mkdir()
        (folder / "notice.md").write_text(f"# Notice\n\nThe {word} marina opening hours notice for quokka sailors.\n")
    config = write_config(corpus, sources=[
        {"name": "old", "path": str(old), "metadata": {"expires_at": "2020-01-01"}},
        {"name": "fresh", "path": str(fresh), "metadata": {"expires_at": "2999-01-01T00:00:00Z"}},
    ])
    ingest(config_path=str(config))
    for mode in ("vector", "fulltext", "hybrid"):
        assert {h.doc_id for h in search("quokka sailors opening hours", k=5, mode=mode, config=config)} == {
            "fresh:notice.md"}, mode


def test_a_store_written_before_new_columns_gains_them_and_keeps_working(store, corpus):
    db = lancedb.connect(str(load_config(store).store.uri))
    for name in ("chunks", "documents"):
        old = db.open_table(name).to_arrow().drop_columns(["expires_at"])
        db.drop_table(name)
        db.create_table(name, old)
    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text().replace("2% hardener", "3% hardener"))
    summary = ingest(config_path=str(store))
    assert summary["docs_changed"] == 1 and summary["docs_new"] == 0, "no document reprocessed for the new column"
    assert "expires_at" in db.open_table("chunks").schema.names
    assert "3% hardener" in search("gelcoat hardener", k=1, mode="fulltext", config=store)[0].text


def test_vector_share_follows_what_the_embedder_reads():
    from query.search import vector_share

    en = frozenset({"en"})
    assert vector_share(None, "ar", ["ar"]) == (1.0, None)
    share, why = vector_share(en, "ar", ["en"])
    assert share == 0.0 and "not the query's language (ar)" in why
    assert vector_share(en, "en", ["en", None]) == (1.0, None)
    share, why = vector_share(en, None, ["ar", "ar", "en", "en"])
    assert share == 0.5 and "50% of the full-text candidates" in why


def test_hybrid_skips_the_vector_side_for_a_language_the_embedder_does_not_read(tmp_path, corpus, write_config):
    from providers.embedders import HashingEmbedder
    from query.search import UNREAD_LANGUAGE, VECTOR_SIDE_FOR_LANGUAGE, query_language

    arabic = tmp_path / "arabic"
    arabic.mkdir()
    (arabic / "tides.md").write_text("# المد والجزر\n\nجداول المد والجزر في الميناء تتغير كل يوم مع القمر.\n")
    config = write_config(corpus, sources=[
        {"name": "sample", "path": str(corpus), "metadata": {"language": "en"}},
        {"name": "arabic", "path": str(arabic), "metadata": {"language": "ar"}},
    ])
    ingest(config_path=str(config))
    english_only = HashingEmbedder(dim=64)
    english_only.languages = frozenset({"en"})
    query = "جداول المد والجزر في الميناء"
    assert query_language(query) == "ar"
    hybrid = search(query, k=3, mode="hybrid", embedder=english_only, config=config)
    assert f"{VECTOR_SIDE_FOR_LANGUAGE} skipped" in hybrid.notices[0] and UNREAD_LANGUAGE in hybrid.notices[0]
    assert UNREAD_LANGUAGE in search(query, k=3, mode="vector", embedder=english_only, config=config).notices[0], \
        "what flows/eval.py records as a query whose language the embedder does not read"
    fulltext = search(query, k=3, mode="fulltext", config=config)
    assert [h.chunk_id for h in hybrid] == [h.chunk_id for h in fulltext]
    assert hybrid[0].doc_id == "arabic:tides.md"
    english = search("How do I winterize the outboard engine?", k=3, mode="hybrid", embedder=english_only,
                     config=config)
    assert english.notices == []


def test_index_variants_share_one_extraction_and_keep_their_own_tables(corpus, write_config, tmp_path):
    config = write_config(corpus, variants={"small": {"chunking": {"max_tokens": 60, "overlap_tokens": 10}},
                                            "wide": {"chunking": {"strategy": "fixed", "max_tokens": 400,
                                                                  "overlap_tokens": 0}}})
    first = ingest(config_path=str(config))
    run_dir = Path(load_config(config).store.artifacts) / first["run_id"]
    assert set(first["variants"]) == {"small", "wide"}
    assert first["variants"]["small"]["chunks_added"] > first["chunks_added"] > first["variants"]["wide"]["chunks_added"]
    assert run_artifact(run_dir, "extracted").num_rows and run_artifact(run_dir / "small", "elements").num_rows
    db = lancedb.connect(str(load_config(config).store.uri))
    listed = db.list_tables()
    assert {"chunks", "chunks__small", "chunks__wide", "documents__small", "runs__wide"} <= set(
        getattr(listed, "tables", listed))
    wide = search("gelcoat hardener", k=1, mode="fulltext", variant="wide", config=config)[0]
    main = search("gelcoat hardener", k=1, mode="fulltext", config=config)[0]
    assert wide.doc_id == main.doc_id and len(wide.text) > len(main.text), "each variant answers from its table"
    with pytest.raises(QueryError, match="variant 'nope' is not in the config's variants"):
        search("x", variant="nope", config=config)

    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text().replace("2% hardener", "3% hardener"))
    second = ingest(config_path=str(config))
    assert second["docs_changed"] == 1 and second["variants"]["small"]["docs_changed"] == 1
    extracted = run_artifact(Path(load_config(config).store.artifacts) / second["run_id"], "extracted")
    assert extracted["doc_id"].to_pylist() == ["sample:guides/boat-maintenance.md"], "extracted once for all"


def test_a_warmed_reader_bounds_its_caches_by_what_its_version_needs(store, corpus):
    import importlib

    from query.search import cache_bounds

    search_module = importlib.import_module("query.search")  # the package's `search` attribute is the function
    assert cache_bounds(32 << 20) == (48 << 20, 12 << 20), "1.25 x loaded + 8 MB; an eighth + 8 MB"
    uri = str(load_config(store).store.uri)
    search_module._CACHE_BOUNDS.pop(uri, None)  # as in a new process
    assert search("gelcoat hardener", k=1, mode="fulltext", config=store)
    before = search_module.store_connection(load_config(store))
    warm(config=store)
    index_bytes, metadata_bytes = search_module._CACHE_BOUNDS[uri]
    assert index_bytes > 8 << 20 and metadata_bytes > 8 << 20, "sized from the indexes it loaded"
    assert search_module.store_connection(load_config(store)) is not before, "reads go through a bounded connection"
    (corpus / "fresh.md").write_text("# Fresh\n\nThe wombat slipway opens at dawn.\n")
    ingest(config_path=str(store))
    assert search("wombat slipway", k=1, mode="hybrid", config=store)[0].doc_id == "sample:fresh.md"
    warm(config=store)
    assert search_module._CACHE_BOUNDS[uri] == (index_bytes, metadata_bytes), "bounded once per process"


def test_search_sees_new_runs_and_a_chunks_table_made_anew(store, corpus):
    warm(config=store)  # the table is now cached, its indexes loaded
    assert search("gelcoat hardener", k=1, mode="fulltext", config=store)
    (corpus / "fresh.md").write_text("# Fresh\n\nThe wombat slipway opens at dawn.\n")
    ingest(config_path=str(store))
    assert search("wombat slipway", k=1, mode="fulltext", config=store)[0].doc_id == "sample:fresh.md"
    db = lancedb.connect(str(load_config(store).store.uri))
    db.drop_table("chunks")
    db.drop_table("documents")
    ingest(config_path=str(store))
    assert search("wombat slipway", k=1, mode="vector", config=store)[0].doc_id == "sample:fresh.md"


def test_tables_are_written_in_the_file_format_chosen_for_fast_row_fetches(read_store):
    # A Lance data file ends with its format version (two little-endian u16) and the magic "LANC".
    files = list(Path(load_config(read_store).store.uri).glob("*.lance/data/*.lance"))
    assert {p.parent.parent.name for p in files} >= {"chunks.lance", "documents.lance", "runs.lance"}
    versions = {struct.unpack("<HH", p.read_bytes()[-8:-4]) for p in files}
    assert versions == {tuple(int(n) for n in FILE_FORMAT.split("."))}


@pytest.mark.parametrize("rewrite", ["update", "compact"])
def test_a_search_reads_one_version_while_a_run_commits_between_its_reads(store, monkeypatch, rewrite):
    # A commit lands after hybrid's two sides ranked ids in one version and before the winners are fetched.
    searcher = sys.modules["query.search"]
    fetch, calls = searcher._fetch, []

    def commit_then_fetch(table, row_ids):
        if not calls:
            writer = lancedb.connect(str(load_config(store).store.uri)).open_table("chunks")
            writer.update(where="access_level = 'public'", values={"text": "REWRITTEN"})
            if rewrite == "compact":  # the rows' old data files leave the latest version
                writer.optimize()
        calls.append(len(row_ids))
        return fetch(table, row_ids)

    monkeypatch.setattr(searcher, "_fetch", commit_then_fetch)
    hits = search("gelcoat hardener", k=3, mode="hybrid", config=store)
    assert len(calls) == 2, "read again after the commit"
    assert hits and "REWRITTEN" not in {h.text for h in hits}, "every hit from the published version it began with"


def test_an_answer_names_its_version_and_get_context_reads_one_while_a_run_commits(store, monkeypatch):
    from query.service import Caller, KnowledgeBase, open_knowledge_base

    cfg = load_config(store)
    kb = open_knowledge_base(cfg, store.parent / "access.jsonl")
    who = Caller("test", "public")
    published = kb.published_version()
    found = kb.search(who, "gelcoat hardener", k=2, mode="hybrid")
    assert found.hits and found.version == published
    assert kb.search(who, "gelcoat hardener", k=1, mode="vector", as_of=str(published - 1)).version == published - 1
    chunk = found.hits[0].chunk_id
    # A commit lands after the chunk was read and before its neighbours are: both still come from one version.
    rows, calls = KnowledgeBase._rows, []

    def commit_between(table, where, limit):  # noqa: ANN001, ANN202 - the patched staticmethod's own signature
        if len(calls) == 1:
            writer = lancedb.connect(str(cfg.store.uri)).open_table("chunks")
            writer.update(where="access_level = 'public'", values={"text": "REWRITTEN"})
        calls.append(where)
        return rows(table, where, limit)

    monkeypatch.setattr(KnowledgeBase, "_rows", staticmethod(commit_between))
    answer = kb.get_context(who, chunk, neighbors=3)
    assert len(calls) == 4, "read again, pinned, after the commit"
    assert answer.version == published and answer.before + answer.after
    assert "REWRITTEN" not in {answer.chunk.text, *(n.text for n in answer.before + answer.after)}
