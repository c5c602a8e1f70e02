"""Benchmark: re-index the PDFs of ../shared/corpora/pdf after a change of chunking.max_tokens, timed as a user runs it.

    .venv/bin/python bench/rechunk.py --ref 27713a7                      # shipped config (e5)
    .venv/bin/python bench/rechunk.py --ref 27713a7 --embedder hashing   # the extraction's share alone

Each checkout (this one, then a worktree of --ref): a fresh copy of the PDFs and an empty store, its
configs/inlet.yaml with only the source, the store paths (and, with --embedder, the embedder) changed; one cold
`inlet ingest --json` (untimed), then chunking.max_tokens set from 200 to 300 and `inlet ingest --json` again:
that second command's wall time from the shell is the number. This checkout's store is then compared with a
cold index made with the new settings in a fresh store: its chunks (ids and texts) must be the same. Every
command runs in a new process against one Prefect server started once (as `make server` starts it). Writes
bench/results/rechunk.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CORPUS = ROOT.parent / "shared" / "corpora" / "pdf"
NEW_MAX_TOKENS = 300

from bench.cold import commit_of, prefect_server, timed_ingest, worktree  # noqa: E402


def write_config(checkout: Path, state: Path, embedder: str | None, max_tokens: int | None = None) -> Path:
    """The checkout's shipped config over the PDF copy in state, its store there; max_tokens if given."""
    import yaml

    data = yaml.safe_load((checkout / "configs" / "inlet.yaml").read_text(encoding="utf-8"))
    data["sources"] = [{"name": "pdfs", "path": str(state / "corpus"), "include": ["**/*.pdf"]}]
    data["store"].update(uri=str(state / "lancedb"), artifacts=str(state / "runs"))
    if embedder is not None:
        data["embedding"] = {"kind": embedder}
    if max_tokens is not None:
        data.setdefault("chunking", {})["max_tokens"] = max_tokens
    path = state / "inlet.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def fresh_state(work: Path, name: str) -> Path:
    """An empty state folder holding a fresh copy of the PDFs."""
    state = work / "state" / name
    shutil.rmtree(state, ignore_errors=True)
    shutil.copytree(CORPUS, state / "corpus")
    return state


def chunks(state: Path) -> list[tuple[str, str]]:
    """The store's chunk ids and texts, sorted."""
    import lancedb

    table = lancedb.connect(str(state / "lancedb")).open_table("chunks").to_arrow()
    return sorted(zip(table["chunk_id"].to_pylist(), table["text"].to_pylist()))


def reindex(checkout: Path, work: Path, env: dict[str, str], embedder: str | None) -> tuple[dict, Path]:
    """Cold index, then the timed re-index with the new chunk size; return its row and the state folder."""
    state = fresh_state(work, checkout.name)
    cold_wall, cold = timed_ingest(checkout, write_config(checkout, state, embedder), env)
    wall, summary = timed_ingest(checkout, write_config(checkout, state, embedder, NEW_MAX_TOKENS), env)
    stages = summary["stage_seconds"]
    row = {"checkout": str(checkout), "commit": commit_of(checkout), "cold_wall_s": round(cold_wall, 1),
           "wall_s": round(wall, 1), "pipeline_s": summary.get("pipeline_seconds"),
           "docs_changed": summary.get("docs_changed"), "docs_extracted": summary.get("docs_extracted"),
           "docs_from_kept": summary.get("docs_from_kept"), "extract_s": stages.get("extract"),
           "chunks_written": summary.get("chunks_written"), "texts_embedded": summary.get("texts_embedded"),
           "cold_chunks": cold.get("chunks_written"), "stage_seconds": stages}
    return row, state


def main() -> None:
    """Re-index here (and in a worktree of --ref); check this checkout's chunks against a cold run; print a table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", help="also a worktree of this commit, after this checkout")
    parser.add_argument("--embedder", choices=["hashing", "e5", "minilm"], default=None,
                        help="embedder kind instead of the shipped config's")
    parser.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    args = parser.parse_args()
    if not CORPUS.is_dir():
        sys.exit(f"needs {CORPUS} (the shared folder beside this checkout)")
    work = Path(args.work or tempfile.mkdtemp(prefix="inlet-rechunk-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    with worktree(args.ref, work) as tree, prefect_server(work) as env:
        mine, state = reindex(ROOT, work, env, args.embedder)
        cold_state = fresh_state(work, "cold-new-settings")
        timed_ingest(ROOT, write_config(ROOT, cold_state, args.embedder, NEW_MAX_TOKENS), env)
        mine["chunks_identical_to_cold"] = chunks(state) == chunks(cold_state)
        rows.append(mine)
        print(json.dumps({k: v for k, v in mine.items() if k != "stage_seconds"}), flush=True)
        if tree is not None:
            rows.append(reindex(tree, work, env, args.embedder)[0])
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "stage_seconds"}), flush=True)
    out = ROOT / "bench" / "results" / f"rechunk-{args.embedder or 'shipped'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print("| commit | re-index wall s | files parsed | from kept | extract s | chunks | cold index wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['commit']} | {r['wall_s']} | {r['docs_extracted'] if r['docs_extracted'] is not None else 'all'} "
              f"| {r['docs_from_kept'] or 0} | {r['extract_s']} | {r['chunks_written']} | {r['cold_wall_s']} |")
    if len(rows) == 2:
        print(f"\nthis checkout vs {args.ref}: re-index {rows[1]['wall_s'] / rows[0]['wall_s']:.2f}x faster (wall); "
              f"chunks identical to a cold run: {rows[0]['chunks_identical_to_cold']}")


if __name__ == "__main__":
    main()
