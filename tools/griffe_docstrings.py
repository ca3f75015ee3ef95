"""Griffe extension for the documentation build: reStructuredText idioms in docstrings to Markdown.

The docstrings are Google style with a few reStructuredText roles that read well in the source and
in ``help()``. For mkdocstrings (Markdown) this rewrites, at load time and only for the site:

* an ``Example:`` section header to ``Examples:`` so that griffe renders the doctest as code
  (a singular header is otherwise an admonition whose ``>>>`` lines become Markdown quotes);
* ``.. math::`` blocks to ``$$ ... $$`` and ``:math:`x``` to ``$x$`` (pymdownx.arithmatex);
* ``:class:`~a.b.C``` (and ``:func:``, ``:meth:``, ``:attr:``, ``:data:``, ``:mod:``, ``:exc:``,
  ``:obj:``) to inline code, ``C`` or the full path without ``~``.

Used from mkdocs.yml (``plugins: mkdocstrings: handlers: python: options: extensions``).
"""

from __future__ import annotations

import re
from typing import Any, List

from griffe import Extension, Object

_EXAMPLE_HEADER = re.compile(r"^(\s*)Example:\s*$")
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_XREF_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(~?)([^`]+)`")


def _xref(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def _math_blocks(lines: List[str]) -> List[str]:
    out: List[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() != ".. math::":
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        i += 1
        body: List[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(indent + " ")):
            body.append(lines[i].strip())
            i += 1
        while body and not body[-1]:
            body.pop()
        out.extend([indent + "$$", *(indent + b for b in body if b), indent + "$$", ""])
    return out


def rst_to_markdown(text: str) -> str:
    """Rewrite the reStructuredText idioms of one docstring (see the module docstring).

    Example:
        >>> rst_to_markdown("Uses :math:`x^2` and :class:`~rfgp.RandomFeatureGP`.")
        'Uses $x^2$ and `RandomFeatureGP`.'
    """
    lines = [_EXAMPLE_HEADER.sub(r"\1Examples:", line) for line in text.split("\n")]
    text = "\n".join(_math_blocks(lines))
    text = _MATH_ROLE.sub(lambda m: f"${m.group(1)}$", text)
    return _XREF_ROLE.sub(_xref, text)


class RstToMarkdown(Extension):
    """Rewrites every docstring with :func:`rst_to_markdown` when griffe loads it."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
