"""A folder on object storage: an S3-compatible server (moto) started by the test, read through fsspec."""

from __future__ import annotations

import lancedb
import pytest
import yaml

from flows.ingest import ingest
from query import search
from schemas.config import load_config
from tests.conftest import SAMPLE, bucket_store

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _upload(client, tmp_path) -> list[str]:
    keys = []
    for rel in ("guides/boat-maintenance.md", "reports/regatta-report-2025.pdf", "policies/safety-policy.html",
                "harbour-faq.txt"):
        client.put_object(Bucket="docs", Key=f"club/{rel}", Body=(SAMPLE / rel).read_bytes())
        keys.append(f"club/{rel}")
    client.put_object(Bucket="docs", Key="other/not-this.md", Body=b"# Outside the prefix\n")
    return keys


def test_a_bucket_prefix_is_a_source_with_etag_change_detection(s3, write_config, tmp_path):
    endpoint, client, log = s3
    _upload(client, tmp_path)
    options = {"endpoint_url": endpoint, "key": "test", "secret": "test", "client_kwargs": {"region_name": "us-east-1"}}
    config = write_config(tmp_path, sources=[{"name": "s3", "uri": "s3://docs/club", "storage_options": options}])
    first = ingest(config_path=str(config))
    assert first["docs_new"] == 4 and first["docs_quarantined"] == 0
    db = lancedb.connect(str(load_config(config).store.uri))
    docs = {d["doc_id"]: d for d in db.open_table("documents").to_arrow().to_pylist()}
    report = docs["s3:reports/regatta-report-2025.pdf"]
    assert report["uri"] == "s3://docs/club/reports/regatta-report-2025.pdf" and report["validator"].startswith('"')
    hit = search("surplus of 1,530 euros", k=1, config=config)[0]
    assert hit.doc_id == report["doc_id"] and hit.citation.pages[1] == 2, "page citations survive object storage"

    log.lines.clear()
    second = ingest(config_path=str(config))
    assert (second["docs_unchanged"], second["docs_new"], second["docs_changed"]) == (4, 0, 0)
    assert not [line for line in log.lines if '"GET /docs/club/' in line], "unchanged objects are not downloaded"

    client.put_object(Bucket="docs", Key="club/harbour-faq.txt",
                      Body=b"The harbour office opens at seven and closes at nine in summer.\n")
    client.delete_object(Bucket="docs", Key="club/policies/safety-policy.html")
    third = ingest(config_path=str(config))
    assert (third["docs_changed"], third["docs_deleted"], third["docs_unchanged"]) == (1, 1, 2)
    assert search("when does the harbour office open", k=1, config=config)[0].doc_id == "s3:harbour-faq.txt"


def test_an_unreachable_bucket_deletes_nothing(s3, write_config, tmp_path):
    endpoint, client, _ = s3
    _upload(client, tmp_path)
    options = {"endpoint_url": endpoint, "key": "test", "secret": "test", "client_kwargs": {"region_name": "us-east-1"}}
    config = write_config(tmp_path, sources=[{"name": "s3", "uri": "s3://docs/club", "storage_options": options}])
    assert ingest(config_path=str(config))["docs_new"] == 4
    broken = write_config(tmp_path, name="broken.yaml", sources=[{
        "name": "s3", "uri": "s3://no-such-bucket/club", "storage_options": options}])
    summary = ingest(config_path=str(broken))
    assert summary["docs_deleted"] == 0
    assert any("could not be listed" in n and "nothing deleted" in n for n in summary["notices"])


def test_run_artifacts_can_live_in_a_bucket(s3, write_config, tmp_path, corpus):
    endpoint, client, _ = s3
    client.create_bucket(Bucket="runs")
    options = {"endpoint_url": endpoint, "key": "test", "secret": "test", "client_kwargs": {"region_name": "us-east-1"}}
    config = write_config(corpus)
    data = yaml.safe_load(config.read_text())
    data["store"] = {"uri": str(tmp_path / "lancedb"), "artifacts": "s3://runs/inlet", "artifacts_options": options}
    config.write_text(yaml.safe_dump(data))
    first = ingest(config_path=str(config))
    assert first["docs_new"] == 5 and first["docs_quarantined"] == 0
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="runs", Prefix=f"inlet/{first['run_id']}/")["Contents"]]
    names = {k.rsplit("/", 1)[1] for k in keys}
    assert {"listing.parquet", "documents.parquet", "elements.parquet", "chunks.parquet", "run.parquet"} <= names
    assert not (tmp_path / "runs").exists(), "nothing written to a local artifact folder"
    marks = client.list_objects_v2(Bucket="runs", Prefix="inlet/inflight/").get("Contents", [])
    assert marks == [], "each commit group removed its in-flight marker from the bucket"
    assert search("wind limits for lasers", k=1, config=config)[0].doc_id == "sample:policies/safety-policy.html"
    assert ingest(config_path=str(config))["docs_unchanged"] == 5


def test_a_file_uri_folder_is_read_through_fsspec(write_config, tmp_path, corpus):
    config = write_config(corpus, sources=[{"name": "local", "uri": corpus.as_uri()}])
    first = ingest(config_path=str(config))
    assert first["docs_new"] == 5 and first["docs_quarantined"] == 0
    hit = search("surplus of 1,530 euros", k=1, config=config)[0]
    assert hit.doc_id == "local:reports/regatta-report-2025.pdf" and hit.citation.uri.startswith("file://")
    assert ingest(config_path=str(config))["docs_unchanged"] == 5


def test_the_store_and_artifacts_can_both_live_in_a_bucket(s3, write_config, tmp_path, corpus, monkeypatch):
    endpoint, client, _ = s3
    client.create_bucket(Bucket="knowledge")
    config = write_config(corpus, execution={"batch_docs": 2})
    data = yaml.safe_load(config.read_text())
    data["store"] = bucket_store(endpoint, "knowledge")
    config.write_text(yaml.safe_dump(data))
    first = ingest(config_path=str(config))
    assert first["docs_new"] == 5 and first["docs_quarantined"] == 0
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="knowledge", Prefix="lancedb/")["Contents"]]
    assert any(k.startswith("lancedb/chunks.lance/") for k in keys), "the tables are in the bucket"
    assert not (tmp_path / "store").exists(), "nothing written locally"
    assert search("wind limits for lasers", k=1, config=config)[0].doc_id == "sample:policies/safety-policy.html"
    guide = corpus / "guides" / "boat-maintenance.md"
    guide.write_text(guide.read_text().replace("2% hardener", "3% hardener"))
    monkeypatch.setattr("store.commit.MAX_UNINDEXED", 0)  # the new rows are folded into the indexes in the bucket
    second = ingest(config_path=str(config))
    assert (second["docs_changed"], second["docs_unchanged"]) == (1, 4)
    assert second["indexes"]["fulltext"]["unindexed"] == 0
    assert "3% hardener" in search("gelcoat hardener", k=1, mode="fulltext", config=config)[0].text

    # One writer per store on object storage too: a Prefect concurrency limit named after it.
    from schemas.errors import StoreBusyError
    from store.tables import writer_lock

    with writer_lock("s3://knowledge/lancedb", "run-holding"), pytest.raises(StoreBusyError, match="being written by"):
        ingest(config_path=str(config))


def test_in_flight_markers_are_written_read_and_removed_in_a_bucket(s3, monkeypatch):
    import fsspec.config

    from store import inflight

    endpoint, client, _ = s3
    client.create_bucket(Bucket="marks")
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint, "key": "test", "secret": "test",
                                                   "client_kwargs": {"region_name": "us-east-1"}})
    where = inflight.folder("s3://marks/inlet", "s3://marks/lancedb", "chunks")
    path = inflight.mark(where, "run-1", ["b", "a"])
    assert inflight.left(where) == {path: ["a", "b"]}
    inflight.settle(inflight.left(where), {"a"})
    assert inflight.left(where) == {path: ["a", "b"]}, "kept: b was not done again"
    inflight.settle(inflight.left(where), {"a", "b", "c"})
    assert inflight.left(where) == {}
