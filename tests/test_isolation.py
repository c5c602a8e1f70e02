"""One document never fails a run: a poison pill in any per-document stage quarantines that document only, and
the same error on most documents stops the run before it commits anything (runtime/isolate.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import lancedb
import pytest

import flows.writer
import tasks.chunk
import tasks.embed
import tasks.enrich
import tasks.extract
import tasks.quality
from flows.batch import IndexWork
from flows.ingest import ingest
from flows.writer import Writer
from providers.embedders import HashingEmbedder
from providers.enrichers import KeywordEnricher
from query import quarantined, search
from runtime.isolate import Breaker, failing_items, model_fails_run
from schemas.config import load_config
from schemas.errors import DocumentFailure, SystemicFailureError
from store.commit import CommitTarget, LoadResult
from tests.gemini_server import Faults, GeminiServer

GUIDE = "sample:guides/boat-maintenance.md"
OTHERS = {"sample:harbour-faq.txt", "sample:handbook/membership-handbook.docx", "sample:policies/safety-policy.html",
          "sample:reports/regatta-report-2025.pdf"}


def _boom(exc: BaseException) -> Callable[..., object]:
    def raise_it(*_args: object, **_kwargs: object) -> object:
        raise exc

    return raise_it


def _poison(monkeypatch: pytest.MonkeyPatch, stage: str, exc: BaseException) -> None:
    """Make one document (the boat-maintenance guide) raise exc in the given stage; the others go through."""
    if stage == "extract":  # cleaning Markdown: the guide is the sample's one Markdown file
        monkeypatch.setattr(tasks.extract, "clean_markdown", _boom(exc))
    elif stage == "chunk":
        real = tasks.chunk.pieces_for_document
        monkeypatch.setattr(tasks.chunk, "pieces_for_document",
                            lambda rows, cfg: _boom(exc)() if rows[0]["doc_id"] == GUIDE else real(rows, cfg))
    elif stage == "enrich input":
        real = tasks.enrich.enrich_input
        monkeypatch.setattr(tasks.enrich, "enrich_input",
                            lambda row, title: _boom(exc)() if row["doc_id"] == GUIDE else real(row, title))
    elif stage == "embed input":
        real = tasks.embed.embedding_input
        monkeypatch.setattr(tasks.embed, "embedding_input", lambda text, enrichment, delimiter: (
            _boom(exc)() if "gelcoat" in text else real(text, enrichment, delimiter)))
    elif stage == "enrich model":  # the local enricher raises on one chunk's text
        real = KeywordEnricher._keywords
        monkeypatch.setattr(KeywordEnricher, "_keywords",
                            lambda self, text: _boom(exc)() if "gelcoat" in text else real(self, text))
    elif stage == "embed model":  # the local model raises on any call that holds one chunk's text
        real = HashingEmbedder.embed
        monkeypatch.setattr(HashingEmbedder, "embed", lambda self, texts, titles=None: (
            _boom(exc)() if any("gelcoat" in t for t in texts) else real(self, texts, titles)))
    elif stage == "validate":
        real = tasks.quality.validate_together
        monkeypatch.setattr(tasks.quality, "validate_together", lambda table, suites: (
            _boom(exc)() if GUIDE in table["doc_id"].to_pylist() else real(table, suites)))


def _rows(config: Path, table: str) -> list[dict]:
    return lancedb.connect(str(load_config(config).store.uri)).open_table(table).to_arrow().to_pylist()


POISONS = [("extract", AttributeError("'NumberObject' object has no attribute 'items'"), "extract"),
           ("extract", MemoryError(), "extract"),
           ("chunk", IndexError("list index out of range"), "chunk"),
           ("enrich input", RecursionError("maximum recursion depth exceeded"), "enrich"),
           ("embed input", AttributeError("'NoneType' object has no attribute 'strip'"), "embed"),
           ("enrich model", ValueError("the keyword model cannot read this text"), "enrich"),
           ("embed model", IndexError("index 512 is out of bounds"), "embed"),
           ("validate", RecursionError("maximum recursion depth exceeded"), "validate")]


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize(("where", "exc", "stage"), POISONS, ids=[f"{p[0]}-{type(p[1]).__name__}" for p in POISONS])
def test_a_document_that_raises_in_any_stage_is_quarantined_and_the_others_are_indexed(
        where, exc, stage, corpus, write_config, monkeypatch):
    config = write_config(corpus)
    _poison(monkeypatch, where, exc)
    summary = ingest(config_path=str(config))

    name = type(exc).__name__
    assert summary["docs_new"] == 5 and summary["docs_quarantined"] == 1
    [quarantined] = summary["quarantined"]
    assert (quarantined["doc_id"], quarantined["stage"], quarantined["reason"]) == (GUIDE, stage, "error")
    assert quarantined["message"] == f"{name}: {exc}" if str(exc) else quarantined["message"] == name
    [row] = _rows(config, "quarantine")
    assert (row["doc_id"], row["stage"], row["reason"]) == (GUIDE, stage, "error")
    documents = {r["doc_id"]: r for r in _rows(config, "documents")}
    assert documents[GUIDE]["status"] == "quarantined" and documents[GUIDE]["error"].startswith(f"error: {name}")
    assert all(documents[d]["status"] == "ok" and documents[d]["total_chunks"] > 0 for d in OTHERS)
    assert {r["doc_id"] for r in _rows(config, "chunks")} == OTHERS, "no chunk of the failed document is indexed"
    hits = search("harbour office opening hours", k=3, config=config, mode="fulltext")
    assert hits and {h.doc_id for h in hits} <= OTHERS

    again = ingest(config_path=str(config))  # the poison is still there: nothing to do, nothing fails
    assert again["docs_unchanged"] == 5 and again["texts_embedded"] == 0 and again["docs_quarantined"] == 0


@pytest.mark.usefixtures("prefect_harness")
def test_a_quarantined_document_is_indexed_once_the_fault_is_gone_with_retry_quarantined(
        corpus, write_config, monkeypatch):
    config = write_config(corpus)
    with monkeypatch.context() as patch:
        _poison(patch, "chunk", IndexError("list index out of range"))
        assert ingest(config_path=str(config))["docs_quarantined"] == 1
    retried = ingest(config_path=str(config), retry_quarantined=True)
    assert retried["docs_changed"] == 1 and retried["docs_quarantined"] == 0
    assert {r["doc_id"] for r in _rows(config, "chunks")} == OTHERS | {GUIDE}
    assert _rows(config, "quarantine") == []


@pytest.mark.usefixtures("prefect_harness")
def test_a_provider_that_refuses_one_input_quarantines_that_document_only(corpus, write_config, monkeypatch):
    """The real google-genai client gets a 400 for the requests holding one chunk's text: not an outage."""
    monkeypatch.setenv("GEMINI_API_KEY", "AIza-test-key")
    server = GeminiServer(Faults(reject_text="gelcoat")).start()
    try:
        config = write_config(corpus, embedding={"kind": "gemini", "dim": 32, "base_url": server.base_url,
                                                 "attempts": 2})
        summary = ingest(config_path=str(config))
        [quarantined] = summary["quarantined"]
        assert quarantined["doc_id"] == GUIDE and quarantined["message"].startswith("ClientError: 400")
        assert {r["doc_id"] for r in _rows(config, "chunks")} == OTHERS
    finally:
        server.stop()


def _tables_written(config: Path) -> list[str]:
    """The store's tables, but the model cache: a stopped run keeps the answers it was given, and commits nothing."""
    store = load_config(config).store
    return sorted(p.stem for p in Path(store.uri).glob("*.lance") if p.stem != store.cache_table)


@pytest.mark.usefixtures("prefect_harness")
def test_a_provider_outage_fails_the_run_before_any_commit(corpus, write_config, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "AIza-test-key")
    server = GeminiServer(Faults(p500=1.0, retry_delay_s=0)).start()
    try:
        config = write_config(corpus, embedding={"kind": "gemini", "dim": 32, "base_url": server.base_url,
                                                 "attempts": 2})
        with pytest.raises(Exception, match="500"):
            ingest(config_path=str(config))
        assert _tables_written(config) == [], "nothing committed, nothing quarantined"
    finally:
        server.stop()


def _many(folder: Path, good: int, bad: int) -> Path:
    folder.mkdir()
    for i in range(good):
        (folder / f"a-good-{i:02}.md").write_text(f"# Good note {i}\n\nMooring line number {i} is checked weekly.\n")
    for i in range(bad):
        (folder / f"b-bad-{i:02}.md").write_text(f"# Note {i}\n\nThe winch handle {i} is kept in the locker.\n")
    return folder


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("good", [0, 6])
def test_the_same_error_on_most_documents_stops_the_run_and_writes_nothing(good, tmp_path, write_config, monkeypatch):
    """A broken install (every parser call raising ImportError) is not 24 bad documents: nothing is quarantined."""
    folder = _many(tmp_path / "notes", good=good, bad=24)
    # Batches of 6: the first is all good, so only the breaker's hold keeps the writer from committing it.
    config = write_config(folder, execution={"batch_docs": 6})
    real = tasks.chunk.pieces_for_document
    with monkeypatch.context() as patch:
        patch.setattr(tasks.chunk, "pieces_for_document", lambda rows, cfg: (
            _boom(ImportError("libmagic.so.1: cannot open shared object file"))() if ":b-bad-" in rows[0]["doc_id"]
            else real(rows, cfg)))
        with pytest.raises(SystemicFailureError, match=rf"24 of {24 + good} documents failed with ImportError") as caught:
            ingest(config_path=str(config))
    assert "sample:b-bad-" in str(caught.value) and "libmagic.so.1" in str(caught.value)
    assert _tables_written(config) == [], "no table written, nothing quarantined"

    fixed = ingest(config_path=str(config))
    assert fixed["docs_new"] == 24 + good and fixed["docs_quarantined"] == 0


@pytest.mark.usefixtures("prefect_harness")
def test_parsers_past_their_time_limit_cost_their_documents_not_the_run(corpus, write_config):
    """Every non-Markdown file goes to an extraction worker that is killed at its time limit; the run goes on."""
    config = write_config(corpus, extraction={"timeout_s": 0.01})
    summary = ingest(config_path=str(config))
    timed_out = {q["doc_id"] for q in summary["quarantined"] if q["reason"] == "timeout"}
    assert timed_out and timed_out <= OTHERS and summary["docs_quarantined"] == len(timed_out)
    assert {r["doc_id"] for r in _rows(config, "chunks")} == {GUIDE} | (OTHERS - timed_out), \
        "a small text file may beat 10 ms; every other document is indexed"


@pytest.mark.usefixtures("prefect_harness")
def test_known_reasons_never_trip_the_breaker(tmp_path, write_config):
    """A folder of empty files is data, not a broken install: all quarantined, the run completes."""
    folder = _many(tmp_path / "notes", good=2, bad=0)
    for i in range(25):
        (folder / f"empty-{i:02}.md").write_text("   \n")
    summary = ingest(config_path=str(write_config(folder)))
    assert summary["docs_quarantined"] == 25 and {q["reason"] for q in summary["quarantined"]} == {"empty"}


def test_breaker_trips_only_past_the_share_and_the_minimum():
    def failures(n: int, kind: str = "ImportError") -> list[tuple[str, str, str]]:
        return [(f"d{i}", kind, f"{kind}: x") for i in range(n)]

    small = Breaker(attempted=30)
    small.observe(30, failures(19))
    small.check()  # 19 < 20 documents: a few bad files in a small run

    split = Breaker(attempted=100)
    split.observe(100, failures(30, "ImportError") + [(f"e{i}", "KeyError", "KeyError: x") for i in range(30)])
    split.check()  # 60% fail, but no one type holds more than half

    tripped = Breaker(attempted=40)
    tripped.observe(40, failures(21))
    with pytest.raises(SystemicFailureError, match="21 of 40 documents failed with ImportError"):
        tripped.check()


def test_writer_waits_while_later_batches_could_still_trip_the_breaker():
    breaker = Breaker(attempted=100)
    breaker.observe(10, [])
    assert breaker.undecided(), "90 documents to come could all fail alike"
    breaker.observe(40, [])
    assert not breaker.undecided(), "50 to come cannot be more than half of 100"
    tiny = Breaker(attempted=10)
    assert not tiny.undecided(), "under the minimum of 20 documents nothing can trip"


def test_a_failing_call_is_halved_until_the_items_that_fail_alone_are_found():
    calls: list[Sequence[int]] = []

    def call(rows: Sequence[int]) -> None:
        calls.append(list(rows))
        if 5 in rows or 11 in rows:
            raise ValueError("bad input")

    failed = failing_items(call, range(16), fatal=lambda exc: False)
    assert set(failed) == {5, 11} and all(isinstance(e, ValueError) for e in failed.values())
    assert len(calls) < 16, "fewer calls than one per item"

    def outage(rows: Sequence[int]) -> None:
        raise ConnectionError("503")

    with pytest.raises(ConnectionError):
        failing_items(outage, range(16), fatal=lambda exc: isinstance(exc, ConnectionError))


def test_a_document_failure_names_the_exception_type_and_its_first_line():
    failure = DocumentFailure.of("d", "chunk", ValueError("first line\nsecond line"))
    assert (failure.reason, failure.message, failure.error_type) == ("error", "ValueError: first line", "ValueError")


@pytest.mark.usefixtures("prefect_harness")
def test_inlet_quarantine_lists_reason_message_since_and_attempts(corpus, write_config, monkeypatch):
    config = write_config(corpus)
    _poison(monkeypatch, "chunk", IndexError("list index out of range"))
    ingest(config_path=str(config))
    ingest(config_path=str(config), retry_quarantined=True)  # tried again, fails again: a second attempt
    [row] = quarantined(config=config)
    assert (row["doc_id"], row["stage"], row["reason"], row["attempts"]) == (GUIDE, "chunk", "error", 2)
    assert row["message"] == "IndexError: list index out of range" and row["since"] < row["at"]

    out = subprocess.run([sys.executable, "-m", "inlet.cli", "quarantine", "--config", str(config)], check=True,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert "1 quarantined" in out.stdout and GUIDE in out.stdout and "IndexError" in out.stdout
    listed = json.loads(subprocess.run([sys.executable, "-m", "inlet.cli", "quarantine", "--config", str(config),
                                        "--json"], check=True, capture_output=True, text=True, timeout=300).stdout)
    assert [(r["doc_id"], r["attempts"]) for r in listed] == [(GUIDE, 2)]


@pytest.mark.usefixtures("prefect_harness")
def test_names_that_are_not_utf8_and_named_pipes_are_left_out_with_a_notice_and_the_run_goes_on(
        tmp_path, write_config):
    """Such a name failed the crawl, and so the whole run, with UnicodeEncodeError (no Arrow string holds it); a
    named pipe ending in .md hung the run for good, its read waiting on a writer that never came."""
    folder = _many(tmp_path / "notes", good=1, bad=0)
    (folder / os.fsdecode(b"caf\xe9-latin1.md")).write_text("# Cafe\n\nOpening hours of the club cafe.\n")
    os.mkfifo(folder / "pipe.md")
    summary = ingest(config_path=str(write_config(folder)))
    assert summary["docs_new"] == 1
    assert any("1 file(s) whose names are not valid UTF-8" in n and "caf\\xe9-latin1.md" in n
               for n in summary["notices"])
    assert any("1 entries that are not regular files" in n and "pipe.md" in n for n in summary["notices"])


def test_commits_held_for_the_breaker_go_out_in_groups_of_commit_rows(monkeypatch):
    """Holding half a big run must not turn it into one huge commit group: a crash would lose all of it."""
    groups: list[int] = []
    counts = dict.fromkeys(("chunks_added", "chunks_removed", "chunks_reused", "chunks_written", "docs_quarantined"), 0)
    monkeypatch.setattr(flows.writer, "upsert_stage", lambda target, documents, extracted, embedded, **kw: (
        groups.append(len(embedded)) or LoadResult(**counts)))
    target = CommitTarget("store", "chunks", "documents", dim=4, settings_fp="fp", run_id="run", now=datetime.now(UTC))
    writer = Writer(target, "documents.parquet", commit_rows=10, batches=8)
    batch = lambda n: IndexWork(f"b/{n}/extracted", f"b/{n}/embedded", 6, {}, {}, [], [])  # noqa: E731
    for n in range(3):
        writer.add(batch(n), hold=True)
    assert groups == []
    writer.add(batch(3))  # 24 rows held: groups of at least 10 rows, as without the hold
    assert groups == [2, 2]


def test_a_bad_key_is_an_outage_but_a_refused_input_is_not():
    """Gemini answers an invalid key with 400 too: halving would spend 2n-1 calls and quarantine every document."""
    from google.genai import errors

    def error(code: int, message: str, status: str, reason: str | None = None) -> errors.APIError:
        details = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason}] if reason else []
        return errors.ClientError(code, {"error": {"code": code, "message": message, "status": status,
                                                   "details": details}})

    assert model_fails_run(error(400, "API key not valid. Please pass a valid API key.", "INVALID_ARGUMENT",
                                 "API_KEY_INVALID"))
    assert model_fails_run(error(400, "User location is not supported for the API use.", "FAILED_PRECONDITION"))
    assert model_fails_run(error(403, "Permission denied.", "PERMISSION_DENIED"))
    assert model_fails_run(errors.ServerError(503, {"error": {"code": 503, "message": "overloaded"}}))
    assert not model_fails_run(error(400, "Request contains an invalid argument.", "INVALID_ARGUMENT"))
    assert not model_fails_run(ValueError("the local model cannot embed this text"))


@pytest.mark.usefixtures("prefect_harness")
def test_each_index_variant_keeps_its_own_quarantine_list(corpus, write_config, monkeypatch):
    """A document that fails only in a variant's chunking is quarantined there; the main index has it."""
    config = write_config(corpus, variants={"small": {"chunking": {"max_tokens": 60, "overlap_tokens": 10}}})
    real = tasks.chunk.pieces_for_document
    monkeypatch.setattr(tasks.chunk, "pieces_for_document", lambda rows, cfg: (
        _boom(IndexError("list index out of range"))() if rows[0]["doc_id"] == GUIDE and cfg.max_tokens == 60
        else real(rows, cfg)))
    summary = ingest(config_path=str(config))
    assert summary["docs_quarantined"] == 0 and summary["variants"]["small"]["docs_quarantined"] == 1
    assert quarantined(config=config) == []
    assert [(r["doc_id"], r["stage"], r["attempts"]) for r in quarantined(config=config, variant="small")] == [
        (GUIDE, "chunk", 1)]
    assert GUIDE in {r["doc_id"] for r in _rows(config, "chunks")}


def test_a_library_missing_in_the_extraction_workers_stops_the_run_naming_it(prefect_harness, tmp_path, write_config):
    """A real broken install, not an injected exception: `unstructured` fails to import in every extraction worker
    (a package on PYTHONPATH that raises ImportError stands in for a missing system library)."""
    from prefect.settings import PREFECT_API_URL

    broken = tmp_path / "broken" / "unstructured"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("libmagic.so.1: cannot open shared object file")\n')
    folder = tmp_path / "pages"
    folder.mkdir()
    for i in range(22):
        (folder / f"p{i:02}.html").write_text(f"<html><body><h1>Page {i}</h1><p>Mooring rule {i}.</p></body></html>")
    config = write_config(folder)
    env = {**os.environ, "PYTHONPATH": str(broken.parent), "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    out = subprocess.run([sys.executable, "-m", "inlet.cli", "ingest", "--config", str(config), "--quiet"],
                         capture_output=True, text=True, timeout=300, env=env, check=False)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "error: 22 of 22 documents failed with ImportError" in out.stderr
    assert "libmagic.so.1: cannot open shared object file" in out.stderr
    assert _tables_written(config) == [], "nothing quarantined or committed"
