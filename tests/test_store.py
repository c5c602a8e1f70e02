"""The chunks table: cache lookups (one row per key), chunk commits and index folds."""

from __future__ import annotations

import lancedb
import pyarrow as pa
import pytest

import store.tables
from store.tables import select_one_per_key

SCHEMA = pa.schema([pa.field("chunk_id", pa.string()), pa.field("embed_key", pa.string()),
                    pa.field("vector", pa.list_(pa.float32(), 2))])


@pytest.fixture
def table(tmp_path) -> lancedb.table.Table:
    """Chunks in two fragments where key k0 is stored three times (three documents share its text)."""
    db = lancedb.connect(str(tmp_path / "db"))
    rows = lambda ids, keys: pa.table({"chunk_id": ids, "embed_key": keys,
                                       "vector": [[float(k[-1]), 1.0] for k in keys]}, schema=SCHEMA)
    table = db.create_table("chunks", rows(["a", "b", "c"], ["k0", "k1", "k0"]))
    table.add(rows(["d", "e"], ["k0", "k2"]))
    return table


def test_a_key_stored_by_many_chunks_comes_back_once_with_its_columns(table):
    got = select_one_per_key(table, "embed_key", ["k0", "k2", "k2", "missing"], ["embed_key", "vector"], SCHEMA)
    assert got.schema.names == ["embed_key", "vector"]
    assert sorted(got.to_pylist(), key=lambda r: r["embed_key"]) == [
        {"embed_key": "k0", "vector": [0.0, 1.0]}, {"embed_key": "k2", "vector": [2.0, 1.0]}]


def test_keys_split_over_several_filters_still_come_back_once(table, monkeypatch):
    monkeypatch.setattr(store.tables, "IN_BATCH", 1)
    got = select_one_per_key(table, "embed_key", ["k0", "k1", "k2"], ["embed_key"], SCHEMA)
    assert sorted(got["embed_key"].to_pylist()) == ["k0", "k1", "k2"]


def test_the_row_taken_for_a_key_is_its_lowest_row_id_as_a_group_by_would_pick():
    import random

    from store.tables import _lowest_row_per_key

    rng = random.Random(7)
    ids = rng.sample(range(10_000), 500)
    rows = pa.table({"embed_key": [f"k{rng.randrange(60)}" for _ in ids], "_rowid": pa.array(ids, pa.uint64())})
    expected = rows.group_by("embed_key").aggregate([("_rowid", "min")])
    got = _lowest_row_per_key(rows, "embed_key").to_pylist()
    assert sorted(got) == sorted(expected["_rowid_min"].to_pylist())
    assert len(got) == len(set(rows["embed_key"].to_pylist()))


def test_no_table_or_no_match_gives_an_empty_table_of_the_columns(table):
    for source, keys in ((None, ["k0"]), (table, ["nope"]), (table, [])):
        got = select_one_per_key(source, "embed_key", keys, ["embed_key", "vector"], SCHEMA)
        assert got.num_rows == 0 and got.schema.names == ["embed_key", "vector"]


def _indexed_table(tmp_path, fragments: int) -> lancedb.table.Table:
    """A small table written in several commits (several small fragments) with a full-text index."""
    from store.commit import create_fulltext_index

    db = lancedb.connect(str(tmp_path / "idx"))
    rows = [pa.table({"id": [f"{n}-{i}" for i in range(20)], "text": [f"row {i} of commit {n}" for i in range(20)]})
            for n in range(fragments)]
    table = db.create_table("t", rows[0])
    for more in rows[1:]:
        table.add(more)
    create_fulltext_index(table)
    return table


def _segments(table: lancedb.table.Table) -> int:
    return len(table.to_lance().describe_indices()[0].segments)


def test_folding_new_rows_into_the_indexes_adds_a_delta_and_rewrites_no_data_file(tmp_path, monkeypatch):
    # LanceDB's optimize() compacts first: every small fragment rewritten, so a fold cost the whole table.
    from store.commit import refresh_indexes

    table = _indexed_table(tmp_path, 3)
    table.add(pa.table({"id": ["new"], "text": ["the zanzibar tide gauge"]}))
    fragments = table.stats()["fragment_stats"]["num_fragments"]
    assert refresh_indexes(table, fulltext=True, ann_min_rows=10**9)["fulltext"]["unindexed"] == 1, "below the bar"
    monkeypatch.setattr("store.commit.MAX_UNINDEXED", 0)
    assert refresh_indexes(table, fulltext=True, ann_min_rows=10**9)["fulltext"] == {"indexed": 61, "unindexed": 0}
    assert table.stats()["fragment_stats"]["num_fragments"] == fragments, "no data file rewritten"
    assert _segments(table) == 2, "the new row went into a delta segment beside the base"
    assert table.search("zanzibar", query_type="fts").limit(1).to_arrow()["id"].to_pylist() == ["new"]


def test_the_full_text_index_is_brought_up_to_date_sooner_than_the_others(tmp_path, monkeypatch):
    # Every full-text query tokenizes the rows the index lacks: a few hundred cost it more than a fold costs a run.
    from store.commit import MAX_UNINDEXED, MAX_UNINDEXED_FULLTEXT, refresh_indexes

    assert MAX_UNINDEXED_FULLTEXT < MAX_UNINDEXED
    table = _indexed_table(tmp_path, 3)
    table.add(pa.table({"id": [f"n{i}" for i in range(4)], "text": [f"new row {i}" for i in range(4)]}))
    monkeypatch.setattr("store.commit.MAX_UNINDEXED_FULLTEXT", 4)
    assert refresh_indexes(table, fulltext=True, ann_min_rows=10**9)["fulltext"]["unindexed"] == 4, "at the bar"
    monkeypatch.setattr("store.commit.MAX_UNINDEXED_FULLTEXT", 3)
    assert refresh_indexes(table, fulltext=True, ann_min_rows=10**9)["fulltext"]["unindexed"] == 0, "past it"


def test_a_fold_merges_the_newest_deltas_up_to_a_few_times_its_size():
    from store.commit import deltas_to_merge

    assert deltas_to_merge([], 10) == 0
    assert deltas_to_merge([10, 10, 10], 10, ratio=4) == 3, "small deltas all go into the new one"
    assert deltas_to_merge([10, 1_000, 10], 10, ratio=4) == 1, "a large delta stops the merge, older ones wait"
    assert deltas_to_merge([100], 10, ratio=4) == 0, "a delta far larger than the fold is not rewritten"
    assert deltas_to_merge([30, 100], 10, ratio=4) == 2, "what merged counts toward the next"


def test_folds_keep_few_deltas_and_maintenance_merges_them_all(tmp_path, monkeypatch):
    from store.commit import refresh_indexes

    table = _indexed_table(tmp_path, 1)
    monkeypatch.setattr("store.commit.MAX_UNINDEXED", 0)
    for n in range(12):
        table.add(pa.table({"id": [f"more-{n}"], "text": [f"later row {n}"]}))
        refresh_indexes(table, fulltext=True, ann_min_rows=10**9)
        # Folds of one row each: the deltas are merged as they come, so the base and a delta or two remain.
        assert _segments(table) <= 3, f"fold {n}: the deltas were not merged"
    assert _segments(table) > 1, "the base segment is not rewritten by a fold"
    coverage = refresh_indexes(table, fulltext=True, ann_min_rows=10**9, merge=True)
    assert coverage["fulltext"] == {"indexed": 32, "unindexed": 0} and _segments(table) == 1
    assert table.search("later", query_type="fts").limit(100).to_arrow().num_rows == 12


def _chunk_rows(ids: list[tuple[str, str]], run_id: str) -> pa.Table:
    """Chunk rows of the chunks table's schema (2-dim vectors) for (doc_id, chunk_id) pairs, written by run_id."""
    from schemas.arrow import chunk_rows_schema

    schema = chunk_rows_schema(2)
    fill = {pa.types.is_string: "x", pa.types.is_large_string: "x", pa.types.is_integer: 0,
            pa.types.is_boolean: False, pa.types.is_fixed_size_list: [0.5, 0.5]}
    rows = []
    for doc_id, chunk_id in ids:
        row = {f.name: next((v for test, v in fill.items() if test(f.type)), None) if not f.nullable else None
               for f in schema}
        rows.append({**row, "doc_id": doc_id, "chunk_id": chunk_id, "text": chunk_id, "run_id": run_id})
    return pa.Table.from_pylist(rows, schema=schema)


def test_a_chunk_commit_replaces_the_documents_chunks_and_clears_what_a_killed_run_left_beside_them(tmp_path):
    # A run killed between its chunk append and its delete leaves its rows beside the older ones (one chunk
    # id twice); the next run's commit of that document must leave each chunk id once. A merge on chunk_id
    # updated both copies and kept the duplicate.
    from store.commit import LoadResult, commit_chunks

    db = lancedb.connect(str(tmp_path / "db"))
    db.create_table("chunks", _chunk_rows([("d1", "a"), ("d1", "b"), ("d2", "c")], "run-1"))
    db.open_table("chunks").add(_chunk_rows([("d1", "a"), ("d1", "z")], "run-2"))  # run-2 killed before its delete
    result = LoadResult()
    commit_chunks(db, "chunks", _chunk_rows([("d1", "a"), ("d1", "n")], "run-3"), ["d1"], 2, result, run_id="run-3")
    rows = db.open_table("chunks").to_arrow()
    assert sorted(zip(rows["doc_id"].to_pylist(), rows["chunk_id"].to_pylist(), rows["run_id"].to_pylist())) == [
        ("d1", "a", "run-3"), ("d1", "n", "run-3"), ("d2", "c", "run-1")]
    assert (result.chunks_added, result.chunks_reused, result.chunks_written) == (1, 1, 2)
    assert result.chunks_removed == 2, "b and z lost; a kept (its older copies replaced)"


def _with(rows: pa.Table, chunk_id: str, **values: object) -> pa.Table:
    """rows with the named columns of one chunk's row set to values."""
    out = [r | values if r["chunk_id"] == chunk_id else r for r in rows.to_pylist()]
    return pa.Table.from_pylist(out, schema=rows.schema)


def test_an_edit_writes_only_the_chunk_rows_it_changed_and_the_others_keep_the_run_that_wrote_them(tmp_path):
    """Regression: a commit rewrote every chunk of an edited document, so the bench's 1% run (a paragraph appended to
    14 files) wrote 114 rows for 40 changed ones, and each such run had to fold them into the indexes (~0.13 s)."""
    from store.commit import LoadResult, commit_chunks

    db = lancedb.connect(str(tmp_path / "db"))
    db.create_table("chunks", _chunk_rows([("d1", "a"), ("d1", "b"), ("d1", "c"), ("d2", "x")], "run-1"))
    before = db.open_table("chunks").version
    # d1 edited: a as it was, b now links to a new last chunk n, c gone.
    edited = _with(_chunk_rows([("d1", "a"), ("d1", "b"), ("d1", "n")], "run-2"), "b", next_chunk_id="n")
    result = LoadResult()
    commit_chunks(db, "chunks", edited, ["d1"], 2, result, run_id="run-2")
    rows = db.open_table("chunks").to_arrow()
    got = sorted(zip(rows["chunk_id"].to_pylist(), rows["run_id"].to_pylist(), rows["next_chunk_id"].to_pylist()))
    assert got == [("a", "run-1", None), ("b", "run-2", "n"), ("n", "run-2", None), ("x", "run-1", None)]
    assert (result.chunks_added, result.chunks_reused, result.chunks_written, result.chunks_removed) == (1, 2, 2, 1)
    assert db.open_table("chunks").version == before + 2, "one append and one delete"

    again = LoadResult()
    commit_chunks(db, "chunks", _with(edited, "a", run_id="run-3"), ["d1"], 2, again, run_id="run-3")
    assert (again.chunks_written, again.chunks_removed) == (0, 0)
    assert db.open_table("chunks").version == before + 2, "nothing differs: no version"


def test_a_commit_keeping_most_chunks_deletes_the_others_by_id_with_every_copy_a_killed_run_left(tmp_path):
    from store.commit import LoadResult, commit_chunks

    db = lancedb.connect(str(tmp_path / "db"))
    db.create_table("chunks", _chunk_rows([("d1", "a"), ("d1", "b"), ("d1", "c"), ("d1", "d")], "run-1"))
    db.open_table("chunks").add(_chunk_rows([("d1", "d")], "run-2"))  # run-2 killed before its delete
    result = LoadResult()
    commit_chunks(db, "chunks", _chunk_rows([("d1", "a"), ("d1", "b"), ("d1", "c"), ("d1", "e")], "run-3"), ["d1"], 2,
                  result, run_id="run-3")
    rows = db.open_table("chunks").to_arrow()
    assert sorted(zip(rows["chunk_id"].to_pylist(), rows["run_id"].to_pylist())) == [
        ("a", "run-1"), ("b", "run-1"), ("c", "run-1"), ("e", "run-3")]
    assert (result.chunks_written, result.chunks_removed) == (1, 2)


def test_a_row_differing_in_any_column_but_the_run_id_is_not_identical():
    from schemas.arrow import chunk_rows_schema
    from store.commit import identical_rows

    old = _with(_chunk_rows([("d1", "a"), ("d1", "b"), ("d1", "c"), ("d1", "d")], "run-1"), "d",
                heading_path=["Intro", "Setup"])
    new = _with(_with(_with(old, "b", vector=[0.5, 0.25]), "c", heading_path=["Intro"]), "d", run_id="run-2")
    new = pa.concat_tables([new, _chunk_rows([("d1", "z")], "run-2")])
    columns = [n for n in chunk_rows_schema(2).names if n != "run_id"]
    assert identical_rows(new.select(columns), old.select(columns)).to_pylist() == ["a", "d"], \
        "a vector or a list that differs makes a row new; a null equals a null; an id not stored is not identical"


def test_a_keyed_upsert_deletes_only_ids_the_table_holds_and_commits_nothing_for_none(tmp_path):
    from store.commit import upsert_keyed
    from store.tables import connect, open_table

    schema = pa.schema([pa.field("doc_id", pa.string()), pa.field("reason", pa.string())])
    db = connect(tmp_path / "db")
    assert open_table(db, "quarantine") is None, "no such table: None, not an error"
    rows = pa.table({"doc_id": ["a", "b"], "reason": ["x", "y"]}, schema=schema)
    first = upsert_keyed(db, "quarantine", "doc_id", rows, schema, [])
    # None of them held: counted, not selected, and no commit (the version stays).
    assert upsert_keyed(db, "quarantine", "doc_id", schema.empty_table(), schema, ["c", "d"]) == first
    # "a" is held and goes; "c" is not; "b" is upserted again, so it stays whatever the list says.
    version = upsert_keyed(db, "quarantine", "doc_id", rows.slice(1), schema, ["a", "b", "c"])
    assert version > first
    assert open_table(db, "quarantine").to_arrow().to_pylist() == [{"doc_id": "b", "reason": "y"}]
    # held: the caller vouches for the ids; they are deleted without a look-up.
    upsert_keyed(db, "quarantine", "doc_id", schema.empty_table(), schema, ["b"], held=True)
    assert open_table(db, "quarantine").count_rows() == 0


def test_a_kept_connection_opens_what_another_connection_committed_since(tmp_path):
    import store.tables as store

    uri = str(tmp_path / "kept")
    db = store.connect(uri)
    assert store.connect(uri) is db  # kept for the process
    db.create_table("t", pa.table({"a": [1]}))
    other = lancedb.connect(uri)  # another writer, as another process would be
    other.open_table("t").add(pa.table({"a": [2]}))
    assert sorted(store.connect(uri).open_table("t").to_arrow()["a"].to_pylist()) == [1, 2]


def test_the_columns_reads_look_rows_up_by_are_indexed_once_the_table_is_past_the_bar(tmp_path, monkeypatch):
    # A context looks its chunk up by chunk_id and its neighbours by doc_id; every search prefilters on clearance.
    from store.commit import refresh_indexes

    monkeypatch.setattr("store.commit.SCALAR_MIN_ROWS", 4)
    rows = lambda n: pa.table({"chunk_id": [f"c{i}" for i in range(n)], "doc_id": [f"d{i // 2}" for i in range(n)],
                               "access_level": ["public"] * n, "text": [f"row {i}" for i in range(n)],
                               "expires_at": pa.nulls(n, pa.timestamp("us", tz="UTC"))})
    table = lancedb.connect(str(tmp_path / "db")).create_table("chunks", rows(3))
    refresh_indexes(table, fulltext=False, ann_min_rows=10**9)
    assert table.list_indices() == [], "below the bar: scans are quick"
    table.add(rows(4).slice(3))
    refresh_indexes(table, fulltext=False, ann_min_rows=10**9)
    assert sorted(c for i in table.list_indices() for c in i.columns) == [
        "access_level", "chunk_id", "doc_id", "expires_at"]
    assert table.search().where("chunk_id = 'c3'").select(["doc_id"]).to_arrow()["doc_id"].to_pylist() == ["d1"]
    assert sorted(table.search().where("doc_id = 'd1'").select(["chunk_id"]).to_arrow()["chunk_id"].to_pylist()) == [
        "c2", "c3"]


def test_tags_are_listed_whole_while_maintenance_moves_the_published_tag(tmp_path):
    # Lance lists the tag files, then reads each: a tag deleted in between failed the listing (a 500 from
    # `inlet api` /sources under load, while live maintenance moved the published tag to a compacted version).
    import threading
    import time

    from store.tables import tag_versions

    table = lancedb.connect(tmp_path).create_table("t", pa.table({"a": [0]}))
    for i in range(3):
        table.add(pa.table({"a": [i]}))
        table.tags.create(f"run-{i}", table.version)
    table.tags.create("published", 1)
    stop = time.monotonic() + 60
    done = threading.Event()

    def move() -> None:
        while not done.is_set() and time.monotonic() < stop:
            table.tags.delete("published")
            table.tags.create("published", 2)

    mover = threading.Thread(target=move)
    mover.start()
    reader = lancedb.connect(tmp_path).open_table("t")
    try:
        listings = [tag_versions(reader) for _ in range(300)]
    finally:
        done.set()
        mover.join()
    assert all({f"run-{i}" for i in range(3)} <= set(tags) for tags in listings)
