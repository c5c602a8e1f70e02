"""Decoding and cleaning text: bytes to text; site-generator markup out, content in, code blocks untouched.

- Hugo shortcodes: comments go with their content; tabs and alerts leave their label as a bold
  line; other shortcodes (params, includes, embeds) are dropped, paired ones keeping their inner text.
- MkDocs admonitions (`!!! note "Title"`, `??? tip`) and content tabs (`=== "Python"`): the marker
  becomes a bold line, the indented body is dedented into ordinary Markdown.
- Whitespace: trailing spaces and runs of blank lines.
- PDFs: lines that repeat at the top or bottom of most pages (running headers, footers, page
  numbers) are dropped.
- HTML: the page's content landmark is kept, navigation and page furniture dropped.

Fenced code blocks are never changed: a shortcode or `!!!` inside one is part of the example.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from schemas.errors import ExtractionError

# Byte-order marks and the encodings they name, longest first (a UTF-32 LE mark begins with UTF-16 LE's).
BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"),
         (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


def decode_text(data: bytes) -> str:
    """Decode bytes by their BOM, as UTF-8 when they are valid UTF-8, else by detection; newlines normalised to \\n.

    Valid UTF-8 with NUL bytes (UTF-16 without a BOM) or ISO-2022 escapes is not taken for UTF-8.
    """
    encoding = next((enc for bom, enc in BOMS if data.startswith(bom)), None)
    if encoding is None and b"\x00" not in data and b"\x1b" not in data:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return text.replace("\r\n", "\n").replace("\r", "\n")
    if encoding is None:
        import chardet

        # chardet 7 tells the ISO-8859 and Windows code pages apart where charset-normalizer does not.
        encoding = chardet.detect(data[: 1 << 20])["encoding"]
    try:
        if encoding is None:
            raise LookupError("no encoding detected")
        text = data.decode(encoding)
    except (LookupError, UnicodeDecodeError) as exc:
        raise ExtractionError("decode_error", f"could not detect the text encoding ({exc})") from None
    if "\x00" in text:
        raise ExtractionError("decode_error", f"decoded as {encoding} but NUL characters remain: binary, not text")
    return text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_COMMENT = re.compile(r"\{\{[<%]\s*comment\s*[>%]\}\}.*?\{\{[<%]\s*/comment\s*[>%]\}\}", re.DOTALL)
_SHORTCODE = re.compile(r"\{\{([<%])(?!/\*)\s*(/?)\s*([\w.-]+)((?:[^}]|\}(?!\}))*?)\s*[>%]\}\}")

# A heading's title goes into the heading path of every chunk under it, into its document's title and into
# enrichment prompts. Real ones are short: in ../shared/corpora the longest Markdown heading has 225 characters
# and 99.9% of all headings under 160. Longer "headings" are lines a parser took for titles (a
# 331,825-character line of a text file made each of its document's 1,910 chunks carry 141 KB of path).
MAX_HEADING_CHARS = 300


def heading_title(text: str) -> str | None:
    """A heading's text with its whitespace folded; None when it is too long to be a heading (it is body text)."""
    title = " ".join(text.split())
    return title if len(title) <= MAX_HEADING_CHARS else None


_LABEL = re.compile(r"""^\s*(?:(?:title|header|name)\s*=\s*)?["']([^"']+)["']""")
_LABELLED = {"tab", "alert", "details", "card", "callout", "note", "warning", "tip", "info", "caution"}
_ADMONITION = re.compile(r"""^(\s*)(?:!!!|\?\?\?\+?)\s+([\w-]+)(?:\s+(?:"([^"]*)"|([^"\s].*?)))?\s*$""")
_CONTENT_TAB = re.compile(r"""^(\s*)===\+?\s+"([^"]*)"\s*$""")


def _shortcode(match: re.Match) -> str:
    closing, name, args = match.group(2), match.group(3).lower(), match.group(4)
    if closing:
        return ""
    label = _LABEL.match(args)
    if name in _LABELLED:
        text = label.group(1) if label else name.capitalize()
        return f"\n**{text}**\n"
    return ""


def _outside_fences(text: str, fn: Callable[[str], str]) -> str:
    """Apply fn to the stretches of text outside fenced code blocks."""
    out: list[str] = []
    prose: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        if fence is not None:  # code lines go out as they are, one by one: no string grows line by line
            out.append(line)
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            continue
        match = _FENCE.match(line)
        if match:
            if prose:
                out.append(fn("\n".join(prose)))
            prose, fence = [], match.group(1)[0] * 3
            out.append(line)
        else:
            prose.append(line)
    if prose:
        out.append(fn("\n".join(prose)))
    return "\n".join(out)


def strip_hugo_shortcodes(text: str) -> str:
    """Remove Hugo shortcodes outside code blocks; comment blocks go with their content."""
    if "{{" not in text:
        return text

    def clean(prose: str) -> str:
        return _SHORTCODE.sub(_shortcode, _COMMENT.sub("", prose))

    return _outside_fences(text, clean)


def _dedent_block(lines: list[str], start: int, indent: int) -> tuple[list[str], int]:
    """Collect the lines after start indented past indent (blank lines included); return them dedented and the end."""
    body: list[str] = []
    i = start
    while i < len(lines):
        line = lines[i]
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line[indent + 4 :] if line.strip() else "")
        i += 1
    while body and not body[-1].strip():
        body.pop()
        i -= 1
    return body, i


def unwrap_admonitions(text: str) -> str:
    """Turn MkDocs admonitions and content tabs into a bold label line and their dedented body."""
    if "!!!" not in text and "???" not in text and "===" not in text:
        return text
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    fence: str | None = None
    while i < len(lines):
        line = lines[i]
        fence_match = _FENCE.match(line)
        if fence is not None:
            out.append(line)
            if fence_match and fence_match.group(1)[0] == fence:
                fence = None
            i += 1
            continue
        if fence_match:
            fence = fence_match.group(1)[0]
            out.append(line)
            i += 1
            continue
        admonition, tab = _ADMONITION.match(line), _CONTENT_TAB.match(line)
        if not admonition and not tab:
            out.append(line)
            i += 1
            continue
        indent = len((admonition or tab).group(1))
        if admonition:
            kind, title = admonition.group(2), admonition.group(3) if admonition.group(3) is not None else admonition.group(4)
            label = title if title is not None else kind.capitalize()  # "" (an explicit empty title): no label
        else:
            label = tab.group(2)
        body, i = _dedent_block(lines, i + 1, indent)
        pad = " " * indent
        if label:
            out.append(f"{pad}**{label}**")
            out.append("")
        # Nested admonitions and tabs unwrap too.
        out.extend(pad + b if b else "" for b in unwrap_admonitions("\n".join(body)).split("\n"))
    return "\n".join(out)


def tidy_whitespace(text: str) -> str:
    """Drop trailing spaces and collapse runs of blank lines, outside code blocks."""

    def clean(prose: str) -> str:
        # String methods, not re.sub: the patterns [ \t]+$ (multiline), \n{3,} and \n+\Z are tried at every space
        # or newline. Over the bench's 1,384 Markdown files this function took 1.0 s with them, 0.12 s without.
        prose = "\n".join(line.rstrip(" \t") for line in prose.split("\n"))
        while "\n\n\n" in prose:  # each pass shortens every run of 3+ newlines; runs of 2 stay
            prose = prose.replace("\n\n\n", "\n\n")
        # Segments are joined by a newline: at most one blank line at either end of a segment.
        if prose.startswith("\n"):
            prose = "\n" + prose.lstrip("\n")
        if prose.endswith("\n"):
            prose = prose.rstrip("\n") + "\n"
        return prose

    return _outside_fences(text, clean)


def clean_markdown(text: str) -> str:
    """Markdown as a reader sees it: shortcodes and admonition markers out, text and code in."""
    return tidy_whitespace(unwrap_admonitions(strip_hugo_shortcodes(text))).strip("\n") + "\n"


def _furniture_key(text: str) -> str:
    """Compare header lines with their page numbers and dates blanked out."""
    return re.sub(r"\d+", "#", " ".join(text.split()).lower())


def drop_repeated_page_lines(rows: list[dict], edge: int = 2, share: float = 0.5) -> list[dict]:
    """Drop elements that open or close most pages with the same text (running headers, footers, page numbers)."""
    pages: dict[int, list[dict]] = {}
    for row in rows:
        if row["page"] is not None:
            pages.setdefault(row["page"], []).append(row)
    if len(pages) < 3:
        return rows
    seen: Counter[str] = Counter()
    for page_rows in pages.values():
        keys = {_furniture_key(r["text"]) for r in page_rows[:edge] + page_rows[-edge:] if len(r["text"]) <= 120}
        seen.update(keys)
    repeated = {k for k, n in seen.items() if n >= max(3, share * len(pages))}
    if not repeated:
        return rows
    drop = {id(r) for page_rows in pages.values() for r in page_rows[:edge] + page_rows[-edge:]
            if _furniture_key(r["text"]) in repeated}
    return [r for r in rows if id(r) not in drop]


# Page furniture, not content: navigation, site headers and footers, sidebars, forms' buttons, hidden parts.
_BOILERPLATE = (
    "//nav|//aside|//script|//style|//noscript|//template|//button|//dialog"
    "|//*[@role='navigation' or @role='banner' or @role='contentinfo' or @role='complementary' or @role='search']"
    "|//*[@aria-hidden='true' or @hidden]"
    "|//header[not(ancestor::article) and not(ancestor::main) and not(.//h1)]"  # a page header holding the h1 is the
    "|//footer[not(ancestor::article) and not(ancestor::main)]"  # article's own, not the site's
)


# ids and class names that mark navigation and page furniture (whole words, or joined by - or _).
_FURNITURE_NAME = re.compile(
    r"(?:^|[\s_-])(?:nav|navbar|navigation|menu|sidebar|breadcrumbs?|footer|cookies?|cookie-banner|toc|"
    r"table-of-contents|skip-link|site-header|pagination)(?:$|[\s_-])", re.IGNORECASE)


def clean_html(text: str) -> str:
    """Keep a page's content: its <main> (or its largest <article>) without navigation, sidebars and footers.

    Pages without such landmarks keep their whole body minus the furniture. Unparseable markup is
    returned as it came, for unstructured's own lenient parser.
    """
    import lxml.etree
    import lxml.html

    try:
        root = lxml.html.document_fromstring(text)
    except (lxml.etree.ParserError, ValueError):
        return text
    # A "skip to content" link names the content's id: the most reliable landmark on pages without <main>.
    skip_targets = [a.get("href")[1:] for a in root.xpath("//a[starts-with(@href, '#')]")
                    if re.match(r"\s*skip\b", a.text_content(), re.IGNORECASE) and len(a.get("href")) > 1]
    for element in root.xpath(_BOILERPLATE):
        if element.getparent() is not None:
            element.drop_tree()
    total = len(root.text_content())
    for element in root.xpath("//*[@id or @class]"):
        names = f"{element.get('id', '')} {element.get('class', '')}"
        # Class names lie (a "sidebar-layout" wrapper may hold the article): only small parts go by name.
        if (element.getparent() is not None and element.tag not in {"html", "body"} and _FURNITURE_NAME.search(names)
                and len(element.text_content()) < 0.25 * total):
            element.drop_tree()
    candidates = (root.xpath("//main|//*[@role='main']") or root.xpath("//article")
                  or [el for t in skip_targets for el in root.xpath("//*[@id=$id]", id=t)])
    content = max(candidates, key=lambda el: len(el.text_content())) if candidates else root
    if not content.text_content().strip():
        return text  # nothing but furniture: better the whole page than nothing
    return lxml.html.tostring(content, encoding="unicode")
