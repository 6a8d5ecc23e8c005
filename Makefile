# torch-course: `make lab` to learn, `make test` to check. See README.md.
# The venv, lab and test recipes are tools/course.py, which also runs them without make (Windows).
SHELL := /bin/bash
# The course runs on Python 3.10 to 3.14. PYTHONS_FOUND lists those whose interpreter starts (a pyenv
# shim exists for every installed version, active or not, so `command -v` is not enough), newest first.
# `make lab` and `make test` build .venv with the newest; `make PYTHON=python3.10 test` picks another.
PYTHONS_FOUND = $(shell for v in 3.14 3.13 3.12 3.11 3.10; do python$$v -c '' 2>/dev/null && echo $$v; done; true)
PYTHON ?= $(addprefix python,$(firstword $(PYTHONS_FOUND)))
VENV ?= .venv
PY := $(VENV)/bin/python
COURSE = $(or $(PYTHON),$(error none of python3.10 .. python3.14 runs here: install one, or name it: make PYTHON=/path/to/python3.X $(MAKECMDGOALS))) tools/course.py --venv $(VENV)
# Notebooks side by side; JOBS=1 runs one at a time. The default is JOBS in tools/course.py.
JOBS ?=
JOBS_ARG = $(if $(JOBS),--jobs $(JOBS))
NB ?=

.PHONY: help venv lock lab test test-pythons test-portable test-lax test-gpu test-learner test-opened-alone test-browser site progress execute sync check clean distclean
help:
	@echo "make lab       create/refresh .venv and open JupyterLab on the lessons' start page"
	@echo "make test      create/refresh .venv, run unit tests and every notebook under nbval"
	@echo "make execute   re-run notebooks and store fresh outputs (NB=01 for one notebook)"
	@echo "make sync      copy prose edits of the .py sources into the .ipynb, run nothing; regenerate the syllabus pages"
	@echo "make test-pythons  run make test once per Python 3.10-3.14 found, each in its own .venv-3.X"
	@echo "make test-portable  re-run every notebook under other numeric configurations (outputs compared)"
	@echo "make test-lax  asserts only, on the best device (ARM laptops, CUDA, MPS); test-gpu is the same"
	@echo "make test-learner  run every notebook as a learner does: all cores, warnings shown, no comparison"
	@echo "make test-opened-alone  every lesson opened alone in a venv without the course (make test does 01, 04, 08)"
	@echo "make site      build the course's website into build/site/ (offline, from the stored outputs)"
	@echo "make test-browser  make site, then JupyterLab, an exercise and the website in headless Chromium (installs it if missing)"
	@echo "make progress  which exercises pass, per notebook (NB=01 for one notebook)"
	@echo "make lock      regenerate requirements.txt (the exact lock) from pyproject.toml, with uv"
	@echo "make clean     remove generated files (runs, caches); distclean also removes .venv"

# Creates .venv, or reinstalls when requirements.txt changed or the venv drifted from it; the course is
# installed editable, so `import utils` works in every kernel.
venv:
	$(COURSE) venv

lock:
	$(COURSE) lock

lab:
	$(COURSE) lab

# pytest's options (nbval, sanitizer, timeouts, tests/browser left out) are in pyproject.toml.
test:
	$(COURSE) test $(JOBS_ARG)

# The full strict `make test` once per Python found (PYTHONS_FOUND), each in its own .venv-3.X; every
# version runs to the end, then the failed ones are named. Outputs that differ between Python versions
# without being the lesson are normalised in tests/sanitize.cfg.
test-pythons:
	@[ -n "$(PYTHONS_FOUND)" ] || { echo "make test-pythons: none of python3.10 .. python3.14 runs here"; exit 1; }
	@failed=; for v in $(PYTHONS_FOUND); do \
	  echo "== Python $$v: make test in .venv-$$v"; SECONDS=0; \
	  $(MAKE) --no-print-directory test VENV=.venv-$$v PYTHON=python$$v || failed="$$failed $$v"; \
	  echo "== Python $$v: $$SECONDS s"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test-pythons: failed on Python$$failed"; exit 1; fi

# Every compared output must also come out of the narrowest code paths and of two threads
# (PORTABLE_CONFIGS in tools/notebooks.py); two-threads runs one notebook at a time, on both cores.
test-portable:
	TORCH_COURSE_NUMERICS=narrow-isa $(COURSE) test $(JOBS_ARG) notebooks
	TORCH_COURSE_NUMERICS=two-threads $(COURSE) test --jobs 1 notebooks

# Asserts only, outputs not compared, the device left to the notebooks: for machines whose
# floating point differs by design (ARM laptops, CUDA, MPS).
test-lax:
	TORCH_COURSE_GPU=1 $(COURSE) test --jobs 1 -- --nbval-lax notebooks

test-gpu: test-lax

# Each lesson copied alone into an empty folder and run by a venv without the course: its setup cell fetches
# the course from a local clone (tests/test_opened_alone.py); make test runs three of them.
test-opened-alone:
	TORCH_COURSE_OPENED_ALONE=all $(COURSE) test --jobs 1 tests/test_opened_alone.py

test-learner: venv
	$(PY) -m tools.notebooks learner $(NB)

# Debian's Chromium and CJK fonts (the notebooks print Chinese terms), installed when missing; elsewhere
# set TORCH_COURSE_CHROMIUM to a Chromium or Chrome binary. Playwright: the lock with the browser extra.
# The website: pages staged in build/site-src/, then `mkdocs build --strict` (mkdocs.yml) into build/site/.
site:
	$(COURSE) site

BROWSER_DEBS := chromium chromium-driver fonts-noto-cjk
test-browser: site
	@if [ -z "$$TORCH_COURSE_CHROMIUM" ]; then \
	  missing=$$(for p in $(BROWSER_DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    command -v apt-get >/dev/null || { echo "make test-browser: no apt-get to install $$missing;" \
	      "set TORCH_COURSE_CHROMIUM=/path/to/chromium instead"; exit 1; }; \
	    sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); echo "installing Debian packages:" $$missing; \
	    $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null; \
	  fi; \
	fi
	$(PY) -m pytest -v tests/browser

progress:
	$(COURSE) progress $(NB)

execute: venv
	$(PY) -m tools.notebooks execute $(JOBS_ARG) $(NB)

sync:
	$(COURSE) sync $(NB)

check:
	$(COURSE) check

clean:
	rm -rf runs notebooks/runs build .pytest_cache .ruff_cache data/MNIST *.egg-info
	find . -path './.venv*' -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -print0 | xargs -0 rm -rf

distclean: clean
	rm -rf $(VENV) .venv-3.*
