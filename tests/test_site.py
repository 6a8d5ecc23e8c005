"""The website's pages as ``make site`` stages them (tools/site.py) and its MkDocs hooks (tools/site_hooks.py).

Runs in ``make test`` without MkDocs: the pages are staged without MathJax and not built. The built site is
checked in a browser by ``tests/browser/test_site.py`` (``make test-browser``).
"""

from __future__ import annotations

import re
import zipfile

import nbformat
import pytest
import yaml

from tools import site, site_hooks
from tools.site_hooks import mark_chinese, toc_tokens
from utils.paths import REPO_ROOT
from utils.syllabus import lessons


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    dest = tmp_path_factory.mktemp("site-src")
    return dest, site.stage(dest, mathjax=False)


@pytest.mark.parametrize(
    "markdown, term",
    [
        ("a **leaf tensor** (叶子节点); a tensor", ("leaf tensor", "叶子节点")),
        ("a **leaf tensor (叶子节点)**; a tensor", ("leaf tensor", "叶子节点")),
        ("an **exponent** (指数; how big: the range)", ("exponent", "指数")),
        ("the **rank** (秩, its number)", ("rank", "秩")),
        ("a **`GradScaler`** (梯度缩放器)", ("`GradScaler`", "梯度缩放器")),
    ],
)
def test_a_key_term_is_bold_english_with_its_chinese_beside_it(markdown, term):
    m = site.KEY_TERM.search(markdown)
    assert ((m["en1"] or m["en2"]).strip(), site.chinese(m["zh1"] or m["zh2"])) == term


@pytest.mark.parametrize(
    "markdown",
    ["the chain rule (链式法则)", "**bold** then (链式法则)", "## 4. Heading (梯度累加)", "*leaf tensor* (叶子节点)"],
)
def test_text_that_is_not_the_convention_is_not_collected(markdown):
    assert site.KEY_TERM.search(markdown) is None


def test_the_glossary_names_each_key_term_once_with_a_link_to_its_anchor(staged):
    dest, terms = staged
    assert len(terms) >= 100, f"only {len(terms)} key terms collected: are the lessons' terms bold?"
    pages = {p.name: nbformat.read(dest / p.name, as_version=4) for p in site.lessons()}
    anchors = {
        name: re.findall(r'<a id="(term-[^"]+)" class="key-term">', "".join(c.source for c in nb.cells))
        for name, nb in pages.items()
    }
    glossary = (dest / "glossary.md").read_text(encoding="utf-8")
    links = re.findall(r'\]\((\d\d_\w+\.ipynb)#(term-[\w-]+) "\d\d · [^"]+"\)', glossary)
    assert len(links) == sum(len(uses) for uses in terms.values())
    for lesson, anchor in links:  # each link's anchor is on its lesson's page, once
        assert anchors[lesson].count(anchor) == 1, (lesson, anchor)
    assert sorted((n, a) for n, found in anchors.items() for a in found) == sorted(links)
    for zh, uses in terms.items():
        english = uses[0].en
        assert len(english.split()) <= 5 and not english.endswith((".", ":")), f"{zh}: {english!r} is no term name"
    rows = [line for line in glossary.splitlines() if re.match(r"\| .+ \| .+ \| \[", line)]
    assert len(rows) == len(terms)


def test_the_landing_page_is_the_syllabus_and_each_lesson_links_its_download_and_times(staged):
    dest, _ = staged
    index = (dest / "index.md").read_text(encoding="utf-8")
    lessons = site.lessons()
    assert re.findall(r"\| \d\d \| \[[^]]+\]\((\d\d_\w+\.ipynb)\)", index) == [p.name for p in lessons]
    for path in lessons:
        assert (dest / "downloads" / path.name).read_bytes() == site.committed(path)  # the notebook as committed
        page = nbformat.read(dest / path.name, as_version=4)
        assert page.cells[0].source == site.read_lesson(path).cells[0].source.partition("\n")[0]
        assert f'href="downloads/{path.name}"' in page.cells[1].source
        assert re.search(r"Study time about \d+ min; its cells ran in \d+ s on a 2-core CPU", page.cells[1].source)
        markdown = "".join(c.source for c in page.cells if c.cell_type == "markdown")
        assert not re.search(r"\]\([^)]*\.ipynb", markdown), f"{path.name}: a link to a notebook, not to its page"


def test_run_locally_links_nothing_the_site_lacks(staged):
    dest, _ = staged
    text = (dest / "run_locally.md").read_text(encoding="utf-8")
    assert "make lab" in text and "make test" in text and "make progress" in text
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        assert re.match(r"https?://|\d\d_\w+\.ipynb$|downloads/torch-course\.zip$", target), target


@pytest.mark.skipif(not (REPO_ROOT / "solutions").is_dir(), reason="no solutions/ in this copy of the course")
def test_the_lessons_publish_no_solution():
    """No code cell of a published lesson holds a reference solution of solutions/ (they must stay stubs)."""
    code = "\n".join(c.source for p in site.lessons() for c in site.read_lesson(p).cells if c.cell_type == "code")
    solutions = [
        block.strip()
        for f in (REPO_ROOT / "solutions" / f"{x.stem}.md" for x in lessons())
        for block in re.findall(r"```python solution\n(.*?)```", f.read_text(encoding="utf-8"), re.S)
    ]
    assert len(solutions) >= 36
    assert not [s for s in solutions if s in code]


def test_mkdocs_yml_builds_what_tools_site_stages():
    config = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8").replace("!!python", "#"))
    assert REPO_ROOT / config["docs_dir"] == site.STAGE and REPO_ROOT / config["site_dir"] == site.SITE
    assert "nav" not in config  # made from course.toml by the hooks:
    nav = site_hooks.on_config({"nav": None})["nav"]
    assert nav[1]["Lessons"] == [x.ipynb for x in lessons()]  # the lessons, in order
    assert nav[0] == {"Home": "index.md"} and nav[2:] == ["glossary.md", "run_locally.md"]
    jupyter = next(p["mkdocs-jupyter"] for p in config["plugins"] if isinstance(p, dict) and "mkdocs-jupyter" in p)
    assert jupyter["execute"] is False  # the stored outputs, never re-run
    mathjax = jupyter["custom_mathjax_url"]
    assert mathjax.startswith("assets/mathjax/") and mathjax.endswith(",local/course")


def test_the_contents_come_from_the_headings_on_the_page_code_included():
    html = (
        '<h1 id="04-mnist">04 · MNIST<a class="anchor-link" href="#04-mnist">¶</a></h1><p>x</p>'
        '<h2 id="2-a-dataset">2. A <code>Dataset</code> of your own'
        '<a class="anchor-link" href="#2-a-dataset">¶</a></h2>'
        '<h3 id="deep">not listed</h3><h2 id="setup">Setup</h2>'
    )
    (title,) = toc_tokens(html)
    assert (title["id"], title["name"]) == ("04-mnist", "04 · MNIST")
    assert [(t["id"], t["name"]) for t in title["children"]] == [
        ("2-a-dataset", "2. A Dataset of your own"),
        ("setup", "Setup"),
    ]


def test_chinese_text_is_marked_as_chinese_outside_tags_and_raw_text():
    html = '<title>07 (混合精度)</title><p title="a > 中文">a (叶子节点，见) b</p><script>s = "中文"</script>后'
    assert mark_chinese(html) == (
        '<title>07 (混合精度)</title><p title="a > 中文">a (<span lang="zh-Hans">叶子节点，见</span>) b</p>'
        '<script>s = "中文"</script><span lang="zh-Hans">后</span>'
    )
    svg = "<svg><text>中文</text></svg><math><mi>中</mi></math>"
    assert mark_chinese(svg) == svg


def test_the_site_publishes_the_last_commit_not_the_working_copy(tmp_path):
    """A teacher who tried the exercises in the clone they publish from hands out no answers: the pages, the
    notebooks and the course's zip are the committed ones."""
    if not site._git("rev-parse", "--verify", "--quiet", "HEAD"):
        pytest.skip("not a git checkout")
    path = REPO_ROOT / "LICENSE-CONTENT.md"  # a committed file that no other test reads while this one runs
    before = path.read_bytes()
    try:
        path.write_bytes(before + b"\nmy answer\n")  # as an exercise answered and saved in a lesson
        assert site.committed(path) == before and "LICENSE-CONTENT.md" in site.uncommitted()
        site.write_course_zip(tmp_path / "course.zip")
        with zipfile.ZipFile(tmp_path / "course.zip") as z:
            assert z.read("torch-course/LICENSE-CONTENT.md") == before
            assert z.getinfo("torch-course/.ci/run").external_attr >> 16 == 0o755
    finally:
        path.write_bytes(before)
