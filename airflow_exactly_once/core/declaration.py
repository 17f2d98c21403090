"""Declared settings: each a dataclass field with its default, one sentence of help and whether it is secret.

PipelineConfig and every sink's spec are declared this way, so the operators' signatures, the
docs' option tables, the refusal of unknown keys ("did you mean") and the list of secrets all
come from one declaration instead of hand-written checks in each place.
"""

from __future__ import annotations

import difflib
import types
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, ClassVar, Iterable, Mapping, Union, get_args, get_origin, get_type_hints

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.line_packages import LinePackage
from airflow_exactly_once.core.secrets import matching_key_paths, url_paths

__all__ = ["SinkSpec", "argument"]


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


def is_template(value: Any) -> bool:
    """Whether `value` is Jinja text, which Airflow renders only when the task runs (so it is checked then)."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def whole_number(value: Any) -> int | None:
    """`value` (a number, or a rendered template's text such as "600000") as an int; None when it is not a whole
    number (True is not 1 here)."""
    if isinstance(value, bool):
        return None
    try:
        number = int(value)
        return number if float(value) == number else None
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite float
        return None


@dataclass(frozen=True)
class ValueKind:
    """What a declared type takes, as the sinks read it: its wording in errors and the test of a value."""

    wording: str
    accepts: Callable[[Any], bool]


# By the declared type's class; `int` takes a rendered template's text of a number, `list` (of column names) a single
# name. A type not here (Any, a union of several) is not checked by kind.
VALUE_KINDS: dict[type, ValueKind] = {
    bool: ValueKind("True or False", lambda value: isinstance(value, bool)),
    int: ValueKind("a whole number", lambda value: whole_number(value) is not None),
    str: ValueKind("text", lambda value: isinstance(value, str)),
    dict: ValueKind("a dict", lambda value: isinstance(value, Mapping)),
    list: ValueKind("a list", lambda value: isinstance(value, (list, tuple, str))),
}


def value_kind(declared: Any) -> ValueKind | None:
    """The kind of value a setting declared as `declared` takes (`int | None`: a whole number; None stands for the
    setting not given); None when any value may do."""
    if get_origin(declared) in (Union, types.UnionType):
        alternatives = [a for a in get_args(declared) if a is not type(None)]
        if len(alternatives) != 1:
            return None
        declared = alternatives[0]
    return VALUE_KINDS.get(get_origin(declared) or declared)


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
    annotation: str = "Any"  # the field's type, as the declaration writes it

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
        default = None if required else (f.default_factory() if f.default_factory is not MISSING else f.default)
        found.append(Option(f.name, f.metadata["doc"], required, default, f.metadata.get("secret", False),
                            f.metadata.get("secret_keys"), f.metadata.get("choices", ()),
                            f.metadata.get("shown_default"),
                            f.metadata.get("templated", True), str(f.type)))
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
    # The delivery guarantees the sink implements: its writer and committer read them (core.sink.SinkSide checks the
    # spec's guarantee against them when it binds).
    guarantees: ClassVar[tuple[str, ...]] = ("EXACTLY_ONCE",)
    # The sink's write side and commit side, as "module:Class" (core.sink_writer.SinkWriter and
    # core.sink_committer.SinkCommitter subclasses): imported only when a pipeline uses the sink, so its
    # client library is needed only then, and a declaration stays light enough to check a DAG when it is parsed.
    writer_class: ClassVar[str] = ""
    committer_class: ClassVar[str] = ""
    # JVM libraries its write needs that are built for some Spark lines only (also in its writer's spark_packages()):
    # checked against the installed pyspark when a DAG is parsed (operators.write_launch).
    line_packages: ClassVar[tuple[LinePackage, ...]] = ()
    # Other implementations a spec may pick, by name: (writer class, committer class) as "module:Class" (the Parquet
    # sink's "s3" for an object-storage path). `variant` says which one a spec picks; the sink contract suite runs
    # each of them.
    variant_classes: ClassVar[dict[str, tuple[str, str]]] = {}
    # The sink's own commands of the `airflow-exactly-once` CLI, as "module:function": the function adds them to the
    # CLI's subcommands (sinks.commands.CommandTools says what the CLI hands it); "": none. Imported by the CLI only.
    commands: ClassVar[str] = ""

    guarantee: str | None = argument(None, "The delivery guarantee; only the Kafka sink has more than "
                                           "EXACTLY_ONCE (see its page)", shown_default="`EXACTLY_ONCE`")

    @classmethod
    def variant(cls, spec: Mapping[str, Any]) -> str | None:
        """The variant `spec` picks (a key of `variant_classes`); None: `writer_class` and `committer_class`."""
        return None

    @classmethod
    def side_class(cls, spec: Mapping[str, Any], side: str) -> str:
        """The "module:Class" that makes `side` ("writer_class" or "committer_class") of `spec`."""
        name = cls.variant(spec)
        if name is None:
            return str(getattr(cls, side))
        writer, committer = cls.variant_classes[name]
        return writer if side == "writer_class" else committer

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
    # a folder one machine holds (the placement warning, airflow_exactly_once.airflow_integration.placement).
    local_folder_keys: ClassVar[tuple[str, ...]] = ()
    shared_storage: ClassVar[str] = ""

    @classmethod
    def local_folders(cls, spec: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(key, value) of the spec's folders that are paths of the machine a task runs on: no `scheme://`, or
        `file://` (templates not yet rendered are left out: they are looked at when the task runs)."""
        found = []
        for key in cls.local_folder_keys:
            value = spec.get(key)
            if isinstance(value, str) and value and not is_template(value) and (
                    "://" not in value or value.startswith("file://")):
                found.append((key, value))
        return found

    @classmethod
    def check_keys(cls, spec: Mapping[str, Any]) -> None:
        """Unknown keys, each named with its close match."""
        refuse_unknown_keys(cls.owner(), spec, ["type", *(o.name for o in cls.options())])

    @classmethod
    def check(cls, spec: Mapping[str, Any]) -> None:
        """Unknown keys and every given value against its declaration, each named (required keys and rules over
        several keys are the sink's to check, with an example of what to write)."""
        cls.check_keys(spec)
        cls.check_values(spec)

    @classmethod
    def check_before_rendering(cls, spec: Mapping[str, Any]) -> None:
        """When a DAG is parsed: what `check` refuses, with the same messages, but for values that are templates
        (Jinja text: checked when the task renders them)."""
        cls.check_keys(spec)
        cls.check_values(spec, rendered=False)

    @classmethod
    def check_values(cls, spec: Mapping[str, Any], *, rendered: bool = True) -> None:
        """Each given value against its declaration: the kind of its declared type, its choices, and for the
        guarantee the ones the sink implements. None, and "" (what an unset template renders), is a setting not
        given: its default, or the sink names a missing required key. Before rendering, templates are left out."""
        declared = get_type_hints(cls)
        for option in cls.options():
            value = spec.get(option.name)
            if value is None or value == "" or (not rendered and is_template(value)):
                continue
            problem = cls.value_problem(option, declared[option.name], value)
            if problem is not None:
                raise ConfigurationError(problem)

    @classmethod
    def value_problem(cls, option: Option, declared: Any, value: Any) -> str | None:
        """What is wrong with `value` for `option` (declared as `declared`), as the error says it; None: nothing."""
        kind = value_kind(declared)
        if kind is not None and not kind.accepts(value):
            example = "" if option.default is None else f" (e.g. {option.default!r}, the default)"
            return f"{cls.owner()}'s {option.name} must be {kind.wording}, not {value!r}{example}"
        if option.choices and value not in option.choices:
            return (f"{cls.owner()} {option.name} {value!r} is not supported; choose one of "
                    f"{', '.join(map(str, option.choices))}")
        if option.name == "guarantee" and value not in cls.guarantees:
            # The words of core.sink.SinkSide.bind_pipeline, which refuses the same when a task binds the sink.
            return f"{cls.owner()} does not implement guarantee={value!r}; choose one of {', '.join(cls.guarantees)}"
        return None

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
