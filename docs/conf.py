"""Sphinx configuration of the course site (`make site`; docs/build_site.py stages the sources first).

The sources Sphinx reads are a staged copy (build/site-src/, the Chinese site's build/site-src-zh/): the course
overview as `index.md`, `assignments/` (lessons with code links and figures
added), `release/` (the student notebooks, never executed) and `exercises/`
(a page per exercise, generated from the notebooks).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

project = "Parallelism for Large-Scale LLM Training"
author = "the course team"
copyright = "the course team"
root_doc = "index"
# the lessons' text as written (no curly quotes): what a student searches for is what the page says
smartquotes = False

extensions = ["myst_nb", "mathml"]

# Markdown: GitHub's dialect as the lessons are written for it, plus $...$ / $$...$$ math (GitHub renders
# the same syntax) and GitHub-style heading slugs, so `README.md#3-the-memory-ledger` resolves here too.
myst_enable_extensions = ["dollarmath"]
myst_dmath_double_inline = True
myst_heading_anchors = 4
myst_links_external_new_tab = False

# Notebooks: rendered as released (task text, worked examples, visible tests), NEVER executed.
nb_execution_mode = "off"
nb_merge_streams = True

html_math_renderer = "mathml"

html_theme = "furo"
# the language switch of every page (docs/_templates/lang-switch.html, in Furo's announcement bar); the Chinese
# build sets course_lang=zh, language=zh_CN (Sphinx's own strings, and its Chinese search: jieba cuts the words)
templates_path = ["_templates"]
# the theme's own words on a Chinese page ("On this page", "Back to top", "Next"...): Furo ships no catalog, so the
# course's (docs/locale/zh_CN/LC_MESSAGES/sphinx.po, copied into the staged sources as _locale/ by build_site.py)
# comes first and Sphinx's own zh_CN catalog after it
locale_dirs = ["_locale"]
gettext_auto_build = True
html_context = {"course_lang": "en"}
html_title = "LLM parallelism course"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "navigation_with_keys": True,
    "top_of_page_buttons": [],
    "announcement": "language",     # the block itself is the switch (docs/_templates/page.html)
}
pygments_style = "default"

suppress_warnings = ["mystnb.unknown_mime_type"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]


def setup(app):
    # The Chinese site's search (language = zh_CN): Sphinx 9.0.4 indexes Chinese words with jieba, but its
    # language_data.js then says `window.Stemmer = ChineseStemmer`, a class that does not exist (the Chinese
    # search stems Latin words with the English stemmer), and every search stops there (sphinx-doc/sphinx#14229,
    # fixed upstream by #14416 after 9.0.4). The same search language, naming the stemmer it ships.
    #
    # The course's terms (issue 30): jieba learns every term of zh/GLOSSARY.md before the pages are indexed, and
    # the search page splits a query the index does not hold as one word into the index's words (zh_search.py).
    from sphinx.search.zh import SearchChinese

    import zh_search

    class SearchChineseEnglishStemmer(SearchChinese):
        language_name = "English"
        js_splitter_code = zh_search.SPLITTER_JS

        def __init__(self, options):
            super().__init__(options)
            zh_search.add_to_jieba()

    app.add_search_language(SearchChineseEnglishStemmer)
