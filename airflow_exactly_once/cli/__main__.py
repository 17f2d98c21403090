"""`python -m airflow_exactly_once.cli` = the `airflow-exactly-once` console script."""

import sys

from airflow_exactly_once.cli.main import main

sys.exit(main())
