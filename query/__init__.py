"""Read side: search the versioned LanceDB tables that the ingest flow writes."""

import providers  # noqa: F401 - offline switches before any model library loads
from query.history import Diff, diff, quarantined, versions
from query.prompt import build_prompt, build_related_questions_prompt
from query.search import Citation, Neighbor, SearchResult, SearchResults, search, warm

__all__ = ["Citation", "Diff", "Neighbor", "SearchResult", "SearchResults", "build_prompt",
           "build_related_questions_prompt", "diff", "quarantined", "search", "versions", "warm"]
