"""Each module of ``utils/`` and ``tools/`` names the notebooks that import it; ``utils/`` holds only what must.

The names are read from the first paragraph of the module's docstring, in one of three forms:
``Used by notebooks 04, 06 and 08.`` (or ``notebook 05``), ``Used by every notebook.``, ``Used by no notebook.``
A ``utils/`` module that fewer than two notebooks use says, in the same paragraph, why it must still be importable:
``Lives in utils/ because ...``. A ``tools/`` module names what runs it instead; it names a notebook only when one
imports it.

A notebook imports a module when its jupytext source (``notebooks/src/NN_topic.py``, including the scripts its
``%%writefile`` cells write) has ``import utils.X``, ``from utils.X import ...``, ``from utils import name`` where
``utils/__init__.py`` re-exports ``name`` from ``utils.X``, or ``Checker("NN")``, which imports
``utils.exercises.nbNN`` by name. Importing ``a.b.c`` imports the packages ``a`` and ``a.b`` too.
"""

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from utils import REPO_ROOT
from utils.syllabus import lessons

NOTEBOOKS = {x.nn: x.source for x in lessons() if x.source.exists()}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in ("utils", "tools") for p in sorted((REPO_ROOT / package).rglob("*.py"))}
UTILS = sorted(m for m in MODULES if m.split(".")[0] == "utils")

USED_BY = re.compile(r"Used by (every notebook|no notebook|notebooks? (\d\d(?:(?:, | and |, and )\d\d)*))")
REASON = "Lives in utils/ because "


def first_paragraph(module: str) -> str:
    docstring = ast.get_docstring(ast.parse(MODULES[module].read_text(encoding="utf-8"))) or ""
    return " ".join(docstring.split("\n\n")[0].split())


def declared_notebooks(module: str) -> set[str] | None:
    """The notebooks the docstring names, or None when it has no "Used by" sentence."""
    found = USED_BY.search(first_paragraph(module))
    if found is None:
        return None
    if found[1] == "every notebook":
        return set(NOTEBOOKS)
    return set(re.findall(r"\d\d", found[2] or ""))


@cache
def reexports() -> dict[str, str]:
    """``{name: module}`` for what ``from utils import name`` gives: eager imports and the lazy ``_LAZY`` table."""
    names = {}
    for node in ast.parse((REPO_ROOT / "utils" / "__init__.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("utils."):
            names.update({alias.asname or alias.name: node.module for alias in node.names})
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY" for t in node.targets):
            names.update(ast.literal_eval(node.value))
    return names


def imported_modules(source: str) -> set[str]:
    """The modules of ``utils/`` and ``tools/`` that running ``source`` imports (see the module docstring)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # kept if it is a submodule
            if node.module == "utils":
                names.update(reexports()[alias.name] for alias in node.names if alias.name in reexports())
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "Checker"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(f"utils.exercises.nb{node.args[0].value}")
    with_packages = {".".join(name.split(".")[:i]) for name in names for i in range(1, name.count(".") + 2)}
    return with_packages & MODULES.keys()


@cache
def importing_notebooks() -> dict[str, set[str]]:
    users: dict[str, set[str]] = {module: set() for module in MODULES}
    for number, path in NOTEBOOKS.items():
        for module in imported_modules(path.read_text(encoding="utf-8")):
            users[module].add(number)
    return users


def test_the_import_scan_sees_each_form_of_import():
    source = (
        "from utils import fmt, plot_curves\nimport utils.launch\nfrom utils.ddp.common import report\n"
        "from tools import translation_corpus as tc\nex = Checker('07')\n"
        "from torch.utils.data import DataLoader\n"
    )
    assert imported_modules(source) == {
        "utils",
        "utils.printing",
        "utils.plotting",
        "utils.launch",
        "utils.ddp",
        "utils.ddp.common",
        "tools",
        "tools.translation_corpus",
        "utils.exercises",
        "utils.exercises.nb07",
    }


@pytest.mark.parametrize("module", UTILS)
def test_each_utils_module_names_its_notebooks(module):
    assert declared_notebooks(module) is not None, (
        f"{MODULES[module].relative_to(REPO_ROOT)}: the first paragraph of its docstring should name the notebooks "
        "that import it, as 'Used by notebooks NN and NN.', 'Used by every notebook.' or 'Used by no notebook.'"
    )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_the_named_notebooks_are_the_ones_that_import_it(module):
    declared, actual = declared_notebooks(module) or set(), importing_notebooks()[module]
    assert declared == actual, (
        f"{MODULES[module].relative_to(REPO_ROOT)}: its docstring names notebooks {sorted(declared)}, but "
        f"{sorted(actual)} import it (named but not importing: {sorted(declared - actual)}; importing but not "
        f"named: {sorted(actual - declared)}); correct its 'Used by ...' sentence"
    )


@pytest.mark.parametrize("module", UTILS)
def test_a_utils_module_fewer_than_two_notebooks_use_says_why_it_is_there(module):
    if len(importing_notebooks()[module]) >= 2:
        return
    paragraph = first_paragraph(module)
    reason = paragraph.partition(REASON)[2].strip()
    assert reason, (
        f"{MODULES[module].relative_to(REPO_ROOT)}: only notebooks {sorted(importing_notebooks()[module])} import "
        f"it, so the first paragraph of its docstring should say '{REASON}...' (a spawn-safe dataset, a torchrun "
        "script's helper, ...), or the code should move into its notebook or tools/"
    )


def test_the_scan_sees_every_notebook_source():
    # guards the tests above: an empty NOTEBOOKS (a moved folder) would make them pass vacuously
    assert sorted(NOTEBOOKS) == [x.nn for x in lessons()] and len(NOTEBOOKS) >= 12, sorted(NOTEBOOKS)
