"""bench/serving.py --load: its check that an answer came whole from the version it names."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import lancedb
import pyarrow as pa

from bench import serving  # bench/ is a folder of scripts on the project root, importable as a namespace package


def _store(tmp_path: Path) -> tuple[Path, int, int]:
    """A chunks table at two versions: a document of three chunks, then its second chunk's text changed."""
    rows = [{"chunk_id": f"d-{i}", "doc_id": "d", "chunk_index": i, "text": f"chunk {i}"} for i in range(3)]
    table = lancedb.connect(str(tmp_path / "lancedb")).create_table("chunks", pa.Table.from_pylist(rows))
    first = table.version
    table.update(where="chunk_id = 'd-1'", values={"text": "chunk 1, edited"})
    config = tmp_path / "inlet.yaml"
    config.write_text(f"sources: [{{name: s, path: '{tmp_path}'}}]\nembedding: {{kind: hashing, dim: 8}}\n"
                      f"store: {{uri: '{tmp_path / 'lancedb'}', artifacts: '{tmp_path / 'runs'}'}}\n", encoding="utf-8")
    return config, first, table.version


def _search(version: int, *texts: tuple[str, str], levels: tuple[str, ...] = ("public",),
            clearance: str = "public") -> object:
    return serving.Call("inlet api", "search", 0.0, 0.01, "ok", version=version,
                        rows=[(c, serving._sha(t), None) for c, t in texts], clearance=clearance, levels=list(levels))


def test_an_answer_whole_from_its_version_passes_and_any_mixed_one_is_named(tmp_path):
    config, first, second = _store(tmp_path)
    whole = [_search(first, ("d-0", "chunk 0"), ("d-1", "chunk 1")), _search(second, ("d-1", "chunk 1, edited")),
             serving.Call("inlet mcp --http", "context", 0.0, 0.01, "ok", version=second, rows=[
                 ("d-0", serving._sha("chunk 0"), 0), ("d-1", serving._sha("chunk 1, edited"), 1)])]
    assert serving.torn(whole, config) == ([], 0)
    mixed = _search(second, ("d-0", "chunk 0"), ("d-1", "chunk 1"))  # the old text, named as the new version
    missing = _search(first, ("d-9", "chunk 9"))
    shuffled = serving.Call("inlet api", "context", 0.0, 0.01, "ok", version=first, rows=[
        ("d-2", serving._sha("chunk 2"), 2), ("d-0", serving._sha("chunk 0"), 0)])
    above = _search(first, ("d-0", "chunk 0"), levels=("internal",))
    unnamed = _search(None, ("d-0", "chunk 0"))  # type: ignore[arg-type] - an answer that names no version
    problems, pruned = serving.torn([*whole, mixed, missing, shuffled, above, unnamed, _search(999, ('d-0', 'x'))],
                                     config)
    assert pruned == 1, "an answer from a version pruned since is counted apart, not as torn"
    assert len(problems) == 5, problems
    assert sum("not in it as served" in p for p in problems) == 2
    assert any("neighbours not in order" in p for p in problems)
    assert any("above clearance public" in p for p in problems)
    assert any("no version named" in p for p in problems)


def test_the_summary_counts_outcomes_and_percentiles_of_answered_calls_only():
    calls = [serving.Call("inlet api", "search", 0.0, s, "ok", version=1) for s in (0.01, 0.02, 0.03)]
    calls += [serving.Call("inlet api", "context", 1.0, 0.5, "gone", version=1),
              serving.Call("inlet api", "search", 2.0, 9.0, "error", "503: no answer")]
    row = serving.summary(calls, 10.0, [(0.0, 100.0), (40.0, 110.0), (60.0, 130.0)], (3, 7), [])
    assert row["outcomes"] == {"ok": 3, "gone": 1, "refused": 0, "error": 1}
    assert row["requests"] == 5 and row["requests_per_s"] == 0.5
    assert row["per_op"]["search"]["p50_ms"] == 20.0, "the failed call's 9 s is not a latency"
    assert row["rss_mb"]["growth"] == 20.0 and row["published_moved"] == 4
    assert row["first_problems"] == ["503: no answer"]


def test_cpu_seconds_counts_a_process_with_its_children_or_alone():
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.7\n"
                              "while time.process_time() < end: pass\ntime.sleep(30)"])
    try:
        deadline = time.monotonic() + 30
        # 0.6 of its 0.7 s: "tree" and "alone" are read one after the other, and this process's own CPU grows between.
        while serving.cpu_seconds({"child": [child.pid]})["child"] < 0.6 and time.monotonic() < deadline:
            time.sleep(0.1)
        both = serving.cpu_seconds({"tree": [os.getpid()], "alone": [-os.getpid()]})
        assert both["tree"] - both["alone"] >= 0.5, "the busy child's half second is in the tree, not alone"
    finally:
        child.kill()
        child.wait()
