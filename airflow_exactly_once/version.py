"""The package's version, written once: setup.cfg reads it (`attr:`), the package and its provider info import it.

A module of its own, importing nothing, so the provider info (loaded by Airflow's ProvidersManager) reads it
without importing the package's `__init__`, which imports the provider info.
"""

__version__ = "0.1.0"
