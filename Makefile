# nftblockd: every target installs what it needs, idempotently, so a fresh Debian machine (as root) works.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
# mmdebstrap + systemd-container: the real-systemd test tier (tests/systemd/); lintian: the package check.
# gcc, python3-dev, libpcre2-dev: the matcher's native core (nftblockd/detect/_scan.c); dpkg-dev: make deb;
# gcc, libc6-dev: the data-path benchmark's packet sender (bench/udpflood.c);
# redis-server, openssl: the fleet tests' own servers and TLS certificates; python3-venv: `make venv` and the
# wheel test's venvs of Debian's python3 (tests/integration/test_wheel.py); python3-systemd: fail2ban-regex
# reading a journal, the reference for journal lines (tests/integration/test_journal_f2b.py)
APT_PACKAGES := nftables libsystemd-dev pkg-config iproute2 systemd fail2ban mmdebstrap systemd-container lintian \
                gcc python3-dev libpcre2-dev dpkg-dev libc6-dev redis-server openssl python3-venv python3-systemd
STAMP := $(VENV)/.installed
PROMTOOL := $(VENV)/bin/promtool

.PHONY: all venv deps demo test coverage bench lint deb clean

all: test

# System packages: only installed when one is missing (dpkg -s is cheap), apt lists refreshed once.
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing apt packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# The editable install also builds the native core in place (setup.py); pip hides a failed optional build,
# so the engine is printed: without the core the matcher runs on its pure-Python path.
$(STAMP): pyproject.toml setup.py nftblockd/detect/_scan.c nftblockd/feeds/_sorted.c nftblockd/fleet/_plain.c nftblockd/kernel/_nlenc.c | deps
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@$(PY) -c 'from nftblockd.detect import native; print("matcher engine:", native.describe())'
	@touch $(STAMP)

# promtool checks a real metrics scrape and every query of the Grafana dashboard in `make test`. Only the
# binary is taken from Debian's prometheus package (it depends on libc alone): the package itself would pull
# ~96 MB of web assets and start a Prometheus server. Put next to the venv's python, where the tests look.
$(PROMTOOL): | $(STAMP)
	@echo "extracting promtool from Debian's prometheus package"
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd "$$tmp" && \
	{ apt-get download -qq -o APT::Sandbox::User=root prometheus 2>/dev/null || \
	  { apt-get update -qq && apt-get download -qq -o APT::Sandbox::User=root prometheus; }; } && \
	dpkg-deb --fsys-tarfile prometheus_*.deb | tar -xO ./usr/bin/promtool > promtool && \
	chmod 755 promtool && ./promtool --version >/dev/null && mv promtool "$(abspath $(PROMTOOL))"

venv: deps $(STAMP) $(PROMTOOL)

demo: venv
	$(PY) tools/demo.py

# The unit tests, measuring the pure modules' coverage against its floor (pyproject.toml [tool.coverage]);
# then the integration tests (root, namespaces) and the real-systemd tier (the built .deb in containers of
# Debian 13 and 12 booted with systemd as PID 1, ~1.5 min; a fresh machine first builds each release's rootfs,
# side by side, a few minutes). The unit part alone needs no root: `make coverage`.
test: coverage
	$(PY) -m pytest -q -p no:cacheprovider tests/integration tests/systemd

# The unit tier must pass as any user: run as root, it runs as nobody (tools/as-nobody.sh), and then only the
# few unit tests that need root (marked `root`, skipped as nobody) run as root, from their own files.
coverage: venv
	tools/as-nobody.sh $(PY) -m pytest -q -p no:cacheprovider --cov --cov-report=term tests/unit
	@if [ "$$(id -u)" = 0 ]; then files=$$(grep -l 'pytest\.mark\.root' tests/unit/test_*.py); \
	  echo "as root, the unit tests marked root in:" $$files; \
	  $(PY) -m pytest -q -p no:cacheprovider -m root $$files; fi

bench: venv
	$(PY) bench/run.py

# What CI gates before the tests: ruff, then mypy (strict; package, tests, bench/ and tools/, see pyproject.toml),
# then that every declared dependency is imported by the package (tools/check_deps.py)
lint: venv
	$(VENV)/bin/ruff check nftblockd tests bench tools
	$(VENV)/bin/mypy
	$(PY) tools/check_deps.py

deb: venv
	bash packaging/build-deb.sh

clean:
	rm -rf $(VENV) build dist *.egg-info
