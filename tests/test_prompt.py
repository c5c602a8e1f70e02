"""Prompt assembly: condition, numbered context with citations, question."""

from __future__ import annotations

from query import Citation, Neighbor, SearchResult, build_prompt, build_related_questions_prompt


def _hit(text: str, title: str, **kw) -> SearchResult:
    return SearchResult(text, 0.9, Citation(title, f"file:///{title}.md", ("Section",), (2, 3)), f"s:{title}",
                        f"c-{title}", {}, **kw)


def test_prompt_has_condition_then_cited_context_then_question():
    hits = [_hit("Laser dinghies: 20 knots.", "Safety"), _hit("Flush the engine.", "Guide",
                                                              before=(Neighbor("p", 0, "Before winter:"),))]
    prompt = build_prompt("What is the wind limit?", hits, condition="Answer from the context.")
    assert prompt.index("Answer from the context.") < prompt.index("Context:") < prompt.index("Question:")
    assert "[1] Safety | Section | pp. 2-3 <file:///Safety.md>\nLaser dinghies: 20 knots." in prompt
    assert "[2] Guide | Section | pp. 2-3 <file:///Guide.md>\nBefore winter:\nFlush the engine." in prompt
    assert prompt.rstrip().endswith("Question: What is the wind limit?")


def test_related_questions_prompt_carries_the_same_context():
    prompt = build_related_questions_prompt([_hit("Tide tables.", "Tides")])
    assert "five questions" in prompt and "[1] Tides" in prompt and "Question:" not in prompt
