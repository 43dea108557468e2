# hicache-fleet: the one entry point for people. `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# capture (a captured venv rolled out, 2.3 GB copied per host) runs on its own: make molecule
# SCENARIOS=capture. CI's time (docs/testing.md, "Budget"): hicache_sizing too (passed in a whole
# fresh-clone run; about 20 minutes of lane time that no cut pays for yet): make molecule SCENARIOS=hicache_sizing.
SCENARIOS ?= $(filter-out capture hicache_sizing,$(shell ls -d molecule/*/molecule.yml 2>/dev/null | xargs -rn1 dirname | xargs -rn1 basename))

.PHONY: help setup demo demo-down traffic traffic-venv test lint syntax pytest molecule bench clean lock eda eda-lock
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

$(VENV)/.installed: requirements/controller.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements/controller.txt
	touch $@

setup: $(VENV)/.installed ## the pinned controller virtualenv (.venv) and the test-host tools
	./scripts/host-tools.sh

lint: setup ## yamllint, ansible-lint (production profile), ruff, ansible-test sanity (modules, module_utils)
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --profile production
	$(BIN)/ruff check .
	BIN=$(BIN) ./scripts/sanity.sh

syntax: setup ## ansible-playbook --syntax-check on every playbook
	$(BIN)/ansible-playbook --syntax-check site.yml
	$(BIN)/ansible-playbook --syntax-check -i inventories/example site.yml

# pytest workers (pytest-xdist): each test file runs whole on one worker (module fixtures run once);
# PYTEST_WORKERS=0 runs the suite in this process, one test after another.
PYTEST_WORKERS ?= 2

pytest: setup ## the pytest suite (unit and integration tests; PYTEST_WORKERS=2 workers, PYTEST_MARK=expression)
	$(BIN)/pytest $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile) $(if $(PYTEST_MARK),-m '$(PYTEST_MARK)')

molecule: setup ## every molecule scenario on real systemd test hosts (MOLECULE_LANES=3 lanes, longest first)
	./scripts/molecule-lanes.sh $(SCENARIOS)

test: setup ## everything CI runs (each stage timed)
	@# The molecule stage's shared state (base rootfs, wheelhouse, fixture models, router venv, host
	@# image) is mostly downloads and installs: it is prepared beside lint, syntax and pytest.
	@mkdir -p .cache/logs; start=$$(date +%s); \
	  ./scripts/molecule-lanes.sh --prepare $(SCENARIOS) >.cache/logs/molecule-prepare.log 2>&1 & prepare=$$!; \
	  for t in lint syntax pytest; do s=$$(date +%s); $(MAKE) --no-print-directory $$t PYTEST_MARK='not shared_state' || { wait $$prepare; exit 1; }; \
	    echo "make test: $$t took $$(( $$(date +%s) - s )) s"; done; \
	  wait $$prepare || { cat .cache/logs/molecule-prepare.log; echo "make test: molecule's shared state FAILED"; exit 1; }; \
	  echo "make test: molecule's shared state (beside them) ready $$(( $$(date +%s) - start )) s after the start"; \
	  s=$$(date +%s); $(MAKE) --no-print-directory molecule SCENARIOS='$(SCENARIOS) pytest-shared-state' || exit 1; \
	  echo "make test: molecule (and the pytest tests that need its shared state) took $$(( $$(date +%s) - s )) s"
	@echo "make test: all checks passed"

# The demo fleet's size: demo-1..N on 127.0.30.1-N (1 to 40; beyond the inventory's three, from the
# host image sglang-venv). scripts/demo.sh checks it before anything boots.
DEMO_HOSTS ?= 3

demo: setup ## boot the demo fleet (DEMO_HOSTS=N hosts, default 3) and roll hicache-fleet out on it
	DEMO_HOSTS='$(DEMO_HOSTS)' ./scripts/demo.sh

demo-down: ## stop every demo host (demo-1..40) and remove their copies
	./scripts/demo.sh --down

# Test traffic with repeated long prefixes (scripts/traffic.py): SGLang's own benchmark client
# (bench_serving, generated-shared-prefix) from a client venv on the controller, .cache/traffic-venv:
# the demo wheelhouse's packages (make demo builds it) plus requirements/traffic.txt (transformers,
# which bench_serving imports and the hosts' test-minimal venv lacks). The wheelhouse is for the
# hosts' Python 3.11: TRAFFIC_BASE_PYTHON must be a 3.11. Targets: the demo hosts' servers (or a
# router: TRAFFIC_TARGETS=http://...), loopback only (scripts/traffic.py --fleet for a real fleet).
TRAFFIC_BASE_PYTHON ?= python3.11
TRAFFIC_WHEELHOUSE ?= .cache/wheelhouse/demo
TRAFFIC_VENV := .cache/traffic-venv
TRAFFIC_TARGETS ?= $(foreach i,$(shell seq 1 $(DEMO_HOSTS)),http://127.0.30.$(i):30004)
# The demo's device pool holds 159,692 tokens: 4 prefixes of 48,000 do not fit, so prefixes come
# back from the HiCache host tier. Bounded: 16 prompts per target, 2 per second, 300 s in all.
TRAFFIC_ARGS ?= --groups 4 --prompts-per-group 4 --prefix-len 48000 --question-len 256 --output-len 16 \
  --request-rate 2 --max-concurrency 3 --timeout 300
TRAFFIC_OUT ?= .cache/traffic/summary.json

$(TRAFFIC_VENV)/.installed: requirements/traffic.txt $(TRAFFIC_WHEELHOUSE)/requirements.lock.txt
	$(TRAFFIC_BASE_PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11) and "TRAFFIC_BASE_PYTHON is not Python 3.11")'
	$(TRAFFIC_BASE_PYTHON) -m venv --clear $(TRAFFIC_VENV)
	$(TRAFFIC_VENV)/bin/pip install --quiet --no-index --find-links $(TRAFFIC_WHEELHOUSE) --no-deps \
	  -r $(TRAFFIC_WHEELHOUSE)/requirements.lock.txt
	$(TRAFFIC_VENV)/bin/pip install --quiet --no-deps -r requirements/traffic.txt
	touch $@

$(TRAFFIC_WHEELHOUSE)/requirements.lock.txt:
	@echo "no wheelhouse at $(TRAFFIC_WHEELHOUSE): make demo builds it (playbooks/demo_prepare.yml)" >&2; exit 1

traffic-venv: $(TRAFFIC_VENV)/.installed ## the traffic generator's client venv (.cache/traffic-venv; needs the demo wheelhouse)

traffic: $(VENV)/.installed $(TRAFFIC_VENV)/.installed ## bounded test traffic with repeated long prefixes at the demo fleet (TRAFFIC_TARGETS, TRAFFIC_ARGS)
	@mkdir -p $(dir $(TRAFFIC_OUT))
	$(BIN)/python scripts/traffic.py --python $(TRAFFIC_VENV)/bin/python $(foreach t,$(TRAFFIC_TARGETS),--target $(t)) \
	  $(TRAFFIC_ARGS) --work-dir .cache/traffic/work --output $(TRAFFIC_OUT)

lock: setup ## lock files of the sglang_venv package sets (uv; roles/sglang_venv/files/locks/)
	$(BIN)/python scripts/lock_package_sets.py lock

# Event-Driven Ansible (docs/event-driven.md): ansible-rulebook in its own venv, never in .venv; off
# by default: nothing runs it unless an operator starts it. Java 17 is Debian's openjdk-17.
EDA_VENV := .cache/eda-venv

$(EDA_VENV)/.installed: extensions/eda/requirements.txt
	$(PYTHON) -m venv $(EDA_VENV)
	$(EDA_VENV)/bin/pip install --quiet --no-deps -r extensions/eda/requirements.txt
	touch $@

eda: $(EDA_VENV)/.installed ## ansible-rulebook (pinned, extensions/eda/requirements.txt) in .cache/eda-venv, for the rollback rulebook
	@$(EDA_VENV)/bin/ansible-rulebook --version

eda-lock: setup ## re-resolve extensions/eda/requirements.txt from extensions/eda/requirements.in (uv)
	@{ sed -n 1,2p extensions/eda/requirements.txt; $(BIN)/uv pip compile extensions/eda/requirements.in --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --no-header --quiet; } > extensions/eda/requirements.txt.new
	mv extensions/eda/requirements.txt.new extensions/eda/requirements.txt

bench: setup ## benchmarks that print figures (not tests) and record them in docs/benchmarks.md
	@for b in $(filter-out benchmarks/record.py,$(wildcard benchmarks/*.py)); do echo "== $$b"; $(BIN)/python $$b --record; done

clean: ## remove test hosts' copies, host images and caches (keeps .venv)
	./molecule/resources/hosts.sh destroy-all || true
	rm -rf .cache/hosts .cache/images .cache/facts
