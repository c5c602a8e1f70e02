"""The publish gate, publishing a held run by hand, and rollback: what readers get, with the real flow and store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lancedb
import pytest
from prefect import get_client

from flows.ingest import ingest
from flows.publishing import publish_run, rollback
from query import search, versions
from schemas.config import GateConfig, load_config
from schemas.errors import ConfigError, PublishHeldError, StoreBusyError, StoreError
from store.tables import writer_lock
from tests.gemini_server import GeminiServer

pytestmark = [pytest.mark.flow, pytest.mark.usefixtures("prefect_harness")]
QUESTIONS = Path(__file__).resolve().parent.parent / "data" / "sample-questions.csv"
BROKEN = "Lorem ipsum dolor sit amet, the extractor gave nothing else.\n"
# The text documents a broken extractor would empty: the wind limits, winterizing and moorings questions' gold.
TEXT_DOCS = ("policies/safety-policy.html", "guides/boat-maintenance.md", "harbour-faq.txt")


def _gated(write_config, corpus: Path, **gate) -> Path:
    return write_config(corpus, publish={"gate": {"questions": str(QUESTIONS), "mode": "fulltext", **gate}})


def _top(config: Path, text: str) -> list[tuple[str, float]]:
    return [(h.chunk_id, h.score) for h in search(text, k=3, config=config, clearance="confidential")]


def test_the_gate_holds_a_run_with_broken_extraction_and_publishes_a_good_one(write_config, corpus):
    config = _gated(write_config, corpus)
    first = ingest(config_path=str(config))
    assert first["gate"]["status"] == "passed" and first["gate"]["baseline"] is None
    before = _top(config, "wind limits for laser dinghies")
    originals = {name: (corpus / name).read_text(encoding="utf-8") for name in TEXT_DOCS}
    for name in TEXT_DOCS:  # as a broken extractor would leave them
        (corpus / name).write_text(BROKEN, encoding="utf-8")

    with pytest.raises(PublishHeldError) as held:
        ingest(config_path=str(config))
    summary = held.value.summary
    gate = summary["gate"]
    assert gate["status"] == "held" and gate["recall"] < gate["baseline"] - 0.02
    lost = {q["question"] for q in gate["lost"]}
    assert {"What are the wind limits for laser dinghies?", "Where can I park my boat trailer?"} <= lost
    assert "How much surplus did the regatta make?" not in lost, "a question whose document is intact is not lost"
    assert _top(config, "wind limits for laser dinghies") == before, "readers still see the published version"
    runs = {r["run_id"]: r for r in versions(config=config)}
    assert runs[summary["run_id"]]["status"] == "held" and not runs[summary["run_id"]]["published"]
    assert runs[first["run_id"]]["published"] and runs[first["run_id"]]["gate"] == "passed"

    for name, text in originals.items():
        (corpus / name).write_text(text, encoding="utf-8")
    good = ingest(config_path=str(config))
    assert good["gate"]["status"] == "passed" and good["docs_changed"] == len(TEXT_DOCS)
    assert {r["run_id"]: r for r in versions(config=config)}[good["run_id"]]["published"]


def test_a_held_run_is_published_by_hand(write_config, corpus, tmp_path):
    questions = tmp_path / "questions.csv"  # one question's gold is no document of the corpus: recall 0.5
    questions.write_text("question,gold\nWhere can I park my boat trailer?,harbour-faq.txt\n"
                         "Where is the clubhouse bar?,bar-menu.md\n", encoding="utf-8")
    config = write_config(corpus, publish={"gate": {"questions": str(questions), "min_recall": 0.9}})
    state = ingest(config_path=str(config), return_state=True)
    assert (state.type.value, state.name) == ("FAILED", "Held"), "the UI shows a held run as needing attention"
    with pytest.raises(PublishHeldError) as held:
        state.result()
    run_id = held.value.summary["run_id"]
    assert "below the floor" in str(held.value) and f"inlet publish {run_id}" in str(held.value)
    assert "no version was published before it" in str(held.value), "a first run has no version to keep"
    recorded = get_client(sync_client=True).read_flow_run(state.state_details.flow_run_id).state
    assert (recorded.type.value, recorded.name) == ("FAILED", "Held"), "the server records the Held state"
    moved = publish_run(load_config(config), run_id)
    chunks = lancedb.connect(str(load_config(config).store.uri)).open_table("chunks")
    assert moved == {"chunks": chunks.tags.get_version(run_id)} == {"chunks": chunks.tags.get_version("published")}
    assert {r["run_id"]: r for r in versions(config=config)}[run_id]["gate"] == "published by hand"
    with pytest.raises(StoreError, match="no chunks table has a version tagged 'run-nope'"):
        publish_run(load_config(config), "run-nope")


def test_a_missing_gate_questions_file_fails_before_the_run_naming_the_key(write_config, corpus, tmp_path):
    config = write_config(corpus, publish={"gate": {"questions": str(tmp_path / "nowhere.csv")}})
    with pytest.raises(ConfigError, match=r"inlet.yaml: publish.gate.questions: .*nowhere.csv is not a file"):
        ingest(config_path=str(config))
    assert not (tmp_path / "store" / "lancedb").exists() or not lancedb.connect(
        str(tmp_path / "store" / "lancedb")).table_names()


@pytest.fixture
def server() -> Iterator[GeminiServer]:
    srv = GeminiServer().start()
    yield srv
    srv.stop()


def test_rollback_returns_the_first_runs_results_and_the_next_ingest_pays_only_for_what_the_cache_lacks(
        write_config, corpus, server, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "AIza-rollback-key-0000000000000000")
    config = write_config(corpus, enrichment={"provider": "gemini", "kind": "questions", "base_url": server.base_url},
                          embedding={"kind": "gemini", "dim": 32, "base_url": server.base_url})
    question = "How do I winterize the outboard engine?"
    first = ingest(config_path=str(config))
    results_first = _top(config, question)
    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text().replace("Winterizing", "Laying up for winter"), encoding="utf-8")
    (corpus / "harbour-faq.txt").unlink()
    second = ingest(config_path=str(config), allow_deletions=True)
    results_second = _top(config, question)
    assert second["docs_changed"] == 1 and second["docs_deleted"] == 1 and results_second != results_first

    done = rollback(load_config(config), first["run_id"])
    assert done["chunks"]["run"] == first["run_id"]
    assert _top(config, question) == results_first, "search returns the first run's results exactly"
    db = lancedb.connect(str(load_config(config).store.uri))
    documents = db.open_table("documents").to_arrow()
    assert "sample:harbour-faq.txt" in documents["doc_id"].to_pylist(), "the documents table went back too"
    assert versions(config=config)[-1]["status"] == "rollback" and versions(config=config)[-1]["published"]

    calls = dict(server.traffic.calls)
    again = ingest(config_path=str(config), allow_deletions=True)
    assert (again["docs_changed"], again["docs_deleted"]) == (1, 1), "the sources come back in"
    assert server.traffic.calls == calls, "every enrichment and vector came from the model cache"
    assert again["texts_enriched"] == again["texts_embedded"] == 0 and again["cost_usd"] == 0
    assert _top(config, question) == results_second


def test_rollback_is_refused_while_a_run_writes_and_names_an_unknown_target(write_config, corpus):
    config = write_config(corpus)
    run = ingest(config_path=str(config))
    cfg = load_config(config)
    with writer_lock(cfg.store.uri, "run-somebody-else"), pytest.raises(StoreBusyError):
        rollback(cfg, run["run_id"])
    with pytest.raises(StoreError, match="'run-nope' is neither a run id nor a chunks version"):
        rollback(cfg, "run-nope")
    version = lancedb.connect(str(cfg.store.uri)).open_table("chunks").tags.get_version(run["run_id"])
    assert rollback(cfg, str(version))["chunks"]["run"] == run["run_id"], "a run's chunks version names it too"


def test_gate_rules_pass_or_hold_on_the_mean_recall():
    from query.gate import judge

    questions = [("a", {"x": 1}), ("b", {"y": 1})]
    rule = GateConfig(questions=QUESTIONS, max_drop=0.02)
    assert judge(questions, [1.0, 1.0], [1.0, 1.0], rule, 5, 4).status == "passed"
    held = judge(questions, [1.0, 0.0], [1.0, 1.0], rule, 5, 4)
    assert held.status == "held" and held.lost == [{"question": "b", "gold": "y"}] and held.recall == 0.5
    assert judge(questions, [0.5, 0.5], None, rule, 5, None).status == "passed", "no baseline: only a floor holds"
    floor = GateConfig(questions=QUESTIONS, max_drop=None, min_recall=0.6)
    assert judge(questions, [0.5, 0.5], None, floor, 5, None).status == "held"
