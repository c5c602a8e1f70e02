"""A rule-based English pipeline from spaCy's own components, for when en_core_web_sm is absent.

unstructured's title/narrative heuristics ask spaCy for sentences and verb tags. The real
model downloads itself on first use, which fails offline; this pipeline (blank English +
sentencizer + an attribute_ruler tagging common verb forms) stands in for it, and only when
the real model is not installed.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spacy.language import Language

MODEL_NAME = "en_core_web_sm"
NOTICE = (
    "spaCy model en_core_web_sm is not installed and cannot be downloaded: extraction uses "
    "Inlet's rule-based spaCy pipeline (fewer verb tags, so short lines are more often taken "
    "for titles). Install the real model for unstructured's full heuristics (see README)."
)

# Auxiliaries and frequent verbs: enough for unstructured's "contains a verb" test on prose.
_VERBS = (
    "is are was were be been being am has have had having do does did can could will would shall "
    "should may might must use uses used using make makes made run runs ran get gets got set sets "
    "add adds added see sees saw go goes went take takes took give gives gave need needs needed "
    "allow allows allowed provide provides provided create creates created return returns returned "
    "call calls called contain contains contained include includes included require requires "
    "required support supports supported describe describes described show shows showed explain "
    "explains read reads write writes wrote keep keeps kept find finds found work works worked "
    "become becomes became help helps helped follow follows followed"
).split()


def real_model_installed() -> bool:
    """Tell whether spaCy can load en_core_web_sm from this environment (without importing spaCy)."""
    return importlib.util.find_spec(MODEL_NAME) is not None


@functools.cache
def fallback_pipeline() -> Language:
    """Build the stand-in pipeline once."""
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    ruler = nlp.add_pipe("attribute_ruler")
    ruler.add(patterns=[[{"LOWER": {"IN": _VERBS}}]], attrs={"TAG": "VBZ", "POS": "VERB"})
    # Regular past tenses and gerunds of longer words are verbs often enough to count.
    ruler.add(patterns=[[{"LOWER": {"REGEX": r"^[a-z]{3,}(ed|ing)$"}}]], attrs={"TAG": "VBD", "POS": "VERB"})
    return nlp


def install_fallback_if_needed() -> str | None:
    """Point unstructured at the fallback when the real model is missing; return the notice, if any."""
    if real_model_installed():
        return None
    from unstructured.nlp import tokenize

    # unstructured reaches the pipeline through this module-level function at call time.
    tokenize._get_nlp = fallback_pipeline
    return NOTICE
