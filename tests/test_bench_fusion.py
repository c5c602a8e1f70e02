"""bench/fusion.py: the leave-one-set-out choice, which may not lower the shipped embedder's mean below the reference;
bench/fusion_runs.py: the cross-lingual pairs it evaluates."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import fusion, fusion_runs  # bench/ is a folder of scripts on the project root: a namespace package


def _row(vector: float, fulltext: float, **methods: float) -> dict[str, np.ndarray]:
    return {"vector": np.array([vector]), "fulltext": np.array([fulltext]),
            **{m: np.array([v]) for m, v in methods.items()}}


def test_a_fusion_that_lowers_the_shipped_embedders_mean_is_not_chosen_however_it_helps_the_other_rows():
    ref, weak = fusion.REFERENCE, "zscore 0.3/0.7"
    table = {  # weak wins the static rows by far but costs every e5 set a little
        "a": _row(0.9, 0.8, **{ref: 0.95, weak: 0.94}), "b": _row(0.7, 0.8, **{ref: 0.85, weak: 0.84}),
        "a [static]": _row(0.2, 0.8, **{ref: 0.6, weak: 0.8}), "b [static]": _row(0.2, 0.8, **{ref: 0.6, weak: 0.8}),
        "c": _row(0.5, 0.6, **{ref: 0.65, weak: 0.64}), "c [static]": _row(0.1, 0.6, **{ref: 0.4, weak: 0.6}),
    }
    rest = [n for n in table if fusion.base_set(n) != "c"]
    assert fusion.objective([fusion.gain(table[n], weak) for n in rest]) > \
        fusion.objective([fusion.gain(table[n], ref) for n in rest]), "weak has the better objective"
    assert not fusion.admissible(table, rest, weak) and fusion.admissible(table, rest, ref)
    chosen = {r["held_out"]: r["chosen"] for r in fusion.leave_one_out(table, [weak, ref])}
    assert set(chosen.values()) == {ref}, "the constraint, not the objective, decides here"
    assert chosen.keys() == table.keys(), "every row of a held-out set is scored"
    table["a"][weak], table["b"][weak] = np.array([0.97]), np.array([0.86])  # now it keeps (raises) the e5 mean as well
    assert fusion.leave_one_out(table, [weak, ref])[-1]["chosen"] == weak


def test_a_fusion_that_wins_as_eval_scores_it_but_loses_as_a_k5_search_returns_it_is_not_chosen():
    ref, warm = fusion.REFERENCE, "zscore 0.6/0.4 T4"
    at = fusion.AT_K
    table = {name: _row(0.9, 0.8, **{ref: 0.92, warm: 0.93}) for name in "abc"}
    for name in table:
        table[name].update({f"vector{at}": np.array([0.9]), f"fulltext{at}": np.array([0.8]),
                            f"{ref}{at}": np.array([0.92]), f"{warm}{at}": np.array([0.88])})
    assert fusion.gains(table["a"], warm) == pytest.approx([0.03, -0.02]), "both views' gains over the better side"
    assert {r["chosen"] for r in fusion.leave_one_out(table, [warm, ref])} == {ref}, "the k 5 loss counts twice"
    for name in table:
        table[name][f"{warm}{at}"] = np.array([0.915])  # now below ref at k 5, but not below the better side
    rows = fusion.leave_one_out(table, [ref, warm])
    assert {r["chosen"] for r in rows} == {warm} and rows[0]["gain_at_k5"] == pytest.approx(0.015)


def test_each_embedders_fusion_is_fitted_on_its_own_rows_of_the_other_sets_only():
    ref, low = fusion.REFERENCE, "zscore 0.2/0.8"
    table = {  # low helps every static row and costs every e5 row
        "a": _row(0.9, 0.8, **{ref: 0.95, low: 0.85}), "b": _row(0.7, 0.8, **{ref: 0.85, low: 0.82}),
        "a [static]": _row(0.2, 0.8, **{ref: 0.6, low: 0.8}), "b [static]": _row(0.2, 0.8, **{ref: 0.6, low: 0.79}),
        "c": _row(0.5, 0.6, **{ref: 0.65, low: 0.6}), "c [static]": _row(0.1, 0.6, **{ref: 0.4, low: 0.6}),
    }
    rows = fusion.leave_one_out_by_embedder(table, [low, ref])
    chosen = {r["held_out"]: (r["embedder"], r["chosen"]) for r in rows}
    assert chosen == {"a": ("shipped", ref), "b": ("shipped", ref), "c": ("shipped", ref),
                      "a [static]": ("static", low), "b [static]": ("static", low), "c [static]": ("static", low)}
    assert {tuple(r["fitted_on"]) for r in rows if r["held_out"] == "c [static]"} == {("a", "b")}
    table["a [static]"][low] = table["b [static]"][low] = np.array([0.55])  # now worse than ref on the other sets
    assert fusion.leave_one_out_by_embedder(table, [low, ref])[-1] | {"fitted_on": None} == {
        "held_out": "c [static]", "chosen": ref, "fitted_on": None, "ndcg@10": 0.4, "gain_over_better_side": -0.2,
        "embedder": "static", "gain_at_k5": None}, "c's own static row (where low wins) does not decide its choice"


def _beir(folder, lang: str, docs: list[str], questions: dict[str, str]) -> None:
    """One language's BEIR folder in XQuAD-R's layout: ids prefixed with the language, question i judged on doc i."""
    (folder / lang / "qrels").mkdir(parents=True)
    docs_lines = [json.dumps({"_id": f"{lang}-{i}", "title": "", "text": d}) for i, d in enumerate(docs)]
    (folder / lang / "corpus.jsonl").write_text("\n".join(docs_lines) + "\n", encoding="utf-8")
    question_lines = [json.dumps({"_id": f"{lang}-{q}", "text": t}) for q, t in questions.items()]
    (folder / lang / "queries.jsonl").write_text("\n".join(question_lines) + "\n", encoding="utf-8")
    (folder / lang / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{lang}-{q}\t{lang}-{i}\t1\n" for i, q in enumerate(questions)), encoding="utf-8")


def test_a_cross_lingual_pair_asks_one_languages_questions_of_the_same_paragraphs_in_another(tmp_path):
    from flows.eval import load_dataset

    _beir(tmp_path / "xquad-r", "en", ["The ferry leaves at nine.", "Tides turn at noon."],
          {"q0": "When does the ferry leave?", "q1": "When do tides turn?"})
    _beir(tmp_path / "xquad-r", "de", ["Die Fähre fährt um neun.", "Die Gezeiten kehren mittags."],
          {"q0": "Wann fährt die Fähre?", "q1": "Wann kehren die Gezeiten?"})
    fusion_runs.cross_lingual_sets(tmp_path / "xquad-r", tmp_path / "pairs", (("en", "de"),))
    pair = load_dataset(tmp_path / "pairs" / "xquad-x" / "en-de")
    assert pair.queries == {"en-q0": "When does the ferry leave?", "en-q1": "When do tides turn?"}
    assert pair.qrels == {"en-q0": {"de-0": 1}, "en-q1": {"de-1": 1}}, "each question judged on its paragraph in German"
    assert {d["_id"]: d["text"] for d in pair.documents}["de-0"] == "Die Fähre fährt um neun."
    assert fusion.earlier_set("xquad-r/de")
    assert not fusion.earlier_set("xquad-x/en-de") and not fusion.earlier_set("fiqa"), "not among the 15 sets"


def test_a_paragraph_pair_asks_one_languages_paragraphs_of_their_translations(tmp_path):
    from flows.eval import load_dataset

    _beir(tmp_path / "xquad-r", "en", ["The ferry leaves at nine.", "Tides turn at noon."], {"q0": "x"})
    _beir(tmp_path / "xquad-r", "de", ["Die Fähre fährt um neun.", "Die Gezeiten kehren mittags."], {"q0": "y"})
    fusion_runs.paragraph_sets(tmp_path / "xquad-r", tmp_path / "pairs", (("de", "en"),))
    pair = load_dataset(tmp_path / "pairs" / "xquad-p" / "de-en")
    assert pair.queries == {"qde-0": "Die Fähre fährt um neun.", "qde-1": "Die Gezeiten kehren mittags."}
    assert pair.qrels == {"qde-0": {"en-0": 1}, "qde-1": {"en-1": 1}}, "each paragraph judged on its translation"
    assert not fusion.earlier_set("xquad-p/de-en"), "not among the 15 sets"
    (tmp_path / "xquad-r" / "de" / "corpus.jsonl").write_text('{"_id": "en-0", "text": "a"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="corpus.jsonl:1: not a paragraph of language 'de'"):
        fusion_runs.paragraph_sets(tmp_path / "xquad-r", tmp_path / "pairs", (("de", "en"),))
    with pytest.raises(ValueError, match=r"missing for the paragraph pairs: .*xquad-r/ru/corpus.jsonl"):
        fusion_runs.paragraph_sets(tmp_path / "xquad-r", tmp_path / "pairs", (("ru", "en"),))


def test_a_wrong_or_missing_file_is_refused_naming_it(tmp_path):
    _beir(tmp_path / "xquad-r", "en", ["a"], {"q0": "b"})
    _beir(tmp_path / "xquad-r", "de", ["c"], {"q0": "d"})
    qrels = tmp_path / "xquad-r" / "en" / "qrels" / "test.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nen-q0\tde-0\t1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="test.tsv:2: judged document 'de-0' is not of language 'en'"):
        fusion_runs.cross_lingual_sets(tmp_path / "xquad-r", tmp_path / "pairs", (("en", "de"),))
    qrels.write_text("query-id\tcorpus-id\tscore\nen-q0\n", encoding="utf-8")  # a line cut short
    with pytest.raises(ValueError, match="test.tsv:2: judged document '' is not of language 'en'"):
        fusion_runs.cross_lingual_sets(tmp_path / "xquad-r", tmp_path / "pairs", (("en", "de"),))
    with pytest.raises(ValueError, match=r"missing for the cross-lingual pairs: .*xquad-r/ru/corpus.jsonl"):
        fusion_runs.cross_lingual_sets(tmp_path / "xquad-r", tmp_path / "pairs", (("en", "ru"),))
