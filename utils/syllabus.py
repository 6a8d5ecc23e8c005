"""The course manifest, ``course.toml``: the lessons in order and the course-wide facts.
Used by every notebook: its setup cell imports it to tell whether the notebook runs inside the course
(:mod:`tools.opened_alone`). ``make progress`` (:mod:`utils.exercises.section`) lists the lessons with it; the
course's tooling (``tools/``), its tests and its website read the same list.

    >>> [lesson.stem for lesson in lessons()][:2]
    ['01_tensors', '02_autograd']
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from utils.paths import NOTEBOOKS_DIR, REPO_ROOT, SOURCES_DIR

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

MANIFEST = REPO_ROOT / "course.toml"
KINDS = ("predict", "write", "stretch")
"""What an exercise asks: predict or compute a value, write a piece of PyTorch, combine with an earlier lesson."""


@dataclass(frozen=True)
class Exercise:
    number: int
    kind: str
    title: str


@dataclass(frozen=True)
class Lesson:
    number: int
    slug: str
    title: str
    title_zh: str
    short: str
    study_minutes: int
    teaches: str
    gpu: str
    exercises: tuple[Exercise, ...]
    subtitle: str = ""
    run_note: str = ""

    @property
    def nn(self) -> str:
        """The two-digit number: ``"01"``."""
        return f"{self.number:02d}"

    @property
    def stem(self) -> str:
        """``01_tensors``: the name of the notebook, its source, its solutions and its exercise checks."""
        return f"{self.nn}_{self.slug}"

    @property
    def ipynb(self) -> str:
        return f"{self.stem}.ipynb"

    @property
    def notebook(self) -> Path:
        return NOTEBOOKS_DIR / self.ipynb

    @property
    def source(self) -> Path:
        return SOURCES_DIR / f"{self.stem}.py"

    @property
    def heading(self) -> str:
        """The notebook's title as its first cell writes it (``# `` and an optional ``: subtitle`` follow/precede)."""
        return f"{self.nn} · {self.title} ({self.title_zh})"


@dataclass(frozen=True)
class Course:
    name: str
    pytorch: str
    repository: str
    lessons: tuple[Lesson, ...]


class ManifestError(ValueError):
    """``course.toml`` cannot be read, or says something impossible: the message names the field and the fix."""


def _field(table: dict, key: str, kind: type, where: str, default=None):
    if key not in table:
        if default is not None:
            return default
        raise ManifestError(f"{where}: no {key!r}; add `{key} = ...` (see the comment at the top of course.toml)")
    value = table[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ManifestError(f"{where}: {key} = {value!r} should be a {kind.__name__}")
    if isinstance(value, str) and not value.strip() and default is None:
        raise ManifestError(f"{where}: {key} is empty")
    return value


def parse(text: str, name: str = "course.toml") -> Course:
    """The course described by the TOML ``text`` (the contents of a file called ``name``), checked."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ManifestError(f"{name} is not valid TOML ({err}): fix that line") from None
    head = data.get("course")
    if not isinstance(head, dict):
        raise ManifestError(f"{name}: no [course] table")
    where = f"{name} [course]"
    pytorch = _field(head, "pytorch", str, where)
    if not re.fullmatch(r"\d+\.\d+", pytorch):
        raise ManifestError(f"{where}: pytorch = {pytorch!r} should be a minor version such as '2.9'")
    tables = data.get("lessons")
    if not isinstance(tables, list) or not tables:
        raise ManifestError(f"{name}: no [[lessons]]: the course needs at least one lesson")
    lessons = []
    for i, table in enumerate(tables, 1):
        where = f"{name}, lesson {i}"
        number = _field(table, "number", int, where)
        if number != i:
            raise ManifestError(f"{where}: number = {number}, but lessons are numbered 1, 2, ... in order")
        slug = _field(table, "slug", str, where)
        if not re.fullmatch(r"[a-z][a-z0-9_]*", slug):
            raise ManifestError(f"{where}: slug = {slug!r} should be lower-case letters, digits and _")
        exercises = []
        for j, ex in enumerate(table.get("exercises", []), 1):
            kind = _field(ex, "kind", str, f"{where}, exercise {j}")
            if kind not in KINDS:
                raise ManifestError(f"{where}, exercise {j}: kind = {kind!r} is not one of {', '.join(KINDS)}")
            exercises.append(Exercise(j, kind, _field(ex, "title", str, f"{where}, exercise {j}")))
        study = _field(table, "study_minutes", int, where)
        if study <= 0:
            raise ManifestError(f"{where}: study_minutes = {study} should be positive")
        lessons.append(
            Lesson(
                number=number,
                slug=slug,
                title=_field(table, "title", str, where),
                title_zh=_field(table, "title_zh", str, where),
                short=_field(table, "short", str, where),
                study_minutes=study,
                teaches=_field(table, "teaches", str, where),
                gpu=_field(table, "gpu", str, where),
                exercises=tuple(exercises),
                subtitle=_field(table, "subtitle", str, where, default=""),
                run_note=_field(table, "run_note", str, where, default=""),
            )
        )
    return Course(
        name=_field(head, "name", str, f"{name} [course]"),
        pytorch=pytorch,
        repository=_field(head, "repository", str, f"{name} [course]", default="").rstrip("/"),
        lessons=tuple(lessons),
    )


@functools.cache
def course(path: Path = MANIFEST) -> Course:
    """The course of ``course.toml`` (read once per process)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ManifestError(f"cannot read the course manifest {path}: {err.strerror or err}") from None
    return parse(text, Path(path).name)


def lessons() -> tuple[Lesson, ...]:
    """The lessons, in order."""
    return course().lessons


def lesson(name: str | int) -> Lesson:
    """The lesson named by its number (``4``, ``"04"``) or by the start of its stem (``"04_mnist"``)."""
    text = f"{name:02d}" if isinstance(name, int) else str(name)
    found = [x for x in lessons() if x.stem.startswith(text) or x.ipynb == text]
    if len(found) != 1:
        known = ", ".join(x.nn for x in lessons())
        raise LookupError(f"no lesson {name!r} in course.toml: give a number ({known}) or a notebook name")
    return found[0]
