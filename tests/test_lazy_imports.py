"""Inlet imports a model library only where a run uses it (its own imports inside functions, nothing else)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
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


@pytest.mark.slow
def test_preparing_a_run_loads_what_its_first_steps_use_and_no_more():
    # While a temporary Prefect server boots, inlet ingest loads the keyword enricher and Prefect's flow-call imports;
    # a config without enrichment leaves yake out, and neither loads a model client or great-expectations.
    probe = textwrap.dedent("""
        import sys
        from flows.ingest import prepare_process
        from schemas.config import load_config
        cfg = load_config("configs/inlet.yaml")
        off = cfg.model_copy(update={"enrichment": cfg.enrichment.model_copy(update={"enabled": False})})
        prepare_process(off)
        print(sorted(n for n in ("yake", "fastapi.encoders", "prefect.flow_engine") if n in sys.modules))
        prepare_process(cfg)
        print(cfg.enrichment.provider, "yake" in sys.modules)
        print("google.genai" in sys.modules, "great_expectations" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:3] == ["['fastapi.encoders', 'prefect.flow_engine']", "local True", "False False"]
