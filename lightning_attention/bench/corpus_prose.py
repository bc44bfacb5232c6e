"""Prose out of documentation text: code, markup and tables removed, the sentences kept.

Three kinds of input reach the corpus (see :mod:`.corpus_sources`):

- docstrings (reStructuredText or Markdown inside Python source): :func:`docstring_prose` drops doctest examples
  (``>>>`` and their output), literal blocks (the indented block after ``::``), fenced code, code-like directives
  (``.. code-block::``, ``.. math::``, ...), table rules and section underlines, and turns inline roles
  (``:class:`~torch.Tensor```) into their text;
- Python's documentation topics (plain text rendered from reStructuredText, code indented after a ``:`` line):
  the same function, which also drops indented code blocks;
- HTML (the AWS API reference shipped in botocore): :func:`html_prose`, paragraphs and list items as lines.

:func:`prose_paragraphs` then keeps the paragraphs that read as prose (mostly letters and spaces). The rules are
heuristics written for these sources; the corpus manifest records how much each removed.
"""

import html.parser
import re

# directives whose body is prose (kept, dedented); every other directive's body is dropped with it
_PROSE_DIRECTIVES = {
    "note", "warning", "tip", "important", "hint", "caution", "attention", "danger", "error", "seealso",
    "deprecated", "versionadded", "versionchanged", "admonition", "topic", "rubric",
}
_DIRECTIVE = re.compile(r"^\s*\.\.\s+([\w:-]+)::\s*(.*)$")
_COMMENT = re.compile(r"^\s*\.\.(\s|$)")  # ".. _label:", ".. |sub| replace::", a comment
_ROLE = re.compile(r":[\w.+-]+(?::[\w.+-]+)*:`([^`]*)`")  # :class:`~torch.Tensor`, :math:`x^2`, :py:func:`f`
_ROLE_TARGET = re.compile(r"^(.*?)\s*<[^>]*>$")  # :ref:`the text <target>` -> the text
_FENCE = re.compile(r"^\s*(```|~~~)")
_RULE = re.compile(r"^\s*([-=~^*+#_`:.|]\s*){3,}$")  # section underlines, table borders, transitions
# statements that begin a line of code in these sources
_CODE_START = re.compile(
    r"^(>>>|\.\.\.(\s|$)|\$ |import |from \S+ import |def |class \w+[(:]|return\b|@\w|if __name__|for \w+ in .*:$|"
    r"with .*:$|print\(|raise \w+|\w+(\.\w+)*\s*(=|\+=|-=)\s*\S)"
)


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def letter_share(text: str) -> float:
    """Share of letters and spaces among the non-newline characters of ``text`` (prose ≈ 0.95, code ≈ 0.6-0.8)."""
    chars = text.replace("\n", "")
    if not chars:
        return 0.0
    return sum(c.isalpha() or c == " " for c in chars) / len(chars)


def looks_like_code(line: str) -> bool:
    """A line that starts a statement, defines grammar (``::=``) or is mostly symbols."""
    s = line.strip()
    if not s:
        return False
    if _CODE_START.match(s) or "::=" in s or s.endswith(("{", "}", ";")):
        return True
    return letter_share(s) < 0.6


def _role_text(match: re.Match) -> str:
    text = match.group(1)
    target = _ROLE_TARGET.match(text)
    if target and target.group(1):
        text = target.group(1)
    return text.lstrip("~!")


def _block_end(lines: list[str], start: int, base: int) -> int:
    """Index after the block of lines from ``start`` indented deeper than ``base`` (blank lines inside it count)."""
    i = start
    while i < len(lines) and (not lines[i].strip() or indent_of(lines[i]) > base):
        i += 1
    while i > start and not lines[i - 1].strip():  # trailing blank lines belong to what follows
        i -= 1
    return i


def docstring_prose(text: str) -> str:
    """The prose of a docstring (already dedented, as ``ast.get_docstring`` gives it) or of a documentation page."""
    lines = text.expandtabs(8).splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        s = line.strip()
        base = indent_of(line)
        if _FENCE.match(line):  # fenced code: to the closing fence
            j = i + 1
            while j < len(lines) and not _FENCE.match(lines[j]):
                j += 1
            i = j + 1
            continue
        if s.startswith(">>>"):  # a doctest example: its statements and output, to the next blank line
            while i < len(lines) and lines[i].strip():
                i += 1
            continue
        directive = _DIRECTIVE.match(line)
        if directive:
            name, argument = directive.group(1).lower(), directive.group(2).strip()
            end = _block_end(lines, i + 1, base)
            if name in _PROSE_DIRECTIVES:
                body = [b[base:] if indent_of(b) >= base else b for b in lines[i + 1 : end]]
                label = name.capitalize() if name not in ("rubric", "topic", "admonition") else ""
                head = (f"{label}: {argument}" if label else argument).strip().rstrip(":")
                out.extend(([head] if head else []) + [b.strip() for b in body])
            i = end
            continue
        if _COMMENT.match(line):
            i = _block_end(lines, i + 1, base)
            continue
        if _RULE.match(line):
            i += 1
            continue
        out.append(line)
        i += 1
        nxt = i
        while nxt < len(lines) and not lines[nxt].strip():
            nxt += 1
        if nxt < len(lines) and indent_of(lines[nxt]) > base and s.endswith(":"):
            end = _block_end(lines, nxt, base)
            block = lines[nxt:end]
            if s.endswith("::"):  # a literal block follows: "Example::" reads "Example:"
                out[-1] = line[:-1] if len(s) > 2 else ""
                i = end
            elif any(looks_like_code(b) for b in block):
                i = end
    prose = "\n".join(_ROLE.sub(_role_text, x) for x in out)
    return re.sub(r"\n{3,}", "\n\n", prose).strip()


def prose_paragraphs(text: str, *, min_letter_share: float = 0.8) -> tuple[list[str], int]:
    """``(paragraphs, dropped_chars)``: the blank-line separated paragraphs of ``text`` without their code-like lines,
    keeping those that are mostly letters and spaces (so a leftover table or formula goes)."""
    kept, dropped = [], 0
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line.rstrip() for line in paragraph.splitlines() if line.strip()]
        prose = [line for line in lines if not looks_like_code(line)]
        dropped += sum(len(line) for line in lines if looks_like_code(line))
        body = "\n".join(prose)
        if not body or letter_share(body) < min_letter_share or not re.search(r"[A-Za-z]{3}", body):
            dropped += len(body)
            continue
        kept.append(body)
    return kept, dropped


class _HTMLText(html.parser.HTMLParser):
    """Text of an HTML fragment: one line per paragraph, list item or heading; ``<pre>`` (code) dropped."""

    BLOCKS = {"p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "note",
              "important", "table", "tr", "fullname", "examples", "title", "section"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.current: list[str] = []
        self.skip = 0

    def _flush(self) -> None:
        text = " ".join("".join(self.current).split())
        if text:
            self.lines.append(text)
        self.current = []

    def handle_starttag(self, tag, attrs):
        if tag in ("pre", "script", "style"):
            self.skip += 1
        elif tag in self.BLOCKS:
            self._flush()
            if tag == "li":
                self.current.append("- ")

    def handle_endtag(self, tag):
        if tag in ("pre", "script", "style"):
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCKS:
            self._flush()

    def handle_data(self, data):
        if not self.skip:
            self.current.append(data)


def html_prose(fragment: str) -> str:
    """Paragraphs of an HTML fragment separated by blank lines (list items stay one line each, ``- item``)."""
    parser = _HTMLText()
    parser.feed(fragment)
    parser.close()
    parser._flush()
    paragraphs: list[str] = []
    for line in parser.lines:
        if line.startswith("- ") and paragraphs and paragraphs[-1].startswith("- "):
            paragraphs[-1] += "\n" + line
        else:
            paragraphs.append(line)
    return "\n\n".join(p for p in paragraphs if p.strip("- "))
