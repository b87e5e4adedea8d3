"""The course website in a real browser, offline: the home page, a lesson's formulas, the search.

    .venv/bin/python -m pytest -q -s tests/test_site_browser.py      # screenshots: build/screenshots/site_*.png

Part of the browser test of the student's first hour (tests/test_browser.py,
whose Chromium, flags and skip rule it uses): Debian's Chromium opens the
built site from its files (file://, as a student opens it offline) with
every request to another host refused, and finds:

1. the home page (the course overview) with its lessons in the navigation;
2. a lesson whose formulas are rendered: MathML laid out by the browser (a
   fraction's numerator above its denominator), no `$` left in the text;
3. the search answering from its offline index;
4. the Chinese site (issue 24): its home page, the language switch taking a
   reader from a lesson to the same lesson in the other language and back,
   and the search answering a Chinese word from the Chinese index;
5. the course's own terms found by the Chinese search as a reader types them
   (issue 30): the eight the review searched for in vain, through the search
   page itself, and every term of zh/GLOSSARY.md through the page's own search
   code (Sphinx's `Search`, with the course's query splitter); and the theme's
   words ("On this page", "Back to top") in Chinese on a Chinese page.

The site is the one tests/test_site.py builds (once per session).
"""

from __future__ import annotations

import os

import pytest

from course import ROOT
from test_browser import CHROMIUM, CHROMIUM_ARGS, SHOTS, pytestmark, sync_playwright  # noqa: F401
from test_site import built_site

from docs.zh_search import glossary_terms  # noqa: E402  (test_site puts the course root on sys.path)

# numerator and denominator boxes of the first few fractions, and what the page shows as text
_MATH_JS = """() => {
  const fracs = [...document.querySelectorAll('math mfrac')].slice(0, 12).map(f => {
    const [num, den] = [f.children[0].getBoundingClientRect(), f.children[1].getBoundingClientRect()];
    return {numBottom: num.bottom, denTop: den.top, width: f.getBoundingClientRect().width};
  });
  const maths = [...document.querySelectorAll('math')].map(m => m.getBoundingClientRect());
  return {count: maths.length, visible: maths.filter(r => r.width > 0 && r.height > 0).length, fracs: fracs,
          text: document.querySelector('article').innerText};
}"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return built_site(tmp_path_factory)


@pytest.fixture(scope="module")
def page():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        remote = []

        def refuse(route):
            remote.append(route.request.url)
            route.abort()
        context.route(lambda url: not url.startswith(("file:", "data:", "about:")), refuse)
        pg = context.new_page()
        pg.remote_requests = remote
        yield pg
        browser.close()


def _url(site, rel: str) -> str:
    return "file://" + os.path.join(site["out"], rel)


def test_the_home_page_is_the_course_overview(site, page):
    page.goto(_url(site, "index.html"))
    assert "course overview" in page.locator("h1").first.inner_text()
    nav = page.locator(".sidebar-tree").inner_text()
    for lesson in ("01 · Data parallelism", "03 · Pipeline parallelism", "06 · The capstone"):
        assert lesson in nav, nav[:500]
    os.makedirs(SHOTS, exist_ok=True)
    shot = os.path.join(SHOTS, "site_home.png")
    page.screenshot(path=shot)
    print(f"\nscreenshot: {os.path.relpath(shot, ROOT)}")
    assert not page.remote_requests, f"the page asked the network for {page.remote_requests}"


@pytest.mark.parametrize("lesson,least", [("assignments/01_data_parallel/README.html", 20),
                                          ("assignments/03_pipeline_parallel/01_schedules_as_data.html", 3)])
def test_a_lesson_shows_its_formulas_rendered(site, page, lesson, least):
    page.goto(_url(site, lesson))
    state = page.evaluate(_MATH_JS)
    assert state["count"] >= least and state["visible"] == state["count"], state["count"]
    assert state["fracs"], "no fraction on the page"
    for f in state["fracs"]:
        # laid out as a fraction: the numerator sits above the denominator, and the fraction has a width
        assert f["numBottom"] <= f["denTop"] + 1 and f["width"] > 0, f
    assert "\\frac" not in state["text"] and "$" not in state["text"], "raw LaTeX is visible"
    page.locator("math mfrac").first.scroll_into_view_if_needed()
    shot = os.path.join(SHOTS, "site_" + os.path.basename(os.path.dirname(lesson)) + ".png")
    page.screenshot(path=shot)
    assert not page.remote_requests, f"the page asked the network for {page.remote_requests}"


def test_the_search_answers_offline(site, page):
    page.goto(_url(site, "search.html") + "?q=reduce-scatter")
    results = page.locator("#search-results ul.search li")
    results.first.wait_for(timeout=20_000)
    # Sphinx's search lists its results one by one: wait for the fifth (the lessons and exercises that
    # name reduce-scatter are many more), failing after 20 s
    page.wait_for_function("document.querySelectorAll('#search-results ul.search li').length >= 5",
                           timeout=20_000)
    assert results.count() >= 5
    assert not page.remote_requests, f"the page asked the network for {page.remote_requests}"



def test_the_language_switch_opens_the_same_page_in_the_other_language(site, page):
    lesson = "assignments/02_tensor_parallel/01_mappings.html"
    page.goto(_url(site, lesson))
    english_title = page.locator("h1").first.inner_text()
    switch = page.locator("nav.lang-switch")
    assert switch.is_visible() and "中文" in switch.inner_text()
    switch.locator("a.lang-other").click()
    page.wait_for_load_state()
    assert page.url.endswith("/zh/" + lesson), page.url
    title = page.locator("h1").first.inner_text()
    assert any("\u4e00" <= ch <= "\u9fff" for ch in title) and title != english_title, title
    assert page.locator("nav.lang-switch .lang-current").inner_text() == "中文"
    shot = os.path.join(SHOTS, "site_zh_lesson.png")
    page.screenshot(path=shot)
    page.locator("nav.lang-switch a.lang-other").click()
    page.wait_for_load_state()
    assert page.url.endswith("/" + lesson) and "/zh/" not in page.url, page.url
    assert page.locator("h1").first.inner_text() == english_title
    assert not page.remote_requests, f"the page asked the network for {page.remote_requests}"


def test_the_chinese_site_searches_chinese_words_offline(site, page):
    page.goto(_url(site, "zh/index.html"))
    assert "课程总览" in page.locator("h1").first.inner_text()
    nav = page.locator(".sidebar-tree").inner_text()
    assert "01 · 数据并行" in nav and "03 · 流水线并行" in nav, nav[:500]
    page.goto(_url(site, "zh/search.html") + "?q=流水线")
    page.wait_for_function("document.querySelectorAll('#search-results ul.search li').length >= 5",
                           timeout=20_000)
    results = page.locator("#search-results ul.search li")
    titles = " ".join(results.nth(i).inner_text() for i in range(min(results.count(), 10)))
    assert "流水线" in titles, titles
    shot = os.path.join(SHOTS, "site_zh_search.png")
    page.screenshot(path=shot)
    print(f"\nscreenshots: {os.path.relpath(shot, ROOT)}, build/screenshots/site_zh_lesson.png")
    assert not page.remote_requests, f"the page asked the network for {page.remote_requests}"


# what the review typed into the Chinese site's search and got nothing for (issue 30)
REVIEW_TERMS = ["数据并行", "张量并行", "流水线并行", "上下文并行", "序列并行", "专家并行", "进程组", "重计算"]

# every term, searched by the page's own code: the results Sphinx would list (its query parser, its search)
_SEARCH_JS = """async (terms) => {
  // (searchtools.js declares `const Search`: a global binding, not a property of window)
  for (let i = 0; i < 200 && !(typeof Search !== "undefined" && Search._index); i++) {
    await new Promise(r => setTimeout(r, 100));
  }
  if (typeof Search === "undefined" || !Search._index) throw new Error("the search index did not load in 20 s");
  return terms.map(t => {
    const [query, words, excluded, highlight, objects] = Search._parseQuery(t);
    return [t, [...words], Search._performSearch(query, words, excluded, highlight, objects).length];
  });
}"""


@pytest.mark.parametrize("term", REVIEW_TERMS)
def test_the_chinese_search_finds_the_courses_terms_as_typed(site, page, term):
    page.goto(_url(site, "zh/search.html") + "?q=" + term)
    page.wait_for_function("document.querySelectorAll('#search-results ul.search li').length >= 3", timeout=20_000)
    results = page.locator("#search-results ul.search li")
    assert results.count() >= 3, (term, results.count())
    # the pages listed first name the term itself (jieba keeps the whole term in the index beside its parts)
    hrefs = [results.nth(i).locator("a").first.get_attribute("href") for i in range(3)]
    for href in hrefs:
        path = os.path.join(site["out"], "zh", href.split("#")[0].split("?")[0])
        text = open(path, encoding="utf-8").read()
        assert term in text, f"search for {term!r} lists {href}, which does not contain it"
    assert not page.remote_requests, f"the page asked the network for {page.remote_requests}"


def test_every_glossary_term_finds_pages_on_the_chinese_site(site, page):
    terms = glossary_terms()
    assert len(terms) >= 80 and set(REVIEW_TERMS) <= set(terms), terms
    page.goto(_url(site, "zh/search.html"))
    found = page.evaluate(_SEARCH_JS, terms + ["流水线 并行", "数据并行的梯度", "TP通信域"])
    nothing = [(t, words) for t, words, n in found if n == 0]
    assert not nothing, f"{len(nothing)} of {len(found)} terms find no page (query -> words): {nothing}"
    assert not page.remote_requests, f"the page asked the network for {page.remote_requests}"


def test_the_themes_words_are_chinese_on_a_chinese_page(site, page):
    page.goto(_url(site, "zh/assignments/01_data_parallel/02_zero.html"))
    # (the theme shows the title in capitals: its text, not its rendering)
    assert page.locator(".toc-title").first.text_content().strip() == "本页内容"
    labels = page.locator(".related-pages").inner_text()
    assert "下一页" in labels and "上一页" in labels and "Next" not in labels, labels
    assert "回到顶部" in page.locator(".back-to-top").inner_text()
    page.goto(_url(site, "assignments/01_data_parallel/02_zero.html"))
    assert page.locator(".toc-title").first.text_content().strip() == "On this page"
