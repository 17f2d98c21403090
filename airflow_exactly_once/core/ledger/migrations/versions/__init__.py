"""One Alembic revision per file, numbered 0001, 0002, ... in a single line of history."""
