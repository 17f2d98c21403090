"""The table's folder as the Delta sink's committer needs it, on a local disk or on object storage.

The committer and the withdrawn-folder sweep do the same few things wherever the table lies: list the
files under a staged folder, list the attempt folders of a batch, delete a folder (on S3: every key under
its prefix), read and write a small marker, and open the table with delta-rs. `LocalFolder` does them with
the file system; `ObjectFolder` (sinks.delta.object_folder) with an S3 client.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Protocol


class TableFolder(Protocol):
    """Paths are relative to the table's folder, with slashes."""

    where: str  # the table's folder as messages name it
    uri: str  # what delta-rs opens

    def storage_options(self) -> dict[str, str] | None:
        """delta-rs's settings for the storage (made when asked: they may hold keys; never stored or logged)."""

    def has_log(self) -> bool:
        """Whether `_delta_log` holds a commit."""

    def names(self) -> list[str]:
        """What the table's folder holds directly (folder and file names)."""

    def make(self) -> None:
        """The folder, made if missing (on object storage: nothing to make)."""

    def files(self, folder: str) -> list[str]:
        """Every file below `folder`, relative to the table's folder."""

    def subfolders(self, folder: str) -> list[str]:
        """The names of the folders directly in `folder`."""

    def delete_tree(self, folder: str) -> None:
        """`folder` and everything below it (no error when it is gone)."""

    def delete(self, path: str) -> None:
        """One file (no error when it is gone)."""

    def read_text(self, path: str) -> str | None:
        """A small file's text, None when it does not exist."""

    def write_text(self, path: str, text: str) -> None:
        """A small file, appearing whole or not at all."""


class LocalFolder:
    """A table on a local or mounted file system."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.where = self.uri = str(root)

    def path(self, relative: str) -> Path:
        return self.root / relative

    def storage_options(self) -> dict[str, str] | None:
        return None

    def has_log(self) -> bool:
        log = self.root / "_delta_log"
        return log.is_dir() and any(log.glob("*.json"))

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir()) if self.root.is_dir() else []

    def make(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def files(self, folder: str) -> list[str]:
        base = self.root / folder
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file()) if base.is_dir() else []

    def subfolders(self, folder: str) -> list[str]:
        base = self.root / folder
        return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []

    def delete_tree(self, folder: str) -> None:
        shutil.rmtree(self.root / folder, ignore_errors=True)

    def delete(self, path: str) -> None:
        (self.root / path).unlink(missing_ok=True)

    def read_text(self, path: str) -> str | None:
        try:
            return (self.root / path).read_text()
        except FileNotFoundError:
            return None

    def write_text(self, path: str, text: str) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        partial.write_text(text)
        os.replace(partial, target)
