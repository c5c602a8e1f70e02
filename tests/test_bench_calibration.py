"""bench/calibration.py: the pseudo-queries it makes of a store's chunks, and the weight it picks from their scores."""

from __future__ import annotations

import random

from bench import calibration  # bench/ is a folder of scripts on the project root, importable as a namespace package

TEXT = ("Harbour notes. The ferry to the outer island leaves the north quay at nine every weekday morning. "
        "Short. The ferry returns at five.")


def test_each_kind_of_pseudo_query_comes_from_its_own_chunk():
    others = ["The ferry leaves at nine.", "The quay is closed on Sundays.", "Nine boats moored at the quay."]
    df = calibration.document_frequencies([TEXT, *others])
    queries = calibration.pseudo_queries([{"chunk_id": "c1", "text": TEXT}, {"chunk_id": "c2", "text": "Too short."}],
                                         df, 4, random.Random(0))
    sentence = "The ferry to the outer island leaves the north quay at nine every weekday morning."
    assert queries["sentence"] == [("c1", sentence)], "the only sentence of 6-40 words; c2 has none"
    assert queries["half"] == [("c1", " ".join(sentence.split()[::2]))]
    (chunk, words), = queries["keywords"]
    # Words no other text has come first, in the order the chunk says them; "ferry" (twice here, but in another
    # text too) and "the" (in every text) come after them.
    assert chunk == "c1" and words == "harbour notes outer island north"


def test_the_best_pseudo_score_picks_the_weight_and_ties_go_to_the_shipped_one():
    assert calibration.choose({0.3: 0.8, 0.5: 0.7, 0.7: 0.6}) == 0.3
    assert calibration.choose({0.3: 0.8, 0.5: 0.8, 0.7: 0.8}) == calibration.SHIPPED
    assert calibration.choose({0.2: 0.9, 0.4: 0.9, 0.7: 0.1}) == 0.4, "of equals, the nearer to 0.5"
