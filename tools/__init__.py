"""Course tooling: what makes, checks and measures the course, not what a lesson imports.
Used by notebook 05 only, which imports :mod:`tools.translation_corpus` to show the corpus generator's grammar.

* :mod:`tools.course` -- the venv, ``make lab``, ``make test`` and ``make lock``, also without make
  (``python tools/course.py``);
* :mod:`tools.notebooks` -- ``make execute``, ``make check``, ``make test-learner`` and the test session's
  notebook environment (``conftest.py``);
* :mod:`tools.lab` -- ``make lab``: JupyterLab on ``notebooks/``, opened on its start page (which it writes);
* :mod:`tools.lesson_code` -- runs a notebook's shared cells for ``tests/`` and ``benchmarks/``;
* :mod:`tools.translation_corpus` -- generates notebook 05's corpus (``python -m tools.translation_corpus``).
"""
