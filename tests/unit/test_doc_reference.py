"""What the docs say about a declared setting (a pipeline argument, a sink option) is what its declaration says.

The tables of every setting are generated (docs/arguments.md, docs/sinks/*.md; test_docs.py keeps them
fresh). The prose states a default only in a form this module reads and checks against the declaration:

    `retention_days` (default 7)          `transaction_timeout_ms`, default `600000`
    `interval_rerun="noop"` (default)     By default (`data_loss_policy="fail"`)
    `startup_fallback` is `earliest` (default) or `latest`

and a sentence that names a declared setting and says "default" in any other way fails the check, so a
default a page states can never drift from the code's.
"""

from __future__ import annotations

import re
from typing import Iterable

from devtools.docs import DOCS, REPO, code_names

_DEFAULT_WORD = re.compile(r"\bdefault\b(?![_-])", re.I)
_CODE_NAME = re.compile(r"`(\w+)(?:=[^`]*)?`")
# The forms a default is stated in: (name, value).
_STATED = (
    # `name` (default 7), `name`, default `x`, `name` (a pipeline argument, default 5,000)
    re.compile(r"`(\w+)`,? \(?(?:a [\w ]+, )?default:? (`[^`]+`|[\w.,'\"-]*\w)"),
    re.compile(r"`(\w+)=([^`]+)`\** \(default\)"),                           # `name="x"` (default)
    re.compile(r"[Bb]y default \(`(\w+)=([^`]+)`\)"),                        # By default (`name="x"`)
    re.compile(r"`(\w+)` is `([^`]+)` \(default\)"),                         # `name` is `x` (default) or `y`
)
# Generated tables and included code are checked by test_docs.py; a table row is not a sentence.
_GENERATED = re.compile(r"<!-- (include|arguments|sink-options|airflow-config|metrics)\b.*?(```|<!-- /\1 -->)",
                        re.DOTALL)


def declared_defaults() -> dict[str, set[str]]:
    """Every declared setting's name with the ways its default may be written (several declarations may share a
    name: the pipeline's `kafka_config` and the Kafka sink's)."""
    from airflow_exactly_once.operators.arguments import ARGUMENTS
    from airflow_exactly_once.sinks import SPECS

    found: dict[str, set[str]] = {}
    for a in ARGUMENTS:
        found.setdefault(a.name, set()).update(
            {"required"} if a.required else {normal(str(a.default)), normal(repr(a.default))})
    for spec in SPECS.values():
        for o in spec.options():
            shown = {normal(o.default_text()), normal(str(o.default)), *map(normal, code_names(o.default_text()))}
            found.setdefault(o.name, set()).update(shown)
    return found


def normal(value: str) -> str:
    """A default as written, compared loosely: no quotes or backticks, no thousands separators, any case."""
    return re.sub(r"(?<=\d)[,_](?=\d)", "", value.strip().strip("`'\"")).lower()


def sentences(text: str) -> Iterable[str]:
    """The sentences of a page's prose, lines of a paragraph joined; table rows and code lines alone."""
    text = _GENERATED.sub("", text)
    for block in re.split(r"\n\s*\n", text):
        lines = block.splitlines()
        if lines and all(line.startswith(("|", "    ")) for line in lines):
            yield from lines
            continue
        for item in re.split(r"\n(?=\s*(?:[-*]|\d+\.) )", "\n".join(lines)):  # each item of a list apart
            yield from re.split(r"(?<=[.;:])\s+(?=[A-Z`*])", " ".join(line.strip() for line in item.splitlines()))


def stated_defaults(sentence: str) -> list[tuple[str, str]]:
    return [(name, value) for form in _STATED for name, value in form.findall(sentence)]


def check(text: str, defaults: dict[str, set[str]]) -> list[str]:
    """What `text` says about declared defaults that is wrong, or said in a form that is not checked."""
    problems = []
    for sentence in sentences(text):
        if not _DEFAULT_WORD.search(sentence):
            continue
        stated = [(n, v) for n, v in stated_defaults(sentence) if n in defaults]
        problems += [f"{name}: the default is {sorted(defaults[name])}, not {value!r}" for name, value in stated
                     if normal(value) not in defaults[name]]
        named = [n for n in _CODE_NAME.findall(sentence) if n in defaults]
        if named and not stated:
            problems.append(f"a default of {', '.join(dict.fromkeys(named))} in a form not checked: {sentence[:160]}")
    return problems


def test_every_default_the_docs_state_for_a_declared_setting_is_the_declared_one():
    defaults = declared_defaults()
    problems = [f"{doc.relative_to(REPO)}: {p}" for doc in DOCS for p in check(doc.read_text(), defaults)]
    assert problems == [], "write a default as `name` (default VALUE) or `name=VALUE` (default), with the " \
                           "declared value (see this module's docstring)"


def test_check_reads_the_forms_and_names_wrong_and_unchecked_defaults():
    defaults = {"retention_days": {"7"}, "transaction_timeout_ms": {"600000"}, "interval_rerun": {"noop"},
                "data_loss_policy": {"fail"}, "startup_fallback": {"earliest"}}
    good = ("Keep `retention_days` (default 7) days. The deadline (`transaction_timeout_ms`, default `600_000`: 10 "
            "minutes) holds.\n\n* `interval_rerun=\"noop\"` (default): a no-op.\n\nBy default (`data_loss_policy="
            "\"fail\"`) it fails. `startup_fallback` is `earliest` (default) or `latest`. The `default_args` of "
            "`retention_days` are left alone.")
    assert check(good, defaults) == []
    bad = ("The Kafka sink's `transaction_timeout_ms`, 900 s by default, bounds it. Keep `retention_days` "
           "(default 30).")
    assert check(bad, defaults) == [
        "a default of transaction_timeout_ms in a form not checked: The Kafka sink's `transaction_timeout_ms`, "
        "900 s by default, bounds it.",
        "retention_days: the default is ['7'], not '30'"]


def test_each_doc_of_a_setting_with_a_fixed_set_of_values_names_all_of_them_or_none():
    """A doc that lists some of its setting's values lists every one (value_format named neither protobuf nor
    json_schema); the generated tables show the values themselves."""
    from airflow_exactly_once.operators.arguments import ARGUMENTS
    from airflow_exactly_once.sinks import SPECS

    settings = [(f"argument {a.name}", a.doc, a.choices) for a in ARGUMENTS]
    settings += [(f"{kind} sink {o.name}", o.doc, o.choices) for kind, spec in SPECS.items() for o in spec.options()]
    incomplete = {}
    for what, doc, choices in settings:
        values = [str(c) for c in choices if c is not None]
        named = [v for v in values if re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", doc)]
        if named and named != values:
            incomplete[what] = sorted(set(values) - set(named))
    assert incomplete == {}, "these docs list some of their values but not these"


def test_the_arguments_table_says_templated_exactly_for_the_operators_template_fields():
    from devtools.docs import doc_table

    from airflow_exactly_once.operators.arguments import ARGUMENTS
    from airflow_exactly_once.operators.batch import PlanBatchOperator

    rows = {row[0].strip("`"): row[3] for row in doc_table("docs/arguments.md", "argument")}
    assert set(rows) == {a.name for a in ARGUMENTS}
    templated = {name for name, cell in rows.items() if cell == "yes"}
    assert templated == set(PlanBatchOperator.template_fields) & set(rows)
    assert {"transform", "spark_conf", "value_schema", "key_schema"} <= set(rows) - templated
