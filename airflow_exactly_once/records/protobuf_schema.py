"""The reader's Protobuf schema, compiled on the driver into the descriptor set the executors decode with.

The registry holds a Protobuf schema as .proto text, with `references` (other subjects) for the
files it imports. protoc (grpcio-tools' `grpc_tools.protoc`, in the [schema-registry] extra; it
bundles google/protobuf/*.proto, the well-known types) compiles the text and its imports into a
FileDescriptorSet. The message read is the file's first one (message indexes [0]) unless a full
name is given. Compiled sets are cached per schema text for the life of the process.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable

from airflow_exactly_once.core.errors import ConfigurationError, MissingExtraError
from airflow_exactly_once.records.protobuf_rows import ProtobufMessage

READER_FILE = "_aeo_reader.proto"  # the reader's text under a name no import uses
COMPILE_TIMEOUT_S = 60
_CACHE: dict[tuple[str, tuple[tuple[str, str], ...]], bytes] = {}
_LOCK = threading.Lock()


def compile_proto(text: str, imports: dict[str, str], where: str) -> bytes:
    """The serialized FileDescriptorSet of .proto `text` and what it imports (`imports`: import path -> .proto
    text, the schema's references). `where` names the schema in errors, e.g. "subject 'orders-value' version 2"."""
    key = (text, tuple(sorted(imports.items())))
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    try:
        import grpc_tools
    except ImportError as exc:
        raise MissingExtraError("Protobuf in the Schema Registry wire format (reading or writing)", "schema-registry",
                                getattr(exc, "name", None)) from exc
    bundled = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="aeo-proto-") as folder:
        for name, source in {**imports, READER_FILE: text}.items():
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise ConfigurationError(f"the Protobuf schema ({where}) references {name!r}: an import path must "
                                         "stay relative (e.g. 'shop/common.proto')")
            path = Path(folder, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
        out = Path(folder, "set.pb")
        result = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"--proto_path={folder}", f"--proto_path={bundled}",
             "--include_imports", f"--descriptor_set_out={out}", READER_FILE],
            capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, cwd=folder)
        if result.returncode != 0 or not out.exists():
            message = (result.stderr or result.stdout).strip().replace(f"{folder}/", "").replace(
                f"{READER_FILE}:", "line ").rstrip(".")
            raise ConfigurationError(f"the Protobuf schema ({where}) does not compile: {message[:1500]}. Fix the "
                                     "schema, or register the files it imports as its references")
        compiled = out.read_bytes()
    with _LOCK:
        _CACHE[key] = compiled
    return compiled


def reader_message(descriptor_set: bytes, where: str, name: str | None = None) -> ProtobufMessage:
    """The message read from the compiled reader file: its first message, or the one named `name` (a full name
    such as 'shop.Order' or 'shop.Order.Line'), with its message indexes."""
    from google.protobuf import descriptor_pb2

    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
    reader = next(f for f in files.file if f.name == READER_FILE)
    prefix = f"{reader.package}." if reader.package else ""
    paths: dict[tuple[int, ...], str] = {}

    def walk(messages: Iterable[Any], parent: str, path: tuple[int, ...]) -> None:
        for index, message in enumerate(messages):
            full = f"{parent}{message.name}"
            paths[(*path, index)] = full
            walk(message.nested_type, f"{full}.", (*path, index))

    walk(reader.message_type, prefix, ())
    if not paths:
        raise ConfigurationError(f"the Protobuf schema ({where}) defines no message")
    if name is None:
        return ProtobufMessage(descriptor_set, paths[(0,)], (0,), paths)
    wanted = name.lstrip(".")
    found = [path for path, full in paths.items() if full == wanted]
    if not found:
        raise ConfigurationError(f"the Protobuf schema ({where}) has no message {name!r}; its messages: "
                                 f"{', '.join(sorted(paths.values()))}")
    return ProtobufMessage(descriptor_set, wanted, found[0], paths)
