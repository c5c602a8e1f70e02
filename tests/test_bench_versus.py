"""bench/versus.py: the ratios against the peers and the verdict on each target."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("versus", Path(__file__).resolve().parent.parent / "bench" / "versus.py")
versus = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(versus)


def _inlet(**pipeline_s: float) -> dict:
    return {"summary": [{"scenario": s, "pipeline_s": t, "texts_embedded": 18} for s, t in pipeline_s.items()]}


def _peers(**wall_s: dict[str, float]) -> dict:
    return {"scenarios": {peer: {s: {"median": {"wall_s": t, "texts_embedded": 121}} for s, t in by.items()}
                          for peer, by in wall_s.items()}}


def test_each_inlet_run_gets_its_ratio_and_a_target_is_met_only_when_every_run_meets_it():
    rows = versus.compare([_inlet(d_10pct=0.20, a_cold=3.0), _inlet(d_10pct=0.25, a_cold=3.5)],
                          _peers(llamaindex={"d_10pct": 0.44, "a_cold": 17.0}, langchain={"a_cold": 7.3}))
    by = {(r["scenario"], r["peer"]): r for r in rows}
    assert set(by) == {("d_10pct", "llamaindex"), ("a_cold", "llamaindex"), ("a_cold", "langchain")}
    one = by[("d_10pct", "llamaindex")]
    assert [round(x, 2) for x in one["ratios"]] == [2.2, 1.76] and not one["met"], "the second run is short of 2x"
    assert by[("a_cold", "langchain")]["met"] and by[("a_cold", "llamaindex")]["met"]
    table = versus.markdown(rows, ["20:33", "20:36", "20:47"])
    assert "| d_10pct | 0.20 / 0.25 (18 texts) | LlamaIndex 0.44 (121 texts) | 2.20x / 1.76x | 2x: not met |" in table


def test_no_op_and_1pct_runs_need_only_be_ahead_of_llamaindex_and_a_tie_is_not_ahead():
    rows = versus.compare([_inlet(c_1pct=0.40, b_noop=0.30), _inlet(c_1pct=0.44, b_noop=0.29)],
                          _peers(llamaindex={"c_1pct": 0.44, "b_noop": 0.30}))
    by = {r["scenario"]: r for r in rows}
    assert by["c_1pct"]["target"] == 1.0 and not by["c_1pct"]["met"], "0.44 against 0.44 is a tie, not ahead"
    assert not by["b_noop"]["met"] and by["b_noop"]["ratios"][1] > 1


def test_a_scenario_one_side_did_not_run_is_left_out():
    rows = versus.compare([_inlet(c_1pct=0.3), _inlet(c_1pct=0.3)], _peers(llamaindex={"b_noop": 0.29}))
    assert rows == []


def test_loading_it_leaves_the_import_path_alone():
    # bench/ holds query.py: on sys.path it would shadow the query package for every test after this one.
    import sys

    assert str(Path(versus.__file__).resolve().parent) not in sys.path
    assert versus.SCENARIOS == ("a_cold", "b_noop", "c_1pct", "d_10pct")
