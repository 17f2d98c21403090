# Two commands for users: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

# The newest Kafka release the Kafka tests also run against (transactions v2, KIP-890, on by default).
KAFKA4_VERSION ?= 4.4.0
# What test-kafka4 runs: the transaction adapter, the Kafka sink, the sink contract's kafka case, and the
# system test in which notify_complete resumes a pre-committed transaction in a fresh process.
KAFKA4_TESTS := tests/integration/test_kafka_transactions.py tests/integration/test_kafka_sink.py \
	tests/integration/test_sink_contract.py \
	tests/system/test_pipeline_kafka.py::test_write_killed_after_prepare_then_notify_commits_twice

.PHONY: setup system-deps python-deps jars demo test test-unit test-kafka4 benchmark docker-config clean

setup: system-deps python-deps jars

# Java (Kafka broker, Spark), Maven (fetches their jars) and PostgreSQL (sink and ledger tests).
system-deps:
	@if ! command -v java >/dev/null || ! command -v mvn >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  echo ">> installing Debian packages: openjdk-17-jre-headless maven postgresql"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q openjdk-17-jre-headless maven postgresql; \
	fi
	@# A compose client validates docker/docker-compose.yml (tests/test_docker_stack.py); no engine needed.
	@if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then \
	  echo ">> installing Debian packages: docker-compose"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends docker-compose; \
	fi

python-deps: $(VENV)/.installed

# constraints.txt pins the whole tree that CI runs with (pyspark and pyspark-client must match).
$(VENV)/.installed: setup.cfg constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -c constraints.txt -e ".[test,postgres]"
	@touch $@

jars: python-deps
	$(PY) -m devtools fetch-jars
	AIRFLOW_EXACTLY_ONCE_KAFKA_VERSION=$(KAFKA4_VERSION) $(PY) -m devtools fetch-jars

demo: setup
	$(PY) -m devtools.demo

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-kafka4

# The Kafka tests again, against Kafka $(KAFKA4_VERSION) instead of the default 3.9.1.
test-kafka4: setup
	AIRFLOW_EXACTLY_ONCE_KAFKA_VERSION=$(KAFKA4_VERSION) $(PY) -m pytest $(KAFKA4_TESTS) -k kafka $(PYTEST_ARGS)

# The unit tier alone: no servers, seconds.
test-unit: python-deps
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

benchmark: setup
	PYTHONPATH=. $(PY) benchmarks/bench_parquet_batch.py
	PYTHONPATH=. $(PY) benchmarks/bench_kafka_guarantees.py

docker-config:
	@if docker compose version >/dev/null 2>&1; then docker compose -f docker/docker-compose.yml config --quiet; \
	 else docker-compose -f docker/docker-compose.yml config --quiet; fi && echo "docker/docker-compose.yml is valid"

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# Rows/s into PostgreSQL: the exactly-once sink vs Spark's own JDBC writer (1,000,000 rows).
benchmark-postgres: setup
	PYTHONPATH=. $(PY) benchmarks/bench_postgres_sink.py
