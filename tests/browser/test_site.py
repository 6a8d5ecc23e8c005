"""The course's website (``make site``) as a reader meets it, in a real browser, with no network.

Serves ``build/site/`` on 127.0.0.1 and drives Debian's Chromium headless with Playwright, as
``test_lab.py`` does. Every request to another host is blocked and recorded, so a page that needed the
network (a font service, a CDN script) fails here. Checked: every page loads with its title, every image on
every page has loaded, no internal link or ``#anchor`` is broken, searching "GradScaler" (or 损失缩放) lists
the mixed-precision lesson first, and Chinese terms are drawn with a CJK font (asked of Chromium's own font
matching, per text node). Screenshots go to ``runs/test-browser/`` for a person to look at.

Not part of ``make test``: ``make test-browser`` builds the site first, then runs this.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urldefrag, urlsplit

import nbformat
import pytest

from tools.site import COURSE_ZIP, SITE, lessons
from utils.paths import NOTEBOOKS_DIR, REPO_ROOT

CHROMIUM = os.environ.get("TORCH_COURSE_CHROMIUM", "/usr/bin/chromium")
OUT = REPO_ROOT / "runs" / "test-browser"
SITE_NAME = "torch-course"
SIMPLIFIED_CHINESE_FONT = re.compile(r"CJK SC|Hans|PingFang SC|YaHei|SimSun|SimHei|Noto Sans SC|Source Han Sans SC")
"""Font families that draw Simplified Chinese: Noto Sans CJK SC (Debian's fonts-noto-cjk), macOS's and Windows'
own. Not Noto Sans CJK JP, which a browser picks for Chinese in English text unless the text is marked Chinese."""
HAN = re.compile(r"[\u3400-\u9fff]")

playwright = pytest.importorskip(
    "playwright.sync_api", reason="make test-browser installs it (requirements-browser.txt)"
)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site():
    """The built site served on 127.0.0.1: its base URL."""
    if not (SITE / "index.html").exists():
        pytest.fail(f"{SITE.relative_to(REPO_ROOT)}/index.html is missing: run `make site` (make test-browser does)")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not found: run `make test-browser`, which installs Debian's chromium")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser(site):
    OUT.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(site, browser):
    """A fresh page, 1280 x 900, on which every request that leaves 127.0.0.1 is blocked and recorded, and so is
    every answer of the local server that is an error (a missing script, font or image)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.outside = []  # requests the site made to other hosts

    def only_local(route):
        url = route.request.url
        if url.startswith(site) or url.startswith(("data:", "blob:", "about:")):
            route.continue_()
        else:
            page.outside.append(url)
            route.abort()

    page.route("**/*", only_local)
    page.missing = []  # the site's own files a page asked for and did not get
    page.on("response", lambda r: r.status >= 400 and page.missing.append(f"{r.status} {r.url}"))
    yield page
    context.close()


def _pages() -> list[str]:
    return sorted(p.name for p in SITE.glob("*.html"))


def test_the_site_has_the_expected_pages():
    names = _pages()
    expected = {"index.html", "glossary.html", "run_locally.html"} | {p.with_suffix(".html").name for p in lessons()}
    assert set(names) == expected, sorted(set(names) ^ expected)
    assert sorted(p.name for p in (SITE / "downloads").glob("*.ipynb")) == [p.name for p in lessons()]
    with zipfile.ZipFile(SITE / "downloads" / COURSE_ZIP) as z:
        names = set(z.namelist())
    assert {
        "torch-course/Makefile",
        "torch-course/utils/__init__.py",
        "torch-course/notebooks/07_mixed_precision.ipynb",
    } <= names
    assert not [n for n in names if n.startswith("torch-course/solutions/")]


def test_no_page_refers_to_another_host_or_to_the_server_root():
    """Nothing a page loads comes from elsewhere, and every path is relative (the site may live in a folder)."""
    elsewhere = re.compile(r"""(?:\ssrc=|<link\b[^>]*\shref=|\bimport\(|url\()["']?(?:https?:|//)[^"')\s>]*""")
    root = re.compile(r"""\s(?:href|src)=["']?/(?!/)[^"'\s>]*""")
    found = {}
    for name in _pages():
        html = (SITE / name).read_text(encoding="utf-8")
        if bad := sorted({m[0] for m in elsewhere.finditer(html)} | {m[0] for m in root.finditer(html)}):
            found[name] = bad[:3]
    assert not found


def test_every_page_loads_with_its_title_its_images_and_unbroken_links(site, page):
    """Visits every page; then checks each internal link (page, file or #anchor) against what was seen."""
    ids: dict[str, set[str]] = {}  # page path -> the ids on it
    links: dict[str, set[str]] = {}  # link -> the pages that have it
    images = 0
    for name in _pages():
        response = page.goto(f"{site}/{name}", wait_until="networkidle")  # MathJax loads its fonts after "load"
        assert response.status == 200, name
        heading = page.locator("article h1").first.inner_text().replace("¶", "").strip()
        expected = SITE_NAME if name == "index.html" else f"{heading} - {SITE_NAME}"
        assert heading and page.title() == expected, (name, page.title(), heading)
        # every <img>, decoded (figures are data: URLs, the rest files): its natural width is its pixels
        sizes = page.evaluate(
            """() => Promise.all([...document.images].map(i => i.decode().then(
                   () => [i.currentSrc.slice(0, 80), i.naturalWidth], () => [i.currentSrc.slice(0, 80), 0])))"""
        )
        assert all(width > 0 for _, width in sizes), (name, [src for src, w in sizes if w == 0])
        if (notebook := NOTEBOOKS_DIR / name.replace(".html", ".ipynb")).exists():  # each figure of the lesson
            figures = sum(
                "image/png" in o.get("data", {}) for c in nbformat.read(notebook, 4).cells for o in c.get("outputs", [])
            )
            shown = page.locator("article img[src^='data:image/png']").count()
            assert shown == figures, f"{name}: {shown} figures shown, the notebook has {figures}"
        images += len(sizes)
        ids[urlsplit(page.url).path] = set(page.evaluate("() => [...document.querySelectorAll('[id]')].map(e => e.id)"))
        for href in page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)"):
            if href.startswith(site):
                links.setdefault(href, set()).add(name)
    assert not page.outside, f"requests to other hosts: {sorted(set(page.outside))[:5]}"
    assert not page.missing, f"files the pages asked for and did not get: {sorted(set(page.missing))[:5]}"
    assert images >= 12, f"only {images} images on the whole site: the lessons' figures are missing"

    broken = []
    for link, where in sorted(links.items()):
        url, fragment = urldefrag(link)
        path = urlsplit(url).path or "/"
        path = "/index.html" if path == "/" else path
        if path in ids:
            if fragment and fragment not in ids[path]:
                broken.append(f"{link} (no id {fragment!r}) on {sorted(where)}")
        elif page.request.get(url).status != 200:
            broken.append(f"{link} on {sorted(where)}")
    assert not broken, "\n".join(broken[:20])
    print(f"{len(ids)} pages, {images} images, {len(links)} internal links checked")


@pytest.mark.parametrize("query", ["GradScaler", "损失缩放"])  # and in Chinese: loss scaling
def test_searching_lists_the_mixed_precision_lesson_first(site, page, query):
    page.goto(f"{site}/index.html")
    box = page.locator("input.md-search__input")
    box.fill(query)  # as typed into the search box at the top (an IME commits Chinese text the same way) ...
    box.press("End")  # ... then a key: Material searches on key events, which fill() alone does not send
    results = page.locator(".md-search-result__item > a")
    results.first.wait_for()
    hrefs = [a.get_attribute("href") for a in results.all()]
    if query == "GradScaler":
        page.screenshot(path=str(OUT / "site-search.png"))
    assert urlsplit(hrefs[0]).path == "/07_mixed_precision.html", hrefs
    assert not page.outside, page.outside


def _fonts_of(page, selector: str) -> tuple[str, list[dict]]:
    """The text of the first element matching ``selector`` and the fonts Chromium drew it with."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    assert node, f"nothing matches {selector!r}"
    return page.locator(selector).first.inner_text(), cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]


@pytest.mark.parametrize(
    "name, selector",
    [
        ("glossary.html", "article table tbody tr:nth-child(1) td:nth-child(2)"),
        ("07_mixed_precision.html", "article h1"),
    ],
)
def test_chinese_terms_are_drawn_with_a_cjk_font(site, page, name, selector):
    page.goto(f"{site}/{name}", wait_until="load")
    text, fonts = _fonts_of(page, selector)
    han = len(HAN.findall(text))
    assert han, f"{name}: no Chinese in {text!r}"
    # the Chinese is marked as Chinese, and every Chinese glyph comes from a Simplified Chinese font (not from a
    # Japanese one, nor a missing-glyph box of a Latin font)
    langs = page.evaluate(
        "s => [...document.querySelector(s).querySelectorAll('span[lang]')].map(e => e.lang)", selector
    )
    assert langs and set(langs) == {"zh-Hans"}, langs
    chinese = [f for f in fonts if SIMPLIFIED_CHINESE_FONT.search(f["familyName"])]
    assert sum(f["glyphCount"] for f in chinese) >= han, (text, fonts)
    page.screenshot(path=str(OUT / f"site-{name.removesuffix('.html')}.png"))
    print(f"{name}: {text[:40]!r} drawn with {[(f['familyName'], f['glyphCount']) for f in fonts]}")


@pytest.mark.parametrize("width", [1280, 390])  # a desktop and a phone
def test_no_code_line_is_cut_off_and_the_page_fits(site, browser, width):
    """Code wraps (the lessons' code is 120 columns wide, the page's column is not): no code block scrolls or clips,
    and on a phone the page itself does not scroll sideways. Screenshots of the landing page and a lesson, in the
    light and the dark scheme, go to runs/test-browser/."""
    context = browser.new_context(viewport={"width": width, "height": 900 if width > 600 else 844})
    page = context.new_page()
    try:
        for name in ("index.html", "04_mnist_cnn.html"):
            page.goto(f"{site}/{name}", wait_until="load")
            clipped = page.evaluate(
                """() => [...document.querySelectorAll('article pre')]
                     .filter(p => p.scrollWidth > p.clientWidth + 1).map(p => p.textContent.slice(0, 60))"""
            )
            assert clipped == [], f"{name} at {width} px: {len(clipped)} code blocks cut off, e.g. {clipped[:2]}"
            overflow = page.evaluate("() => document.scrollingElement.scrollWidth")
            assert overflow <= width, f"{name} at {width} px: the page is {overflow} px wide"
            stem = f"site-{name.removesuffix('.html')}-{width}px"
            page.screenshot(path=str(OUT / f"{stem}.png"))
            page.locator("form[data-md-component=palette] label:visible").first.click()  # the dark scheme
            assert page.evaluate("() => document.body.dataset.mdColorScheme") == "slate"
            page.screenshot(path=str(OUT / f"{stem}-dark.png"))
            page.locator("form[data-md-component=palette] label:visible").first.click()  # and back
    finally:
        context.close()


def test_the_landing_page_starts_a_learner_on_lesson_01(site, page):
    page.goto(f"{site}/index.html", wait_until="load")
    start = page.locator("a.md-button--primary")
    assert (
        start.inner_text().startswith("Start with 01")
        and start.get_attribute("href") == lessons()[0].with_suffix(".html").name
    )
    figure = page.locator("figure.landing-figure img")
    assert figure.evaluate("i => i.decode().then(() => i.naturalWidth)") > 0


def test_opened_from_files_the_site_says_how_to_search(browser):
    """A browser runs no search worker for file:// pages, so Material shows no search: a note says what to do."""
    page = browser.new_page()
    try:
        page.goto((SITE / "index.html").as_uri(), wait_until="load")
        note = page.locator(".file-search-note")
        assert note.is_visible() and "python -m http.server" in note.inner_text()
        page.screenshot(path=str(OUT / "site-opened-from-files.png"))
    finally:
        page.close()
