"""Sphinx extension: every formula becomes MathML when the site is built (no JavaScript, no network).

    extensions = ["mathml"]          # docs/conf.py; html_math_renderer = "mathml"

MyST's `dollarmath` turns `$...$` and `$$...$$` in the lessons into Sphinx
math nodes; this renderer writes each one as a `<math>` element converted by
latex2mathml (pure Python, from PyPI). Browsers render MathML Core natively
(Chromium since 109, Firefox, Safari), so a page read offline, from a file,
shows its formulas with nothing loaded. A formula latex2mathml cannot convert
fails the build and names the page and the LaTeX.
"""

from __future__ import annotations

import html

from docutils import nodes
from latex2mathml.converter import convert
from sphinx.errors import ExtensionError


def _mathml(self, latex: str, display: str) -> str:
    try:
        out = convert(latex, display=display)
    except Exception as exc:  # latex2mathml raises its own exception types
        where = self.builder.current_docname if hasattr(self.builder, "current_docname") else "?"
        raise ExtensionError(f"{where}: cannot convert the formula {latex!r} to MathML: {exc}") from exc
    # the LaTeX travels along (alttext): screen readers and the page's text get the source
    return out.replace("<math ", f'<math alttext="{html.escape(latex, quote=True)}" ', 1)


def visit_math(self, node):
    self.body.append(f'<span class="math notranslate">{_mathml(self, node.astext(), "inline")}</span>')
    raise nodes.SkipNode


def visit_displaymath(self, node):
    latex = node["latex"] if "latex" in node else node.astext()
    self.body.append(self.starttag(node, "div", CLASS="math notranslate math-display"))
    self.body.append(_mathml(self, latex, "block"))
    self.body.append("</div>\n")
    raise nodes.SkipNode


def setup(app):
    app.add_html_math_renderer("mathml", inline_renderers=(visit_math, None),
                               block_renderers=(visit_displaymath, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
