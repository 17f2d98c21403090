"""Whether data written with one Avro schema can be read with another (the Avro spec's schema resolution).

A record of a topic in the wire format names its writer schema; the transform sees the reader
schema (the subject's latest version, or the one the user pinned). Spark's `from_avro` resolves
one to the other record by record, and in PERMISSIVE mode turns a failure into a record of
nulls, so the pair is checked once per writer schema here, on the driver: the records of a
writer schema that cannot be resolved are bad records whose reason says why (records.registry).
The rules: records match by name, reader fields missing from the writer need a default, writer
fields the reader lacks are dropped; int/long/float/double promote upwards, string and bytes
into each other; enums need the writer's symbols (or a reader default); every branch of a
writer union must resolve, and a writer type resolves to the first reader union branch it fits.
"""

from __future__ import annotations

import json
from typing import Any

PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
PROMOTIONS = {"int": {"long", "float", "double"}, "long": {"float", "double"}, "float": {"double"},
              "string": {"bytes"}, "bytes": {"string"}}


class _Schema:
    """A parsed schema with its named types, so that a reference by name can be followed."""

    def __init__(self, schema: Any) -> None:
        self.names: dict[str, Any] = {}
        self.root = json.loads(schema) if isinstance(schema, str) else schema
        self._collect(self.root, None)

    def _collect(self, node: Any, namespace: str | None) -> None:
        if isinstance(node, list):
            for branch in node:
                self._collect(branch, namespace)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in ("record", "error", "enum", "fixed"):
                full = _full_name(node, namespace)
                self.names[full] = node
                self.names.setdefault(full.rsplit(".", 1)[-1], node)
                namespace = full.rsplit(".", 1)[0] if "." in full else namespace
                for field in node.get("fields", ()):
                    self._collect(field.get("type"), namespace)
            elif kind == "array":
                self._collect(node.get("items"), namespace)
            elif kind == "map":
                self._collect(node.get("values"), namespace)
            elif isinstance(kind, (dict, list)):
                self._collect(kind, namespace)

    def resolve(self, node: Any) -> Any:
        """A type with a reference by name replaced by what it names; `{"type": "int"}` as "int"."""
        if isinstance(node, str) and node not in PRIMITIVES:
            if node not in self.names and node.rsplit(".", 1)[-1] not in self.names:
                raise ValueError(f"the type {node!r} is not defined")
            return self.names.get(node) or self.names[node.rsplit(".", 1)[-1]]
        if isinstance(node, dict) and not isinstance(node.get("type"), str):
            return self.resolve(node["type"])
        if isinstance(node, dict) and node["type"] in PRIMITIVES:
            return node["type"]  # a primitive with attributes (a logicalType) resolves as the primitive
        if isinstance(node, dict) and node["type"] not in ("record", "error", "enum", "fixed", "array", "map"):
            return self.resolve(node["type"])
        return node


def _full_name(node: dict[str, Any], namespace: str | None) -> str:
    name = node.get("name", "")
    if "." in name:
        return name
    namespace = node.get("namespace", namespace)
    return f"{namespace}.{name}" if namespace else name


def _kind(node: Any) -> str:
    if isinstance(node, list):
        return "union"
    if isinstance(node, str):
        return node
    return "record" if node["type"] == "error" else node["type"]


def resolution_problem(writer: Any, reader: Any) -> str | None:
    """Why data written with `writer` cannot be read with `reader` (Avro schemas, JSON text or parsed), or None."""
    try:
        w, r = _Schema(writer), _Schema(reader)
        return _problem(w, w.root, r, r.root, "", set())
    except (ValueError, KeyError, TypeError) as exc:
        return f"the schemas cannot be compared ({exc})"


def _problem(w: _Schema, wnode: Any, r: _Schema, rnode: Any, where: str, seen: set[tuple[int, int]]) -> str | None:
    wnode, rnode = w.resolve(wnode), r.resolve(rnode)
    key = (id(wnode), id(rnode))
    if key in seen:  # a recursive type already being compared
        return None
    wk, rk = _kind(wnode), _kind(rnode)
    at = f" at {where}" if where else ""
    if wk == "union":
        for branch in wnode:
            problem = _problem(w, branch, r, rnode, where, seen)
            if problem:
                return problem
        return None
    if rk == "union":
        for branch in rnode:
            if _problem(w, wnode, r, branch, where, seen) is None:
                return None
        return f"the writer's {_describe(wnode)}{at} fits no branch of the reader's union"
    if wk in PRIMITIVES or rk in PRIMITIVES:
        if wk == rk or rk in PROMOTIONS.get(wk, ()):
            return None
        return f"the writer's {wk}{at} cannot be read as the reader's {rk}"
    if wk != rk:
        return f"the writer's {wk}{at} cannot be read as the reader's {rk}"
    if wk in ("record", "enum", "fixed") and not _same_name(wnode, rnode):
        return f"the writer's {wk} {wnode.get('name')!r}{at} is not the reader's {rnode.get('name')!r}"
    if wk == "array":
        return _problem(w, wnode["items"], r, rnode["items"], f"{where}[]", seen)
    if wk == "map":
        return _problem(w, wnode["values"], r, rnode["values"], f"{where}{{}}", seen)
    if wk == "fixed":
        return None if wnode.get("size") == rnode.get("size") else \
            f"the writer's fixed{at} has size {wnode.get('size')}, the reader's {rnode.get('size')}"
    if wk == "enum":
        missing = [s for s in wnode.get("symbols", ()) if s not in rnode.get("symbols", ())]
        if missing and "default" not in rnode:
            return f"the writer's enum{at} has symbols the reader lacks: {', '.join(missing)} (and no default)"
        return None
    seen = seen | {key}
    writer_fields = {f["name"]: f for f in wnode.get("fields", ())}
    for field in rnode.get("fields", ()):
        path = f"{where}.{field['name']}" if where else field["name"]
        source = writer_fields.get(field["name"]) or next(
            (writer_fields[a] for a in field.get("aliases", ()) if a in writer_fields), None)
        if source is None:
            if "default" not in field:
                return f"the reader's field {path!r} is not in the writer's schema and has no default"
            continue
        problem = _problem(w, source["type"], r, field["type"], path, seen)
        if problem:
            return problem
    return None


def _same_name(wnode: dict[str, Any], rnode: dict[str, Any]) -> bool:
    short = str(wnode.get("name", "")).rsplit(".", 1)[-1]
    return short == str(rnode.get("name", "")).rsplit(".", 1)[-1] or \
        short in [str(a).rsplit(".", 1)[-1] for a in rnode.get("aliases", ())]


def _describe(node: Any) -> str:
    kind = _kind(node)
    return f"{kind} {node.get('name')!r}" if isinstance(node, dict) and "name" in node else kind
