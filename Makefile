# torch-course: `make lab` to learn, `make test` to check. See README.md.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JOBS ?= 2
NB ?=
PYTEST_NB := -p no:cacheprovider --nbval --nbval-current-env \
	--nbval-sanitize-with tests/sanitize.cfg --nbval-cell-timeout 600 --nbval-kernel-startup-timeout 300

.PHONY: help venv lab test test-portable test-lax test-gpu test-learner test-browser progress execute check clean distclean
help:
	@echo "make lab       create/refresh .venv and open JupyterLab on the lessons' start page"
	@echo "make test      create/refresh .venv, run unit tests and every notebook under nbval"
	@echo "make execute   re-run notebooks and store fresh outputs (NB=01 for one notebook)"
	@echo "make test-portable  re-run every notebook under other numeric configurations (outputs compared)"
	@echo "make test-lax  asserts only, on the best device (ARM laptops, CUDA, MPS); test-gpu is the same"
	@echo "make test-learner  run every notebook as a learner does: all cores, warnings shown, no comparison"
	@echo "make test-browser  JupyterLab's first start and an exercise, in headless Chromium (installs it if missing)"
	@echo "make progress  which exercises pass, per notebook (NB=01 for one notebook)"
	@echo "make clean     remove generated files (runs, caches); distclean also removes .venv"

# The venv is rebuilt when it is missing or requirements.txt is newer than the last install.
# A .pth file puts the repository root on sys.path, so `import utils` works in every kernel.
$(STAMP): requirements.txt
	@if ! $(PY) -c "import sys" 2>/dev/null; then rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); fi
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'torch_course.pth').write_text('$(CURDIR)\n')"
	@touch $@

venv: $(STAMP)

# JupyterLab on notebooks/, opened on its start page, with the course's settings (tools/lab.py).
lab: $(STAMP)
	$(PY) -m tools.lab

test: $(STAMP)
	$(PY) -m pytest -n $(JOBS) --dist loadfile $(PYTEST_NB) --ignore=tests/browser tests notebooks

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

test-browser: $(VENV)/.browser
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
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -print0 | xargs -0 rm -rf

distclean: clean
	rm -rf $(VENV)
