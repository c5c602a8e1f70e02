"""Cleaning: Hugo shortcodes and MkDocs admonitions out, code blocks untouched, PDF running headers dropped."""

from __future__ import annotations

import re

import pytest

from tasks.clean import clean_markdown, drop_repeated_page_lines, tidy_whitespace

HUGO = """Intro text.

{{< comment >}} cSpell:disable {{< /comment >}}
{{% alert title="Note" %}}
Add the AOP starter first.
{{% /alert %}}

{{< tabpane text=true >}}
{{% tab "Linux (AMD 64)" %}}

```sh
curl -o ocb https://example.com/{{% version-from-registry collector-builder %}}/ocb
```

{{% /tab %}} {{% tab "Windows" %}}
Run the installer. Version {{% param vers %}} is current.
{{% /tab %}} {{< /tabpane >}}
"""

MKDOCS = """Before.

!!! warning "Read this"
    Enabling orphaned resource monitoring is slow.

    ```yaml
    !!! not an admonition inside code
    ```

    !!! note
        Nested note.

??? tip Collapsible title
    Hidden tip.

=== "Python"

    ```python
    graph.invoke({})
    ```

After.
"""


def test_hugo_shortcodes_leave_labels_and_text_and_keep_code():
    out = clean_markdown(HUGO)
    assert "{{" not in re.sub(r"```.*?```", "", out, flags=re.DOTALL), "no shortcode outside code"
    assert "cSpell" not in out, "comment blocks go with their content"
    assert "**Note**\n" in out and "Add the AOP starter first." in out
    assert "**Linux (AMD 64)**" in out and "**Windows**" in out
    assert "curl -o ocb https://example.com/{{% version-from-registry collector-builder %}}/ocb" in out, "code intact"
    assert "Run the installer. Version  is current." in out, "a value shortcode is dropped, its sentence kept"


def test_mkdocs_admonitions_and_tabs_become_labelled_plain_markdown():
    out = clean_markdown(MKDOCS)
    assert "**Read this**\n\nEnabling orphaned resource monitoring is slow." in out
    assert "```yaml\n!!! not an admonition inside code\n```" in out, "code dedented, not rewritten"
    assert "**Note**\n\nNested note." in out
    assert "**Collapsible title**\n\nHidden tip." in out
    assert "**Python**\n\n```python\ngraph.invoke({})\n```" in out
    assert out.endswith("After.\n") and "\n\n\n" not in out


def test_real_docs_keep_every_code_block(shared_corpora):
    checked = 0
    for path in sorted((shared_corpora / "markdown").rglob("*.md")):
        text = path.read_text(encoding="utf-8", errors="replace")
        out = clean_markdown(text)
        # Top-level fences (not inside an admonition, which is dedented) come through byte for byte.
        for block in re.findall(r"^(```[^\n]*\n.*?\n```)[ \t]*$", text, re.MULTILINE | re.DOTALL):
            assert block in out, (path, block[:80])
            checked += 1
        prose = re.sub(r"^\s*```.*?^\s*```", "", out, flags=re.MULTILINE | re.DOTALL)
        assert not re.search(r"\{\{[<%](?!/\*)", prose), path
        assert not re.search(r"^\s*!!! ", prose, re.MULTILINE), path
    assert checked > 1000


@pytest.mark.parametrize(("text", "expected"), [
    ("a  \nb\t \nc ", "a\nb\nc"),  # trailing spaces and tabs go, on every line and at the end
    ("a\n\n\n\nb\n\n\nc\n\nd", "a\n\nb\n\nc\n\nd"),  # runs of blank lines become one
    ("a \n \t\n  \nb", "a\n\nb"),  # lines of only spaces are blank lines
    ("\n\n\na\n\n\n", "\na\n"),  # at most one newline at either end of a segment
    ("a\r\n\r\n\r\nb", "a\r\n\r\n\r\nb"),  # only \n ends a line here, as before
    ("x  \n```\ncode  \n\n\n\n  more\t\n```\n\n\n\ny  ", "x\n```\ncode  \n\n\n\n  more\t\n```\n\ny"),  # code untouched
    ("", ""), ("\n", "\n"), ("\n\n\n\n\n\n\n", "\n"),
])
def test_whitespace_is_tidied_outside_code_blocks_only(text, expected):
    assert tidy_whitespace(text) == expected


BODY = ["The left main gear collapsed on landing.", "Crew reported a vibration at rotation.",
        "Weather was clear with light winds.", "The operator grounded its fleet.",
        "Investigators recovered both recorders.", "Maintenance logs showed a deferred item.",
        "The runway was dry and grooved.", "Two passengers had minor injuries."]


@pytest.mark.parametrize("pages", [3, 8])
def test_running_headers_footers_and_page_numbers_are_dropped(pages):
    rows = []
    for page in range(1, pages + 1):
        for text in ("NTSB Aviation Accident Final Report", BODY[page - 1], f"Page {page} of {pages}"):
            rows.append({"text": text, "page": page})
    kept = drop_repeated_page_lines(rows)
    assert [r["text"] for r in kept] == BODY[:pages]
    assert drop_repeated_page_lines(rows[:6]) == rows[:6], "two pages are too few to tell"
