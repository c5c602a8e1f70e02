"""Config loading: strict keys, errors that name the file and the key, paths resolved from the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.config import ChunkStrategy, load_config
from schemas.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inlet.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_config_loads_and_resolves_paths_from_its_folder():
    cfg = load_config(ROOT / "configs" / "inlet.yaml")
    assert cfg.sources[0].path == ROOT / "data" / "sample"
    assert Path(cfg.store.uri) == ROOT / "data" / "lancedb"
    assert cfg.chunking.strategy is ChunkStrategy.MARKDOWN
    assert cfg.sources[0].metadata.extra_fields() == {"subject": "sailing"}


def test_unknown_key_is_rejected_with_file_and_key(tmp_path):
    path = _write(tmp_path, "sources:\n  - {name: a, path: docs}\nchunking:\n  max_tokns: 100\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value) and "chunking.max_tokns" in str(err.value)


def test_bad_value_in_a_source_names_its_position(tmp_path):
    path = _write(tmp_path, "sources:\n  - name: a\n    path: docs\n    metadata: {access_level: secret}\n")
    with pytest.raises(ConfigError, match=r"sources\.0\.metadata\.access_level"):
        load_config(path)


def test_free_metadata_must_be_scalar(tmp_path):
    path = _write(tmp_path, "sources:\n  - name: a\n    path: docs\n    metadata: {grade: [1, 2]}\n")
    with pytest.raises(ConfigError, match="grade"):
        load_config(path)


def test_overlap_must_be_below_max_tokens(tmp_path):
    path = _write(tmp_path, "sources:\n  - {name: a, path: docs}\nchunking: {max_tokens: 50, overlap_tokens: 50}\n")
    with pytest.raises(ConfigError, match="chunking.overlap_tokens"):
        load_config(path)


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = _write(tmp_path, "sources:\n  - name: a\n   path: [unclosed\n")
    with pytest.raises(ConfigError, match=r"inlet.yaml: not valid YAML \(line \d+"):
        load_config(path)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")


def test_duplicate_source_names_are_rejected(tmp_path):
    path = _write(tmp_path, "sources:\n  - {name: a, path: x}\n  - {name: a, path: y}\n")
    with pytest.raises(ConfigError, match="repeated: a"):
        load_config(path)


@pytest.mark.parametrize(("section", "error"), [
    ("query: {fulltext_index: false}", r"query: .*mode hybrid searches the full-text index"),
    ("quality: {severity: {chunks.too_long: fail}}", r"quality.severity: .*unknown check chunks.too_long"),
    ("quality: {severity: {chunks.text_not_empty: stop}}", r"quality.severity.chunks.text_not_empty: "),
    ("execution: {dask_address: 'tcp://h:8786'}", r"execution: .*dask_address is only read with task_runner: dask"),
    ("execution: {task_runner: ray}", r"execution.task_runner: "),
    ("embedding: {kind: static, dim: 384}", r"embedding.dim: .*static model's vectors have 256 dimensions"),
    ("sources: [{name: w, kind: web}]", r"sources\.0: .*needs `urls` or a `sitemap`"),
    ("sources: [{name: w, kind: web, urls: [ftp://x/a]}]", r"sources\.0: .*'ftp://x/a' is not an http\(s\) URL"),
    ("sources: [{name: b, kind: bundle}]", r"sources\.0: .*a bundle source needs `path`"),
    ("sources: [{name: f, path: ., uri: 's3://b/p'}]", r"sources\.0: .*`path` or `uri`, not both"),
    ("sources: [{name: f, uri: bucket/prefix}]", r"sources\.0: .*'bucket/prefix' is not a URI"),
    ("store: {cache_table: chunks}", r"store: .*cache_table and chunks_table both name table 'chunks'"),
])
def test_settings_that_cannot_work_are_refused_naming_the_file_and_key(tmp_path, section, error):
    # Source cases bring their own sources section; the others get a readable one.
    head = "" if section.startswith("sources:") else "sources: [{name: docs, path: .}]\n"
    path = _write(tmp_path, f"{head}{section}\n")
    with pytest.raises(ConfigError, match=rf"{path}: {error}"):
        load_config(path)


def test_vector_mode_needs_no_fulltext_index(tmp_path):
    path = _write(tmp_path, "sources: [{name: docs, path: .}]\nquery: {fulltext_index: false, mode: vector}\n")
    assert load_config(path).query.mode == "vector"


