# torch-course: `make lab` to learn, `make test` to check. See README.md.
SHELL := /bin/bash
# The course runs on Python 3.10 to 3.13. PYTHONS_FOUND lists those whose interpreter starts (a pyenv
# shim exists for every installed version, active or not, so `command -v` is not enough), newest first.
# `make lab` and `make test` build .venv with the newest; `make PYTHON=python3.10 test` picks another.
PYTHONS_FOUND = $(shell for v in 3.13 3.12 3.11 3.10; do python$$v -c '' 2>/dev/null && echo $$v; done; true)
PYTHON ?= $(addprefix python,$(firstword $(PYTHONS_FOUND)))
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JOBS ?= 2
NB ?=
PYTEST_NB := -p no:cacheprovider --nbval --nbval-current-env \
	--nbval-sanitize-with notebooks/sanitize.cfg --nbval-cell-timeout 600 --nbval-kernel-startup-timeout 300

.PHONY: help venv lab test test-pythons test-portable test-lax test-gpu test-learner test-browser progress execute check clean distclean
help:
	@echo "make lab       create/refresh .venv and open JupyterLab on notebooks/"
	@echo "make test      create/refresh .venv, run unit tests and every notebook under nbval"
	@echo "make execute   re-run notebooks and store fresh outputs (NB=01 for one notebook)"
	@echo "make test-pythons  run make test once per Python 3.10-3.13 found, each in its own .venv-3.X"
	@echo "make test-portable  re-run every notebook under other numeric configurations (outputs compared)"
	@echo "make test-lax  asserts only, on the best device (ARM laptops, CUDA, MPS); test-gpu is the same"
	@echo "make test-learner  run every notebook as a learner does: all cores, warnings shown, no comparison"
	@echo "make test-browser  a learner's exercise in JupyterLab, driven in headless Chromium (installs it if missing)"
	@echo "make progress  which exercises pass, per notebook (NB=01 for one notebook)"
	@echo "make clean     remove generated files (runs, caches); distclean also removes .venv"

# The venv is rebuilt when it is missing or requirements.txt is newer than the last install.
# A .pth file puts the repository root on sys.path, so `import utils` works in every kernel.
$(STAMP): requirements.txt
	@if ! $(PY) -c "import sys" 2>/dev/null; then \
	  $(PYTHON) -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null || { \
	    echo "make: the course needs Python 3.10, 3.11, 3.12 or 3.13, and$(if $(PYTHON), '$(PYTHON)' is not one,"\
	      "none of python3.10 .. python3.13 runs here). Install one, or name it: make PYTHON=/path/to/python3.X $(MAKECMDGOALS)"; \
	    exit 1; }; \
	  rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); fi
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'torch_course.pth').write_text('$(CURDIR)\n')"
	@touch $@

venv: $(STAMP)

# JupyterLab's defaults for the course (overrides.json in the venv; a learner's own settings still win):
# no "official Jupyter news?" prompt on the first start and no update check, so nothing is fetched.
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
$(LAB_SETTINGS): $(STAMP)
	@mkdir -p $(@D) && echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $@

lab: $(STAMP) $(LAB_SETTINGS)
	JUPYTER_PLATFORM_DIRS=1 $(VENV)/bin/jupyter lab --notebook-dir=notebooks \
		$$( [ "$$(id -u)" = 0 ] && echo --allow-root )

test: $(STAMP)
	$(PY) -m pytest -n $(JOBS) --dist loadfile $(PYTEST_NB) --ignore=tests/browser tests notebooks

# The full strict `make test` once per Python found (PYTHONS_FOUND), each in its own .venv-3.X; every
# version runs to the end, then the failed ones are named. Outputs that differ between Python versions
# without being the lesson are normalised in notebooks/sanitize.cfg.
test-pythons:
	@[ -n "$(PYTHONS_FOUND)" ] || { echo "make test-pythons: none of python3.10 .. python3.13 runs here"; exit 1; }
	@failed=; for v in $(PYTHONS_FOUND); do \
	  echo "== Python $$v: make test in .venv-$$v"; SECONDS=0; \
	  $(MAKE) --no-print-directory test VENV=.venv-$$v PYTHON=python$$v || failed="$$failed $$v"; \
	  echo "== Python $$v: $$SECONDS s"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test-pythons: failed on Python$$failed"; exit 1; fi

# Every compared output must also come out of the narrowest code paths and of two threads
# (PORTABLE_CONFIGS in tools/notebooks.py); two-threads runs one notebook at a time, on both cores.
test-portable: $(STAMP)
	TORCH_COURSE_NUMERICS=narrow-isa $(PY) -m pytest -n $(JOBS) --dist loadfile $(PYTEST_NB) notebooks
	TORCH_COURSE_NUMERICS=two-threads $(PY) -m pytest -n 1 $(PYTEST_NB) notebooks

# Asserts only, outputs not compared, the device left to the notebooks: for machines whose
# floating point differs by design (ARM laptops, CUDA, MPS).
test-lax: $(STAMP)
	TORCH_COURSE_GPU=1 $(PY) -m pytest -p no:cacheprovider --nbval-lax --nbval-current-env notebooks

test-gpu: test-lax

test-learner: $(STAMP)
	$(PY) -m tools.notebooks learner $(NB)

# Debian's Chromium and CJK fonts (the notebooks print Chinese terms), installed when missing; elsewhere
# set TORCH_COURSE_CHROMIUM to a Chromium or Chrome binary. Playwright comes from requirements-browser.txt.
BROWSER_DEBS := chromium chromium-driver fonts-noto-cjk
$(VENV)/.browser: requirements-browser.txt $(STAMP)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-browser.txt
	@touch $@

test-browser: $(VENV)/.browser $(LAB_SETTINGS)
	@if [ -z "$$TORCH_COURSE_CHROMIUM" ]; then \
	  missing=$$(for p in $(BROWSER_DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    command -v apt-get >/dev/null || { echo "make test-browser: no apt-get to install $$missing;" \
	      "set TORCH_COURSE_CHROMIUM=/path/to/chromium instead"; exit 1; }; \
	    sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); echo "installing Debian packages:" $$missing; \
	    $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null; \
	  fi; \
	fi
	$(PY) -m pytest -p no:cacheprovider -v tests/browser

progress: $(STAMP)
	$(PY) -m utils.exercises $(NB)

execute: $(STAMP)
	$(PY) -m tools.notebooks execute -j $(JOBS) $(NB)

check: $(STAMP)
	$(PY) -m tools.notebooks check

clean:
	rm -rf runs notebooks/runs .pytest_cache data/MNIST
	find . -path './.venv*' -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -print0 | xargs -0 rm -rf

distclean: clean
	rm -rf $(VENV) .venv-3.*
