"""Index variants share one crawl and one extraction; each then chunks, enriches, embeds and commits its own tables."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from prefect import task
from prefect.cache_policies import NO_CACHE

from runtime.artifacts import read_artifact, write_artifact
from schemas.arrow import DOCUMENTS_SCHEMA, ELEMENTS_SCHEMA, EXTRACTED_SCHEMA, WORK


def _needs_work(documents: pa.Table) -> pa.ChunkedArray:
    return pc.is_in(documents["change"], pa.array(WORK))


def extraction_todo(per_variant: list[pa.Table]) -> pa.Table:
    """One documents table to extract from: a document is extracted once if any variant needs it."""
    first = per_variant[0]
    needed: dict[str, dict] = {}
    for documents in per_variant:
        for row in documents.filter(_needs_work(documents)).to_pylist():
            needed.setdefault(row["doc_id"], row)
    rows = [needed.get(r["doc_id"], r) for r in first.to_pylist()]
    return pa.Table.from_pylist(rows, schema=DOCUMENTS_SCHEMA)


def for_variant(elements: pa.Table, extracted: pa.Table, documents: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Keep the extraction of the documents this variant reprocesses."""
    ids = pa.array(documents.filter(_needs_work(documents))["doc_id"].to_pylist(), pa.string())
    return (elements.filter(pc.is_in(elements["doc_id"], ids)),
            extracted.filter(pc.is_in(extracted["doc_id"], ids)))


@task(name="plan extraction", cache_policy=NO_CACHE)
def extraction_todo_stage(documents_paths: list[str], run_dir: str) -> str:
    """Write the documents artifact the shared extraction works from."""
    tables = [read_artifact(p, DOCUMENTS_SCHEMA) for p in documents_paths]
    return write_artifact(extraction_todo(tables), run_dir, "extraction_todo", DOCUMENTS_SCHEMA)


@task(name="select variant documents", cache_policy=NO_CACHE)
def for_variant_stage(elements_path: str, extracted_path: str, documents_path: str, run_dir: str) -> tuple[str, str]:
    """Write this variant's share of the shared extraction."""
    elements, extracted = for_variant(read_artifact(elements_path, ELEMENTS_SCHEMA),
                                      read_artifact(extracted_path, EXTRACTED_SCHEMA),
                                      read_artifact(documents_path, DOCUMENTS_SCHEMA))
    return (write_artifact(elements, run_dir, "elements", ELEMENTS_SCHEMA),
            write_artifact(extracted, run_dir, "extracted", EXTRACTED_SCHEMA))
