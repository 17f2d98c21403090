# Two commands for users: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The newest stack (constraints-newest.txt: newest Airflow 3.x and pyspark 4.x) for `make test-newest`.
VENV_NEWEST := .venv-newest
PY_NEWEST   := $(VENV_NEWEST)/bin/python
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=
INSTALL_MATRIX_TEST := tests/integration/test_install_matrix.py
# Kafka on a 3-node cluster (devtools/kafka_cluster.py): a stage of its own with one cluster, left out of the primary
# run, whose two workers would otherwise each start three brokers.
KAFKA_CLUSTER_TEST := tests/integration/test_kafka_cluster.py
# What the newest stack runs: the unit tier, the Kafka sink (with Spark), planning against a real broker
# (Parquet sink), the Iceberg sink on its pyspark line (Iceberg has no Spark runtime for 4.2: the DAG is refused when
# parsed and the plan step before it plans), the Delta sink (its Delta release for Spark 4.2's reader), the provider
# checks (providers list, DAG parsing, `airflow exactly-once`) and one end-to-end Airflow run of the example Parquet
# DAG, all against the Kafka $(KAFKA4_VERSION) broker (so the Kafka sink and Spark's Kafka reader meet Kafka 4 there:
# the kafka4 stage need not run them again). The whole suite runs on the primary stack.
NEWEST_TESTS := tests/unit \
	tests/integration/test_kafka_sink.py \
	tests/integration/test_planning_kafka.py \
	tests/integration/test_iceberg_runtime.py \
	tests/integration/test_provider.py \
	tests/integration/test_delta_sink.py \
	tests/system/test_pipeline_parquet.py::test_example_dag_three_batches_then_an_empty_run

# The newest Kafka release the Kafka tests also run against (transactions v2, KIP-890, on by default).
KAFKA4_VERSION ?= 4.4.0
# What test-kafka4 runs: the transaction adapter (a pre-committed transaction committed from another process, after
# a broker crash, ...), hanging transactions and the sink contract's kafka case. The Kafka sink's own tests and an
# Airflow run meet Kafka 4 in the newest stage.
KAFKA4_TESTS := tests/integration/test_kafka_transactions.py \
	tests/integration/test_kafka_hanging.py \
	tests/integration/test_sink_contract.py

.PHONY: setup system-deps python-deps newest-deps jars registry newest-jars demo test test-unit test-kafka4 test-newest \
	test-stages stage-kafka4 stage-newest stage-install-matrix stage-kafka-cluster test-kafka-cluster install-matrix typecheck benchmark benchmark-parquet-s3 benchmark-iceberg-s3 benchmark-ledger benchmark-scale benchmark-freshness \
	benchmark-freshness-rate benchmark-deps benchmark-freshness-hour benchmark-freshness-faults benchmark-node-away docker-config \
	docs clean

setup: system-deps python-deps jars registry

# Java (Kafka broker, Spark), Maven (fetches their jars), PostgreSQL (sink and ledger tests), Chromium (UI tests) and
# Redis (the Celery workers' broker).
system-deps:
	@if ! command -v java >/dev/null || ! command -v mvn >/dev/null || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  echo ">> installing Debian packages: openjdk-17-jre-headless maven postgresql"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q openjdk-17-jre-headless maven postgresql; \
	fi
	@# The JDK's compiler: devtools/registry (the Schema Registry's Maven build) compiles one class.
	@if ! command -v javac >/dev/null; then \
	  echo ">> installing Debian packages: openjdk-17-jdk-headless"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q openjdk-17-jdk-headless; \
	fi
	@# Headless Chromium for the ledger page's browser tests (devtools/browser.py drives it; no browser download).
	@if ! command -v chromium >/dev/null; then \
	  echo ">> installing Debian packages: chromium"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium; \
	fi
	@# A compose client validates docker/docker-compose.yml (tests/integration/test_docker_stack.py); no engine needed.
	@if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then \
	  echo ">> installing Debian packages: docker-compose"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends docker-compose; \
	fi
	@# Redis: Celery's broker for the two Celery workers' system test and benchmark (devtools/redis.py starts it).
	@if ! command -v redis-server >/dev/null; then \
	  echo ">> installing Debian packages: redis-server"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends redis-server; \
	fi

python-deps: $(VENV)/.installed
newest-deps: $(VENV_NEWEST)/.installed

# $(1): the virtualenv, $(2): the constraints file pinning its whole tree. Idempotent: pip keeps
# what already matches. A venv made while the Spark provider 6.x was pinned still has pyspark-client,
# which shares pyspark's folder: it is removed and pyspark reinstalled (the removal deletes shared files).
define install_venv
	@test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip setuptools wheel
	$(1)/bin/python -m pip install -q -c $(2) -e ".[test,postgres,spark-submit,spark-connect,iceberg,schema-registry,openlineage,s3]"
	@if $(1)/bin/python -m pip show -q pyspark-client 2>/dev/null; then \
	  echo ">> $(1): removing pyspark-client (it shares pyspark's folder), reinstalling pyspark"; \
	  $(1)/bin/python -m pip uninstall -q -y pyspark-client && \
	  $(1)/bin/python -m pip install -q --force-reinstall --no-deps -c $(2) pyspark; \
	fi
	@touch $(1)/.installed
endef

# constraints.txt pins the whole tree that CI runs with.
$(VENV)/.installed: setup.cfg setup.py constraints.txt
	$(call install_venv,$(VENV),constraints.txt)

$(VENV_NEWEST)/.installed: setup.cfg setup.py constraints-newest.txt
	$(call install_venv,$(VENV_NEWEST),constraints-newest.txt)

# Each stack's Spark Kafka connector matches its own pyspark (devtools/maven.py reads the release).
jars: python-deps
	$(PY) -m devtools fetch-jars
	AIRFLOW_EXACTLY_ONCE_KAFKA_VERSION=$(KAFKA4_VERSION) $(PY) -m devtools fetch-jars

# The Schema Registry (Apicurio, Confluent-compatible API) built once from Maven Central into the cache folder
# (devtools/registry/pom.xml, devtools/schema_registry.py).
registry: python-deps
	$(PY) -m devtools build-registry

newest-jars: newest-deps
	AIRFLOW_EXACTLY_ONCE_SPARK_AVRO=0 $(PY_NEWEST) -m devtools fetch-jars

# make demo DEMO_ARGS=--spark-connect: the write tasks run on a Spark Connect server.
DEMO_ARGS ?=
demo: setup
	$(PY) -m devtools.demo $(DEMO_ARGS)

# The primary run's workers (pytest-xdist): each starts its own servers (Kafka, PostgreSQL, Airflow, Spark) when a
# test of its files needs them, and takes a whole file at a time, longest tier first (tests/conftest.py).
# `make test PYTEST_WORKERS=` runs it in one process.
PYTEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder

# The whole suite on the primary stack, then four stages side by side (devtools/parallel_stages.py, each with
# its log in $(STAGE_LOGS)/): the Kafka tests on Kafka 4, the newest stack's subset, the install matrix (once:
# it is a test of the suite, left out of the first run) and the 3-node Kafka cluster's tests (left out of it too). Everything the stages install or fetch (.venv-newest,
# both stacks' jars) is built first, by the prerequisites, so no two stages install anything at once.
test: setup newest-jars
	$(PY) -m pytest --ignore=$(INSTALL_MATRIX_TEST) --ignore=$(KAFKA_CLUSTER_TEST) $(PYTEST_WORKERS) $(PYTEST_ARGS)
	$(RUN_STAGES)

# The four stages alone, side by side, as `make test` runs them after the primary run.
test-stages: setup newest-jars
	$(RUN_STAGES)

STAGE_LOGS ?= artifacts/stages
RUN_STAGES = $(PY) -m devtools.parallel_stages --logs $(STAGE_LOGS) \
	kafka4="$(MAKE) --no-print-directory stage-kafka4" \
	newest="$(MAKE) --no-print-directory stage-newest" \
	install-matrix="$(MAKE) --no-print-directory stage-install-matrix" \
	kafka-cluster="$(MAKE) --no-print-directory stage-kafka-cluster"

# The stages' commands without prerequisites (already built when they run); PYTEST_ARGS reaches the
# sub-make through the environment (or MAKEFLAGS), as it reached them when they ran one after another.
stage-kafka4:
	$(KAFKA4_RUN)
stage-newest:
	$(NEWEST_RUN)
stage-install-matrix:
	$(PY) -m pytest $(INSTALL_MATRIX_TEST)
stage-kafka-cluster:
	$(KAFKA_CLUSTER_RUN)

NEWEST_RUN = AIRFLOW_EXACTLY_ONCE_SPARK_AVRO=0 AIRFLOW_EXACTLY_ONCE_KAFKA_VERSION=$(KAFKA4_VERSION) $(PY_NEWEST) -m pytest $(NEWEST_TESTS)
KAFKA_CLUSTER_RUN = AIRFLOW_EXACTLY_ONCE_KAFKA_VERSION=$(KAFKA4_VERSION) $(PY) -m pytest $(KAFKA_CLUSTER_TEST) -m kafka_cluster
KAFKA4_RUN = AIRFLOW_EXACTLY_ONCE_KAFKA_VERSION=$(KAFKA4_VERSION) $(PY) -m pytest $(KAFKA4_TESTS) -k kafka $(PYTEST_ARGS)

# Kafka -> Kafka and Parquet on a 3-node KRaft cluster of Kafka $(KAFKA4_VERSION) (its DescribeCluster lists fenced nodes) with a
# node SIGKILLed mid-step, killed or paused for whole runs, and the sink contract's Kafka case there.
test-kafka-cluster: setup
	$(KAFKA_CLUSTER_RUN)

# The newest stack: builds .venv-newest from constraints-newest.txt, runs NEWEST_TESTS on it.
test-newest: system-deps newest-jars
	$(NEWEST_RUN)

# The built wheel in fresh virtualenvs beside the oldest and newest supported Airflow and pyspark
# (devtools/install_matrix.py; also tests/integration/test_install_matrix.py).
install-matrix: python-deps
	$(PY) -m devtools.install_matrix

# The Kafka tests again, against Kafka $(KAFKA4_VERSION) instead of the default 3.9.1.
test-kafka4: setup
	$(KAFKA4_RUN)

# The docs' generated parts anew from their sources: the arguments' and sinks' option tables, airflow.cfg's options,
# the metrics, and the code included from tested files (devtools/docs.py; tests/unit/test_docs.py fails when stale).
docs: python-deps
	$(PY) -m devtools.docs

# The package's type check at the level of setup.cfg's [mypy] (the unit tier runs it too: tests/unit/test_typecheck.py).
typecheck: python-deps
	$(PY) -m mypy --config-file setup.cfg airflow_exactly_once

# The unit tier alone: no servers, seconds.
test-unit: python-deps
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# Benchmarks print figures beside what a user would pick instead; run them alone (docs/benchmarks.md).
# `make benchmark` runs every one of them, one after the other (about an hour and a half); each target below runs one.
benchmark: setup
	PYTHONPATH=. $(PY) benchmarks/bench_parquet_batch.py
	PYTHONPATH=. $(PY) benchmarks/bench_parquet_object_storage.py
	PYTHONPATH=. $(PY) benchmarks/bench_iceberg_batch.py
	PYTHONPATH=. $(PY) benchmarks/bench_iceberg_batch.py --catalog rest
	PYTHONPATH=. $(PY) benchmarks/bench_delta_batch.py
	PYTHONPATH=. $(PY) benchmarks/bench_kafka_sink.py
	PYTHONPATH=. $(PY) benchmarks/bench_postgres_sink.py
	PYTHONPATH=. $(PY) benchmarks/bench_registry_avro.py
	PYTHONPATH=. $(PY) benchmarks/bench_dag_run.py
	PYTHONPATH=. $(PY) benchmarks/bench_big_batch.py
	PYTHONPATH=. $(PY) benchmarks/bench_scale.py
	PYTHONPATH=. $(PY) benchmarks/bench_celery_dag_run.py
	PYTHONPATH=. $(PY) benchmarks/bench_freshness.py

docker-config:
	@if docker compose version >/dev/null 2>&1; then docker compose -f docker/docker-compose.yml config --quiet; \
	 else docker-compose -f docker/docker-compose.yml config --quiet; fi && echo "docker/docker-compose.yml is valid"

clean:
	rm -rf $(VENV) $(VENV_NEWEST) build dist *.egg-info .pytest_cache

# The ledger at scale: plan, notify_complete, `batches` and the ledger page on 1,000,000 batches, before and after
# pruning, vs 10 batches, on SQLite and PostgreSQL (docs/benchmarks.md). Smoke run: ARGS="--batches 20000 --rounds 5".
benchmark-ledger: setup
	PYTHONPATH=. $(PY) benchmarks/bench_ledger_scale.py $(ARGS)

# Scale: plan / notify_complete / ledger rows per batch at 12, 100, 300 and 1,000 partitions (SQLite and PostgreSQL),
# and 100 pipelines on one PostgreSQL ledger with 20 planning and committing at once (p50 / p99), against the real
# broker (docs/benchmarks.md). Smoke run: ARGS="--rounds 2 --history 2 --concurrent-rounds 2".
benchmark-scale: setup
	PYTHONPATH=. $(PY) benchmarks/bench_scale.py $(ARGS)

# A DAG run on two Celery workers (write on a warm Spark Connect server) against the same on the LocalExecutor, side by
# side in one Airflow; medians, the ratio (goal: at most 1.2x) and the load average (docs/deployment.md).
benchmark-celery: setup
	PYTHONPATH=. $(PY) benchmarks/bench_celery_dag_run.py $(ARGS)

# One Iceberg micro-batch through Iceberg's REST catalog server vs Spark's writeTo().append() through the same catalog
# (goals: notify_complete < 0.5 s, the write within 1.1x). Smoke run: ARGS="--records 3000 --rounds 1".
benchmark-iceberg-rest: setup
	PYTHONPATH=. $(PY) benchmarks/bench_iceberg_batch.py --catalog rest $(ARGS)

# The same with the warehouse on the S3-compatible server (s3proxy): the write through Iceberg's S3FileIO vs Spark's
# writeTo().append() on the same bucket and catalog. Smoke run: ARGS="--records 3000 --rounds 1".
benchmark-iceberg-s3: setup
	PYTHONPATH=. $(PY) benchmarks/bench_iceberg_batch.py --catalog rest --warehouse s3 $(ARGS)

# The Parquet sink on the S3-compatible server vs Spark's own df.write.parquet("s3a://...") (1,000,000 records; goal
# 1.2x), and notify_complete of a 12-file batch (goal < 1 s). Smoke run: ARGS="--records 20000 --repeat 1".
benchmark-parquet-s3: setup
	PYTHONPATH=. $(PY) benchmarks/bench_parquet_object_storage.py $(ARGS)

# Freshness: produced-to-visible seconds (p50 / p95 / p99 / max) of the Kafka -> Kafka DAG started by arriving data
# in a real Airflow at RATE records/s for MINUTES, then Spark's own streaming query under the same load; the ratios,
# where a run's seconds go, memory at start and end; fails unless every record is visible once (docs/benchmarks.md).
# ARGS="--tuned": a shorter trigger poll and scheduler loop (printed). Smoke run: RATE=50 MINUTES=1.
RATE ?= 1000
MINUTES ?= 10
benchmark-freshness: setup
	PYTHONPATH=. $(PY) benchmarks/bench_freshness.py --rate $(RATE) --minutes $(MINUTES) $(ARGS)

# The rate each sustains: ours and Spark's streaming query step through RATES records/s, STEP_MINUTES each, until a
# step's output falls behind or its latency grows (a backlog); prints every step and the highest sustained rate.
RATES ?= 1000,2000,5000,10000,20000,50000
STEP_MINUTES ?= 2
benchmark-freshness-rate: setup
	PYTHONPATH=. $(PY) benchmarks/bench_freshness_rate.py --rates $(RATES) --step-minutes $(STEP_MINUTES) $(ARGS)

# The benchmarks extra (matplotlib, for the figures) into .venv, beside what setup installed.
benchmark-deps: $(VENV)/.benchmarks-installed
$(VENV)/.benchmarks-installed: $(VENV)/.installed setup.cfg constraints.txt
	$(PY) -m pip install -q -c constraints.txt -e ".[benchmarks]"
	@touch $@

# An hour without drift (not in CI): 60 minutes at 1,000 records/s, ours only, retention keeping 100 batches; fails
# unless exact, no task failed or retried, plan / notify_complete flat (first vs last 10 minutes), each long-lived
# process's memory at rest flat within 10 % (minutes 5-10 vs the last 5) and the ledger bounded; the broker's heap is
# fixed (1G) and the JVMs' heap in use reported. The figures and the series go to docs/images/ (docs/benchmarks.md).
# Run it alone on the machine.
benchmark-freshness-hour: setup benchmark-deps
	PYTHONPATH=. $(PY) benchmarks/bench_freshness.py --rate 1000 --minutes 60 --no-spark --retention-batches 100 \
	  --drift-checks --name freshness-hour --plot docs/images $(ARGS)

# Faults during a sustained run: 12 minutes at 1,000 records/s, the Spark Connect server, the scheduler and the broker
# each SIGKILLed once (at 3, 6 and 9 minutes) and restarted; fails unless exact and freshness is back under 10 s
# (p99 over 20 s, held 30 s) within 60 s of each return. Figures and series to docs/images/.
# A node of a 3-node Kafka 4.4.0 cluster killed, then another paused, for 10 minutes each while Kafka and Parquet runs go
# on (issue 61): runs, retried steps, run times beside the whole cluster's, exactness (about 25 minutes; run it alone).
benchmark-node-away: setup
	PYTHONPATH=. $(PY) benchmarks/bench_node_away.py $(ARGS)

benchmark-freshness-faults: setup benchmark-deps
	PYTHONPATH=. $(PY) benchmarks/bench_freshness.py --rate 1000 --minutes 12 --no-spark \
	  --faults connect,scheduler,broker --name freshness-faults --plot docs/images $(ARGS)

# Rows/s into PostgreSQL: the exactly-once sink vs Spark's own JDBC writer (1,000,000 rows).
benchmark-postgres: setup
	PYTHONPATH=. $(PY) benchmarks/bench_postgres_sink.py
