"""Every file of ../shared/corpora/bad in one real ingest run: indexed correctly or quarantined with a reason."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import lancedb
import pytest

from flows.ingest import ingest
from schemas.config import load_config
from schemas.errors import EXTRACTION_REASONS

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.slow]

# Files that must be indexed: pypdf reads their text once the empty user password is tried.
_OPENS_WITH_EMPTY_PASSWORD = re.compile(r"decrypt\('\'\)=[12] .*text_chars_first30p=[1-9]")
_LANGUAGE_SUFFIX = re.compile(r"-(croatian|czech|hungarian|slovak|slovene|romanian|bulgarian|russian|greek|turkish|"
                              r"hebrew|arabic)$")


def _labelled_encoding(name: str) -> str | None:
    """The encoding chardet's test corpus names in the file name, e.g. chardet__windows-1250-czech___ude_2.txt."""
    match = re.match(r"chardet__(.+?)__", name)
    return _LANGUAGE_SUFFIX.sub("", match.group(1).rstrip("_")) if match else None


@pytest.fixture(scope="module")
def bad_run(shared_corpora, tmp_path_factory, prefect_harness) -> tuple[dict, dict, Path]:
    """Ingest the whole bad folder once (read in place, never copied), two extraction workers."""
    tmp = tmp_path_factory.mktemp("bad")
    bad = shared_corpora / "bad"
    config = tmp / "inlet.yaml"
    config.write_text(
        "sources:\n"
        f"  - {{name: bad, path: '{bad}', include: ['**/*'], exclude: [LABELS.tsv]}}\n"
        "extraction: {workers: 2, timeout_s: 120}\n"
        "enrichment: {enabled: false}\n"
        "embedding: {kind: hashing, dim: 64}\n"
        f"store: {{uri: '{tmp / 'lancedb'}', artifacts: '{tmp / 'runs'}'}}\n", encoding="utf-8")
    summary = ingest(config_path=str(config))
    labels = {r["path"]: r for r in csv.DictReader((bad / "LABELS.tsv").open(encoding="utf-8"), delimiter="\t")}
    return summary, labels, config


def test_every_bad_file_is_indexed_or_quarantined_with_a_known_reason(bad_run, shared_corpora):
    summary, labels, config = bad_run
    db = lancedb.connect(str(load_config(config).store.uri))
    docs = {d["doc_id"].removeprefix("bad:"): d for d in db.open_table("documents").to_arrow().to_pylist()}
    on_disk = {p.relative_to(shared_corpora / "bad").as_posix() for p in (shared_corpora / "bad").rglob("*")
               if p.is_file() and p.name != "LABELS.tsv"}
    assert set(docs) == on_disk, "every file has a documents row"
    reasons = {rel: d["error"].split(":", 1)[0] for rel, d in docs.items() if d["status"] == "quarantined"}
    assert set(reasons.values()) <= set(EXTRACTION_REASONS), reasons
    indexed = {rel for rel, d in docs.items() if d["status"] == "ok"}
    chunked = {r["doc_id"].removeprefix("bad:") for r in db.open_table("chunks").to_arrow().select(["doc_id"]).to_pylist()}
    assert indexed == chunked, "an ok document has chunks, a quarantined one none"
    assert summary["docs_quarantined"] == len(reasons)

    # The categories whose verdict is not in doubt.
    for rel in on_disk:
        category = rel.split("/", 1)[0]
        if category == "pdf_no_text_layer":
            assert reasons.get(rel) == "no_text", rel
        elif category in {"pdf_truncated", "office_corrupt"}:
            assert reasons.get(rel) == "corrupt", rel
        elif category == "office_encrypted":
            assert reasons.get(rel) == "encrypted", rel
        elif category == "unsupported_format":
            assert reasons.get(rel) == "unsupported", rel
        elif category == "empty_or_whitespace":
            assert reasons.get(rel) == "empty", rel
        elif category == "pdf_encrypted":
            observed = labels[rel]["observed_with_pypdf_7.1.0"]
            if _OPENS_WITH_EMPTY_PASSWORD.search(observed):
                assert rel in indexed, f"{rel} opens with the empty password: {observed}"
            elif "decrypt('')=0" in observed:
                assert reasons.get(rel) == "encrypted", rel
        elif category in {"wrong_extension", "non_utf8_text"}:
            assert rel in indexed, f"{rel}: {reasons.get(rel)}"


def test_wrong_extensions_are_read_by_content(bad_run):
    _, _, config = bad_run
    db = lancedb.connect(str(load_config(config).store.uri))
    titles = {d["doc_id"]: d["title"] for d in db.open_table("documents").to_arrow().to_pylist()}
    assert titles["bad:wrong_extension/langchain-llms-full.txt"] == "LangChain overview", "HTML saved as .txt"
    assert titles["bad:wrong_extension/renamed__tracemonkey.pdf.txt"].startswith("Trace-based Just-in-Time")
    assert titles["bad:wrong_extension/renamed__word_sample.docx.pdf"] == "Summer activities", "DOCX named .pdf"
    chunks = db.open_table("chunks").to_arrow().to_pylist()
    html_text = " ".join(c["text"] for c in chunks if c["doc_id"] == "bad:wrong_extension/langchain-llms-full.txt")
    assert "<script" not in html_text and "LangChain is the easiest way to start building agents" in html_text
    for furniture in ("Skip to main content", "Ask AI", "Docs by LangChain home page"):
        assert furniture not in html_text, "navigation, buttons and the site header are not content"
    pdf_pages = {c["page_start"] for c in chunks if c["doc_id"] == "bad:wrong_extension/renamed__tracemonkey.pdf.txt"}
    assert max(p for p in pdf_pages if p) >= 10, "a PDF named .txt keeps its page numbers"


def test_text_in_other_encodings_is_decoded_as_labelled(bad_run, shared_corpora):
    _, _, config = bad_run
    db = lancedb.connect(str(load_config(config).store.uri))
    chunks = db.open_table("chunks").to_arrow().to_pylist()
    checked = 0
    for path in sorted((shared_corpora / "bad" / "non_utf8_text").iterdir()):
        encoding = _labelled_encoding(path.name)
        if encoding is None or path.suffix not in {".txt", ".srt"}:
            continue  # HTML and XML lose their markup: their text is not the file's text
        expected = path.read_bytes().decode(encoding).lstrip("\ufeff")
        words = {w for w in re.findall(r"\w{4,}", expected) if not w.isascii()}
        got = " ".join(c["text"] for c in chunks if c["doc_id"] == f"bad:non_utf8_text/{path.name}")
        found = {w for w in words if w in got}
        # All non-ASCII words of the file, as the labelled encoding reads them (MacRoman: one symbol differs).
        assert len(found) >= 0.95 * len(words), (path.name, sorted(words - found)[:10])
        assert "\ufffd" not in got, path.name
        checked += 1
    assert checked >= 20
