"""Imports that Inlet never uses are deferred: a process does not pay for them, and they load if anything uses them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from providers.deferred import hidden

ROOT = Path(__file__).resolve().parent.parent


def test_lancedb_works_without_the_namespace_rest_client_which_still_loads_when_used(tmp_path):
    # In a fresh interpreter: the test session has imported everything already.
    probe = textwrap.dedent("""
        import sys
        import pyarrow as pa
        import tasks.store
        import lancedb

        print("api" if "lance_namespace_urllib3_client.api.table_api" in sys.modules else "no api")
        db = lancedb.connect(sys.argv[1])
        db.create_table("t", pa.table({"a": [1, 2, 3]}))
        print(db.open_table("t").search().where("a > 1").to_arrow().num_rows)
        import lance_namespace_urllib3_client as client

        print(client.ApiClient.__name__, client.models.JsonArrowSchema.__name__, type(client).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "db")], cwd=ROOT, capture_output=True,
                         text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:3] == ["no api", "2", "ApiClient JsonArrowSchema Deferred"]


def test_a_hidden_package_is_missing_to_this_thread_inside_the_block_only(tmp_path, monkeypatch):
    (tmp_path / "inlet_hidden_probe").mkdir()
    (tmp_path / "inlet_hidden_probe" / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "inlet_hidden_probe" / "part.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "inlet_hidden_probe", raising=False)
    monkeypatch.delitem(sys.modules, "inlet_hidden_probe.part", raising=False)
    seen_by_other_thread = []
    with hidden("inlet_hidden_probe", "json"):
        with pytest.raises(ModuleNotFoundError, match="inlet_hidden_probe"):
            import inlet_hidden_probe
        with pytest.raises(ModuleNotFoundError, match="inlet_hidden_probe"):  # its package first
            import inlet_hidden_probe.part
        import json.tool  # already imported before the block: not hidden, submodules included

        other = threading.Thread(target=lambda: seen_by_other_thread.append(
            __import__("inlet_hidden_probe.part", fromlist=["VALUE"]).VALUE))
        other.start()
        other.join()
    assert json.tool.__name__ == "json.tool"
    assert seen_by_other_thread == [2]
    import inlet_hidden_probe

    assert inlet_hidden_probe.VALUE == 1


def test_the_ingest_flow_imports_without_the_model_libraries_a_run_may_not_use():
    # ~0.4 s (google-genai) and ~0.1 s (yake, networkx) of every run's start-up; they load when a run uses them.
    probe = textwrap.dedent("""
        import sys
        import flows.ingest
        print("google.genai" in sys.modules, "yake" in sys.modules)
        from providers.enrichers import KeywordEnricher
        from providers.gemini import GeminiEmbedder
        print("google.genai" in sys.modules, GeminiEmbedder.__name__, KeywordEnricher().enrich([]) == [])
        print("yake" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:3] == ["False False", "True GeminiEmbedder True", "True"]
