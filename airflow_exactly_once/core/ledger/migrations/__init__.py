"""The ledger's Alembic migration scripts (versions/), run in code by core/ledger/versioning.py.

No alembic.ini and no env.py: the runner builds Alembic's script directory from this folder and
drives the migration context itself, in the ledger's own version table (`aeo_alembic_version`).
Every schema change to schema.py adds a script in versions/ (docs/ledger.md says how).
"""
