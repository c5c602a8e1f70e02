"""Chunking: heading sections, token limits, fences kept whole, overlap, stable ids."""

from __future__ import annotations

import itertools

import pyarrow as pa

from providers.tokenizer import count_tokens
from schemas.config import ChunkingConfig
from tasks.chunk import (
    chunk_elements,
    make_chunk_id,
    parse_markdown,
    text_hash,
)
from tasks.clean import MAX_HEADING_CHARS

DOC = """# Guide

Intro paragraph.

## Install

Run this:

```bash
pip install inlet
# a comment, not a heading
```

### Options

Some options.

#### Deep heading stays in the body

More text.

## Empty section

## Next

Body of next.
"""


def _md(text: str, doc_id: str = "d") -> pa.Table:
    return pa.table({"doc_id": [doc_id], "element_index": pa.array([0], pa.int32()), "kind": ["markdown"],
                     "text": [text], "heading_level": pa.array([None], pa.int32()),
                     "page": pa.array([None], pa.int32())})


def _chunks(text: str, **cfg) -> list[dict]:
    return chunk_elements(_md(text), ChunkingConfig(**cfg))[0].to_pylist()


def test_fenced_comment_is_not_a_heading():
    kinds = [(b.kind, b.level) for b in parse_markdown(DOC)]
    assert ("code", None) in kinds
    assert sum(k == "heading" for k, _ in kinds) == 6


def test_sections_split_at_three_levels_with_heading_paths():
    rows = _chunks(DOC, max_tokens=200, overlap_tokens=10)
    paths = [tuple(r["heading_path"]) for r in rows]
    assert paths == [("Guide",), ("Guide", "Install"), ("Guide", "Install", "Options"), ("Guide", "Next")]
    assert "#### Deep heading stays in the body" in rows[2]["text"]
    assert rows[3]["text"].startswith("## Empty section\n\n## Next"), "a bare heading joins the next section"
    assert "```bash\npip install inlet\n# a comment, not a heading\n```" in rows[1]["text"]


def test_positions_and_neighbour_links():
    rows = _chunks(DOC, max_tokens=200, overlap_tokens=10)
    assert [r["chunk_index"] for r in rows] == list(range(len(rows)))
    assert {r["total_chunks"] for r in rows} == {len(rows)}
    assert rows[0]["prev_chunk_id"] is None and rows[-1]["next_chunk_id"] is None
    for a, b in itertools.pairwise(rows):
        assert a["next_chunk_id"] == b["chunk_id"] and b["prev_chunk_id"] == a["chunk_id"]


def test_token_limit_holds_and_code_block_is_not_cut():
    code = "```python\n" + "\n".join(f"value_{i} = compute({i})" for i in range(12)) + "\n```"
    prose = " ".join(["The harbour master checks every mooring line before the storm season."] * 6)
    text = f"# T\n\n{prose}\n\n{code}\n\n{prose}\n"
    assert count_tokens(code) < 120
    rows = _chunks(text, max_tokens=120, overlap_tokens=20)
    assert all(r["token_count"] <= 120 for r in rows)
    assert sum(code in r["text"] for r in rows) == 1, "the code block sits whole in exactly one chunk"
    assert all(r["text"].count("```") % 2 == 0 for r in rows)


def test_code_block_over_the_limit_is_split():
    code = "```\n" + "\n".join(f"line {i} of a very long generated listing" for i in range(80)) + "\n```"
    rows = _chunks(f"# T\n\n{code}\n", max_tokens=100, overlap_tokens=10)
    assert len(rows) > 1 and all(r["token_count"] <= 100 for r in rows)


def test_long_section_chunks_overlap():
    sentences = [f"Sentence number {i} talks about tides and currents in the bay." for i in range(60)]
    text = "# T\n\n" + "\n\n".join(sentences)
    rows = _chunks(text, max_tokens=80, overlap_tokens=20)
    assert len(rows) > 2
    for a, b in itertools.pairwise(rows):
        last_paragraph = a["text"].split("\n\n")[-1]
        assert b["text"].startswith(last_paragraph[-40:]) or last_paragraph in b["text"]


def test_fixed_strategy_ignores_headings():
    rows = _chunks(DOC * 5, strategy="fixed", max_tokens=50, overlap_tokens=10)
    assert all(r["heading_path"] == [] for r in rows)
    assert all(r["token_count"] <= 52 for r in rows)  # decode/re-encode may differ by a token or two
    assert len(rows) >= 5


def test_merge_small_sections_under_one_parent():
    text = "# A\n\n## B\n\nb text\n\n### B1\n\nb1 text\n\n### B2\n\nb2 text\n\n## C\n\nc text\n"
    merged = _chunks(text, max_tokens=200, overlap_tokens=10, merge_small_sections=True)
    plain = _chunks(text, max_tokens=200, overlap_tokens=10)
    assert len(plain) == 4
    assert [tuple(r["heading_path"]) for r in merged] == [("A", "B"), ("A", "C")]


def test_chunk_ids_are_content_addressed_and_survive_moves():
    before = {r["text"]: r["chunk_id"] for r in _chunks("# A\n\none\n\n# B\n\ntwo\n", max_tokens=200, overlap_tokens=0)}
    after = {r["text"]: r["chunk_id"] for r in _chunks("# B\n\ntwo\n\n# A\n\none\n", max_tokens=200, overlap_tokens=0)}
    assert before == after
    assert make_chunk_id("d", text_hash("x"), 0) != make_chunk_id("e", text_hash("x"), 0)


def test_repeated_text_in_one_document_gets_distinct_ids():
    rows = _chunks("# A\n\nsame\n\n# A\n\nsame\n", max_tokens=200, overlap_tokens=0)
    assert rows[0]["text"] == rows[1]["text"]
    assert rows[0]["chunk_id"] != rows[1]["chunk_id"]


def test_pages_follow_elements():
    elements = pa.table({
        "doc_id": ["d"] * 4, "element_index": pa.array(range(4), pa.int32()),
        "kind": ["heading", "text", "heading", "text"],
        "text": ["Intro", "first page text", "Money", "second page text"],
        "heading_level": pa.array([1, None, 1, None], pa.int32()), "page": pa.array([1, 1, 2, 2], pa.int32()),
    })
    rows = chunk_elements(elements, ChunkingConfig())[0].to_pylist()
    assert [(r["heading_path"], r["page_start"], r["page_end"]) for r in rows] == [(["Intro"], 1, 1), (["Money"], 2, 2)]
    assert rows[1]["text"] == "# Money\n\nsecond page text"


def test_a_heading_too_long_to_be_one_is_body_text_and_no_chunk_carries_it_in_its_path():
    # A parser took a 20,000-character line for a title: as a heading, every chunk under it carried it in its path.
    line = " ".join(f"word{i}" for i in range(3000))
    assert len(line) > MAX_HEADING_CHARS
    title = "t" * MAX_HEADING_CHARS  # the longest title that still counts
    elements = pa.table({
        "doc_id": ["d"] * 4, "element_index": pa.array(range(4), pa.int32()),
        "kind": ["heading", "heading", "text", "markdown"],
        "text": [title, line, "after it", f"## {line}\n\nmarkdown body"],
        "heading_level": pa.array([1, 1, None, None], pa.int32()), "page": pa.array([1, 1, 1, 1], pa.int32()),
    })
    rows = chunk_elements(elements, ChunkingConfig(max_tokens=512, overlap_tokens=0))[0].to_pylist()
    assert len(rows) > 2
    assert {tuple(r["heading_path"]) for r in rows} == {(title,)}
    text = " ".join(r["text"] for r in rows)
    assert all(f"word{i} " in text for i in (0, 1500, 2998)) and "after it" in text and "markdown body" in text
    assert f"## {line[:50]}" in text, "the Markdown line is kept as written"


def test_windows_never_split_a_character():
    # Cyrillic takes two bytes a character and tiktoken cuts some of them between tokens.
    text = " ".join(["Однако директор училища посоветовал молодому человеку поступить в Цюрихский Политехникум."] * 40)
    for strategy in ("markdown", "fixed"):
        cfg = ChunkingConfig(strategy=strategy, max_tokens=37, overlap_tokens=11)
        rows = [{"doc_id": "d", "element_index": 0, "kind": "text", "text": text, "heading_level": None, "page": None}]
        chunks = chunk_elements(pa.Table.from_pylist(rows), cfg)[0].to_pylist()
        assert len(chunks) > 5
        assert not [c["text"] for c in chunks if "\ufffd" in c["text"]], strategy


# --- counting a section from its blocks' counts ---------------------------------------------------

_HOSTILE = ["a", "Z", "7", "é", "中", "ß", ".", ",", "'", "`", ")", "#", "-", "*", "«", "»", "…", "—", "。",
            " ", "  ", "\t", "\n", "\r", "\u3000", "\xa0", "🙂", "'s", "'ll", "123", "4567"]


def _random_block(rng) -> str:
    return "".join(rng.choice(_HOSTILE) for _ in range(rng.randint(1, 12)))


def test_a_section_counted_from_its_blocks_matches_tiktoken_on_hostile_joins():
    import random

    from tasks.chunk import Block, _render, joined_tokens

    rng = random.Random(7)
    for _ in range(4000):
        blocks = [Block(_random_block(rng), "text") for _ in range(rng.randint(1, 4))]
        assert joined_tokens(blocks) == count_tokens(_render(blocks)), [b.text for b in blocks]


def test_a_section_counted_from_its_blocks_matches_tiktoken_on_every_real_section(shared_corpora):
    from tasks.chunk import _render, joined_tokens, split_sections

    files = [*sorted((shared_corpora / "markdown").rglob("*.md")), *sorted((shared_corpora / "text").rglob("*"))]
    sections = 0
    for path in files[:600]:
        if not path.is_file():
            continue
        blocks = parse_markdown(path.read_text(encoding="utf-8", errors="replace"))
        for pair in itertools.pairwise(blocks):  # every join, alone
            assert joined_tokens(list(pair)) == count_tokens(_render(list(pair))), path
        for section in split_sections(blocks, 3):
            assert joined_tokens(section.blocks) == count_tokens(_render(section.blocks)), path
            sections += 1
    assert sections > 2000


def test_stored_token_counts_are_each_chunks_own_count(shared_corpora):
    files = sorted((shared_corpora / "markdown").rglob("*.md"))[:150]
    rows = [{"doc_id": str(i), "element_index": 0, "kind": "markdown", "text": p.read_text(encoding="utf-8"),
             "heading_level": None, "page": None} for i, p in enumerate(files)]
    for cfg in (ChunkingConfig(max_tokens=512, overlap_tokens=64), ChunkingConfig(max_tokens=120, overlap_tokens=20,
                                                                                   merge_small_sections=True)):
        chunks = chunk_elements(pa.Table.from_pylist(rows), cfg)[0].to_pylist()
        assert len(chunks) > len(files)
        assert all(c["token_count"] == count_tokens(c["text"]) for c in chunks)
