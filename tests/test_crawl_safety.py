"""What a crawl must not do: leave its roots, read oversized files, hang on one document, delete en masse."""

from __future__ import annotations

import mimetypes
import shutil
from pathlib import Path

import lancedb
import pyarrow as pa
import pytest

from flows.ingest import ingest
from schemas.arrow import DOCUMENT_ROWS_SCHEMA, DOCUMENTS_SCHEMA, LISTING_SCHEMA
from schemas.config import ExtractionConfig, SourceConfig, load_config
from schemas.errors import ConfigError
from tasks.crawl import file_uri, list_source
from tasks.detect import classify_documents, held_deletions
from tasks.extract import extract_documents


def _doc_ids(config: Path) -> set[str]:
    db = lancedb.connect(str(load_config(config).store.uri))
    return {d["doc_id"] for d in db.open_table("documents").to_arrow().select(["doc_id"]).to_pylist()}


def test_symlinks_cannot_lead_the_crawl_outside_its_root(tmp_path):
    root, secret = tmp_path / "root", tmp_path / "secret"
    (root / "docs").mkdir(parents=True)
    secret.mkdir()
    (secret / "passwords.md").write_text("# Secret\n")
    (secret / "more").mkdir()
    (secret / "more" / "keys.md").write_text("# Keys\n")
    (root / "docs" / "guide.md").write_text("# Guide\n")
    (root / "docs" / "alias.md").symlink_to(root / "docs" / "guide.md")  # inside: fine
    (root / "docs" / "leak.md").symlink_to(secret / "passwords.md")
    (root / "linked-folder").symlink_to(secret / "more", target_is_directory=True)
    listed = list_source(SourceConfig(name="s", path=root))
    assert sorted(r["doc_id"] for r in listed.listing().to_pylist()) == ["s:docs/alias.md", "s:docs/guide.md"]
    assert "docs/leak.md" in listed.notices[0] and listed.failure is None


def test_listed_paths_uris_and_types_are_those_pathlib_and_mimetypes_give(tmp_path):
    names = ["plain.md", "with space.md", "ünïcode ñ.txt", "hash#and%percent.html", "trailing.",
             "two.dots..md", "archive.tar.gz", "no-suffix"]
    (tmp_path / "sub dir").mkdir()
    for name in names:
        (tmp_path / "sub dir" / name).write_text("x")
    listed = list_source(SourceConfig(name="s", path=tmp_path, include=["**/*"]))
    rows = listed.listing().to_pylist()
    assert len(rows) == len(names)
    for row in rows:
        path = Path(row["path"])
        assert path.is_file() and row["uri"] == path.as_uri(), row
        assert row["mime"] == mimetypes.guess_type(f"x{path.suffix}")[0], row
    with pytest.raises(ValueError, match="relative path"):  # as Path.as_uri(): never a URI that is not one
        file_uri("sub dir/plain.md")


@pytest.mark.parametrize("pattern", ["../secret/**/*.md", "/etc/*", "docs/../../x.md"])
def test_patterns_that_leave_the_root_are_a_config_error(tmp_path, pattern):
    path = tmp_path / "inlet.yaml"
    path.write_text(f"sources:\n  - {{name: s, path: ., include: ['{pattern}']}}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"sources\.0\.include"):
        load_config(path)


def _listing(*doc_ids: str, size: int = 10) -> pa.Table:
    rows = [{"doc_id": d, "source": "s", "path": f"/x/{d}", "uri": f"file:///x/{d}", "size": size, "mtime_ns": 1,
             "access_level": "public", "extra": "{}", "meta_hash": "m"} for d in doc_ids]
    return pa.Table.from_pylist(rows, schema=LISTING_SCHEMA)


def test_oversized_files_are_not_even_hashed():
    def hasher(path: str) -> str:
        raise AssertionError(f"{path} was read")

    out = classify_documents(_listing("big", size=5_000), pa.Table.from_pylist([], schema=DOCUMENT_ROWS_SCHEMA), "fp",
                             hasher=hasher, sources={"s"}, max_bytes=1_000)
    assert out.to_pylist()[0]["change"] == "new" and out.to_pylist()[0]["content_hash"] == "unread:5000:1"


def test_guard_holds_failed_empty_and_shrunken_listings():
    known = _listing(*"abcdef")
    shares = {"s": 0.5}
    assert held_deletions(_listing(*"abcdef"), known, {}, shares) == {}
    assert held_deletions(_listing(*"abcd"), known, {}, shares) == {}, "2 of 6 is under half"
    assert "would delete 4 of its 6" in held_deletions(_listing(*"ab"), known, {}, shares)["s"]
    assert "came back empty" in held_deletions(_listing(), known, {}, shares)["s"]
    assert "listing failed" in held_deletions(_listing(), known, {"s": "folder gone"}, shares)["s"]
    assert held_deletions(_listing(), _listing(), {"s": "folder gone"}, shares) == {}, "nothing to lose"


@pytest.mark.slow
def test_a_document_past_the_time_limit_is_quarantined_and_the_run_goes_on(shared_corpora, tmp_path):
    book = shared_corpora / "text" / "unstructured" / "book-war-and-peace-1225p.txt"  # ~5 s to partition here
    small = tmp_path / "note.txt"
    small.write_text("The harbour master keeps the tide tables.\n")
    rows = [{"doc_id": p.name, "source": "s", "path": str(p), "uri": p.as_uri(), "size": 1, "mtime_ns": 1,
             "access_level": "public", "meta_hash": "m", "content_hash": "h", "change": "new"} for p in (book, small)]
    elements, extracted = extract_documents(pa.Table.from_pylist(rows, schema=DOCUMENTS_SCHEMA),
                                            ExtractionConfig(timeout_s=1, workers=1))
    verdicts = {r["doc_id"]: (r["status"], r["reason"]) for r in extracted.to_pylist()}
    assert verdicts == {book.name: ("quarantined", "timeout"), "note.txt": ("ok", None)}
    assert "1 s limit" in extracted.to_pylist()[0]["message"]
    assert set(elements["doc_id"].to_pylist()) == {"note.txt"}


@pytest.mark.usefixtures("prefect_harness")
def test_mass_deletion_guard_in_a_real_run(corpus, write_config, tmp_path):
    config = write_config(corpus)
    first = ingest(config_path=str(config))
    everything = _doc_ids(config)
    assert first["docs_new"] == len(everything) >= 4

    moved = tmp_path / "moved"
    shutil.move(corpus, moved)  # the folder is gone: an unmounted drive
    missing = ingest(config_path=str(config))
    assert missing["docs_deleted"] == 0 and _doc_ids(config) == everything
    assert any("listing failed" in n and "nothing deleted" in n for n in missing["notices"])

    corpus.mkdir()  # back, but empty
    emptied = ingest(config_path=str(config))
    assert emptied["docs_deleted"] == 0 and _doc_ids(config) == everything
    assert any("came back empty" in n for n in emptied["notices"])

    shutil.copy(moved / "harbour-faq.txt", corpus / "harbour-faq.txt")  # most of it gone
    shrunk = ingest(config_path=str(config))
    assert shrunk["docs_deleted"] == 0 and any("would delete" in n for n in shrunk["notices"])

    allowed = ingest(config_path=str(config), allow_deletions=True)
    assert allowed["docs_deleted"] == len(everything) - 1
    assert _doc_ids(config) == {"sample:harbour-faq.txt"}


def test_the_suffix_shortcut_matches_exactly_what_wcmatch_matches():
    # "**/*.md"-style includes are tested without wcmatch's matcher: hidden folders and files, case, odd names.
    from wcmatch import glob as wcglob

    from tasks.crawl import _GLOB_FLAGS, path_filter

    names = ["a.md", ".a.md", ".md", "a.MD", "a.mdx", "a.md.txt", "b..md", "-.md", "ü.md", "a b.md", "x.md~",
             "a.txt", "md", "a.", "[x].md", "*.md", "a.md "]
    folders = ["", "d/", ".d/", "d/.e/", "d/e/", "d.md/", "...", ".../", "d/..md/", " /", "ü/"]
    for include in (("**/*.md",), ("**/*.md", "**/*.txt"), ("**/*.MD",), ("**/*.md-x",)):
        shortcut, wcmatch = path_filter(include, ()), wcglob.compile(include, flags=_GLOB_FLAGS)
        for rel in (f + n for f in folders for n in names):
            assert bool(shortcut(rel)) == bool(wcmatch.match(rel)), (include, rel)
