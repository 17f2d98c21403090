"""Declared settings: each a dataclass field with its default, one sentence of help and whether it is secret.

PipelineConfig and every sink's spec are declared this way, so the operators' signatures, the
docs' option tables, the refusal of unknown keys ("did you mean") and the list of secrets all
come from one declaration instead of hand-written checks in each place.
"""

from __future__ import annotations

import difflib
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Iterable, Mapping

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.secrets import matching_key_paths, url_paths


def argument(default: Any = MISSING, doc: str = "", *, templated: bool = True, factory: Any = MISSING,
             secret: bool = False, secret_keys: str | None = None, choices: Iterable[Any] = (),
             shown_default: str | None = None) -> Any:
    """A declared setting: its default, the sentence docs and `:param` lines show, whether it is a secret
    (`secret`: as a whole; `secret_keys`: a dict whose keys matching this pattern hold secrets, e.g.
    core.secrets.SECRET_KEY_PATTERN), the values it may take, and the default as the docs say it when it is
    not a literal."""
    metadata = {"doc": doc, "templated": templated, "secret": secret, "secret_keys": secret_keys,
                "choices": tuple(choices), "shown_default": shown_default}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def refuse_unknown_keys(owner: str, given: Iterable[str], allowed: Iterable[str]) -> None:
    """An unknown key (a typo such as "partiton_by") is an error naming the close match, never ignored."""
    allowed = sorted(set(allowed))
    unknown = sorted(set(given) - set(allowed))
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, allowed, n=1)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    raise ConfigurationError(f"{owner} has no setting {', '.join(hints)}; its settings: "
                             f"{', '.join(k for k in allowed if k != 'type')}")


@dataclass(frozen=True)
class Option:
    """One declared setting as docs and checks see it."""

    name: str
    doc: str
    required: bool
    default: Any
    secret: bool
    secret_keys: str | None
    choices: tuple[Any, ...]
    shown_default: str | None
    templated: bool

    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.required:
            return "required"
        if self.default is None:
            return "none"
        return f"`{self.default}`" if isinstance(self.default, str) else f"`{self.default!r}`"


def options_of(declaration: type) -> list[Option]:
    """The declared settings of a dataclass, in declaration order."""
    found = []
    for f in fields(declaration):
        if "doc" not in f.metadata:
            continue
        required = f.default is MISSING and f.default_factory is MISSING
        default = None if required else (f.default if f.default is not MISSING else f.default_factory())
        found.append(Option(f.name, f.metadata["doc"], required, default, f.metadata.get("secret", False),
                            f.metadata.get("secret_keys"), f.metadata.get("choices", ()),
                            f.metadata.get("shown_default"),
                            f.metadata.get("templated", True)))
    return found


@dataclass(kw_only=True)
class SinkSpec:
    """Base of the sinks' declarations: one dataclass per sink type, a field per key of its spec.

    A spec stays the JSON dict the user wrote (it is stored in the ledger and travels to
    spark-submit jobs); the declaration says which keys it may hold, which are required or
    secret, and which values a key takes. What needs more than one key (exactly one of two,
    a URL's scheme) the sink still checks itself.
    """

    type_name: ClassVar[str] = ""
    # The sink's write side and commit side, as "module:Class" (core.sink_writer.SinkWriter and
    # core.sink_committer.SinkCommitter subclasses): imported only when a pipeline uses the sink, so its
    # client library is needed only then, and a declaration stays light enough to check a DAG when it is parsed.
    writer_class: ClassVar[str] = ""
    committer_class: ClassVar[str] = ""

    guarantee: str | None = argument(None, "The delivery guarantee; only the Kafka sink has more than "
                                           "EXACTLY_ONCE (see its page)", shown_default="`EXACTLY_ONCE`")

    @classmethod
    def options(cls) -> list[Option]:
        """The sink's own settings first, then those every sink has."""
        common = {o.name for o in options_of(SinkSpec)}
        found = options_of(cls)
        return [o for o in found if o.name not in common] + [o for o in found if o.name in common]

    @classmethod
    def owner(cls) -> str:
        return f"the {cls.type_name} sink"

    # Keys whose value is a folder the sink writes files to, and what a deployment on several machines uses instead of
    # a folder one machine holds (the placement warning, airflow_exactly_once.placement).
    local_folder_keys: ClassVar[tuple[str, ...]] = ()
    shared_storage: ClassVar[str] = ""

    @classmethod
    def local_folders(cls, spec: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(key, value) of the spec's folders that are paths of the machine a task runs on: no `scheme://`, or
        `file://` (templates not yet rendered are left out: they are looked at when the task runs)."""
        found = []
        for key in cls.local_folder_keys:
            value = spec.get(key)
            if isinstance(value, str) and value and "{{" not in value and (
                    "://" not in value or value.startswith("file://")):
                found.append((key, value))
        return found

    @classmethod
    def check_keys(cls, spec: Mapping[str, Any]) -> None:
        """Unknown keys only: what can be checked when a DAG is parsed, before templates are rendered."""
        refuse_unknown_keys(cls.owner(), spec, ["type", *(o.name for o in cls.options())])

    @classmethod
    def check(cls, spec: Mapping[str, Any]) -> None:
        """Unknown keys and values outside a key's choices, each named (required keys and rules over several
        keys are the sink's to check, with an example of what to write)."""
        cls.check_keys(spec)
        for option in cls.options():
            value = spec.get(option.name)
            if option.choices and value is not None and value not in option.choices:
                raise ConfigurationError(f"{cls.owner()} {option.name} {value!r} is not supported; choose one of "
                                         f"{', '.join(map(str, option.choices))}")

    @classmethod
    def secret_paths(cls, spec: Mapping[str, Any]) -> list[list[str]]:
        """Where `spec` holds secrets, as key paths within it: the declared secret keys it gives, the keys of a
        declared property dict that match its pattern, and any URL with a password, wherever it is."""
        paths = [[o.name] for o in cls.options() if o.secret and spec.get(o.name) not in (None, "")]
        for option in cls.options():
            if option.secret_keys:
                found = matching_key_paths(spec.get(option.name), option.secret_keys)
                paths += [[option.name, *path] for path in found]
        paths += url_paths(spec)
        return [list(p) for p in dict.fromkeys(tuple(p) for p in paths)]

    @classmethod
    def dead_letter_beside(cls, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The dead-letter destination of a pipeline writing to `spec` that names none."""
        raise ConfigurationError(f"bad_record_policy='dead_letter' needs dead_letter=<a sink spec> for the "
                                 f"{cls.type_name} sink")

    @classmethod
    def as_dead_letter(cls, given: dict[str, Any], pipeline_id: str, output: Mapping[str, Any]) -> dict[str, Any]:
        """`given` completed for its use as the dead-letter destination of pipeline `pipeline_id`."""
        return given

    @classmethod
    def markdown_table(cls) -> str:
        """The sink's settings as the docs' table (tests/unit/test_docs.py keeps the docs in step)."""
        rows = ["| sink key | meaning | default |", "|---|---|---|"]
        rows += [f"| `{o.name}` | {o.doc} | {o.default_text()} |" for o in cls.options()]
        return "\n".join(rows)
