"""The ledger page as one self-contained HTML document: inline CSS and SVG, no scripts, no other requests.

Airflow's UI shows plugin pages in a sandboxed iframe (no scripts, an opaque origin), so the
page is rendered on the server and carries everything it needs. Elements carry `data-*`
attributes with the raw numbers, for the browser tests.
"""

from __future__ import annotations

import html
from datetime import datetime
from typing import Any, Iterable
from urllib.parse import quote

from airflow_exactly_once.observe.backlog import NOTABLE_EVENTS, ChartPoint, PipelineReport, utc
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.ui.loading import DriftResult, LagResult, PipelineSummary

STATE_COLOURS = {
    BatchState.PLANNED.value: "#1e6fd9", BatchState.PREPARED.value: "#b06f00", BatchState.COMMITTED.value: "#18794e",
    BatchState.ABORTED.value: "#c2281d", BatchState.EMPTY.value: "#6b7280", BatchState.RETRACTED.value: "#7c3aed",
}
CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 20px;color:#1f2933;
background:#fff;font-size:14px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 8px}
.muted{color:#6b7280}.small{font-size:12px}
nav.pipelines a{display:inline-block;margin:2px 6px 2px 0;padding:3px 10px;border:1px solid #d0d7de;
border-radius:14px;text-decoration:none;color:#1f2933}
nav.pipelines a.current{background:#1f2933;color:#fff;border-color:#1f2933}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-top:12px}
.card{border:1px solid #e5e7eb;border-radius:8px;padding:8px 12px;min-width:120px}
.card .v{font-size:18px;font-weight:600}.card .k{font-size:12px;color:#6b7280}
table{border-collapse:collapse;width:100%;margin-top:4px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f2;vertical-align:top}
th{font-size:12px;color:#6b7280;font-weight:600}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.state{display:inline-block;padding:1px 7px;border-radius:10px;color:#fff;font-size:12px;font-weight:600}
.error{border:1px solid #f5c2c0;background:#fdecea;color:#8a1c14;border-radius:8px;padding:10px 12px;margin:10px 0}
.warn{color:#b06f00;font-weight:600}.bad{color:#c2281d;font-weight:600}
.notable td{background:#fffbea}.charts{display:flex;flex-wrap:wrap;gap:24px}
.charts figure{margin:0}.charts figcaption{font-size:12px;color:#6b7280;margin-bottom:2px}
code{font-size:12px}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _time(moment: datetime | None) -> str:
    moment = utc(moment)
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value < 60:
        return f"{sign}{value:.1f} s" if value < 10 else f"{sign}{value:.0f} s"
    minutes, seconds = divmod(int(round(value)), 60)
    if minutes < 60:
        return f"{sign}{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{sign}{hours} h {minutes} min"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _state(state: str) -> str:
    return f'<span class="state" style="background:{STATE_COLOURS.get(state, "#6b7280")}">{_e(state)}</span>'


def _document(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{CSS}</style></head><body>{body}</body></html>")


def _header(ledger: str, now: datetime, refresh: str = "?", ledger_warning: str | None = None) -> str:
    """Which ledger the page read, and when; `ledger_warning`: why it may not be the one the pipelines write."""
    warning = (f'<div class="error" id="ledger-warning"><b>Not the pipelines\' ledger?</b> {_e(ledger_warning)}</div>'
               if ledger_warning else "")
    return (f"<h1>Exactly-once pipelines</h1><div class='muted small'>ledger <code id='ledger'>{_e(ledger)}</code> "
            f"&middot; read at {_e(_time(now))} UTC &middot; <a href='{_e(refresh)}' id='refresh'>refresh</a></div>"
            + warning)


def error_page(ledger: str, message: str, now: datetime, ledger_warning: str | None = None) -> str:
    """The page when the ledger itself cannot be read."""
    body = (_header(ledger, now, ledger_warning=ledger_warning)
            + f'<div class="error" id="ledger-error"><b>The ledger cannot be read.</b> {_e(message)}</div>')
    return _document("Exactly-once pipelines: ledger unavailable", body)


def _nav(pipelines: list[PipelineSummary], current: str | None, base: str) -> str:
    links = "".join(f'<a href="{base}?pipeline={quote(p.pipeline_id)}" class="{"current" if p.pipeline_id == current else ""}"'
                    f' data-pipeline="{_e(p.pipeline_id)}">{_e(p.pipeline_id)}</a>' for p in pipelines)
    return f'<nav class="pipelines" id="pipelines">{links}</nav>'


def _card(key: str, value: str, ident: str) -> str:
    return f'<div class="card" id="{ident}"><div class="v">{value}</div><div class="k">{_e(key)}</div></div>'


def _cards(report: PipelineReport, lag: LagResult | None) -> str:
    counts = ", ".join(f"{_count(n)} {s.lower()}" for s, n in sorted(report.counts.items())) or "none"
    total = None if lag is None else lag.total
    return '<div class="cards">' + "".join([
        _card("DAGs", _e(", ".join(sorted(report.dag_ids)) or "not recorded"), "card-dags"),
        _card("topics -> sink", f"{_e(report.reads)} &rarr; {_e(report.sink_type)}", "card-flow"),
        _card("fencing epoch", _count(report.epoch), "card-epoch"),
        _card("batches", _e(counts), "card-batches"),
        _card("in flight", _count(len(report.in_flight)), "card-in-flight"),
        _card("last commit", _e(_time(report.last_commit_at)), "card-last-commit"),
        _card("records behind", "?" if total is None else _count(total), "card-lag"),
        _card("retention", _e(report.retention), "card-retention"),
    ]) + "</div>"


def _lag_table(lag: LagResult) -> str:
    error = (f'<div class="error" id="kafka-error"><b>Lag unknown.</b> {_e(lag.error)}</div>'
             if lag.error else "")
    rows = "".join(
        f'<tr data-tp="{_e(r.topic)}:{r.partition}" data-committed="{_e(r.committed)}" '
        f'data-last-stable="{_e(r.last_stable)}" data-lag="{_e(r.lag)}">'
        f"<td>{_e(r.topic)}</td><td class='num'>{r.partition}</td><td class='num'>{_count(r.committed)}</td>"
        f"<td class='num'>{_count(r.in_flight_end)}</td><td class='num'>{_count(r.last_stable)}</td>"
        f"<td class='num'>{_count(r.log_start)}</td>"
        f"<td class='num {'bad' if r.below_log_start else ''}'>{_count(r.lag)}"
        f"{' (records below the log start were deleted)' if r.below_log_start else ''}</td></tr>"
        for r in lag.rows)
    table = ("<table id='lag'><tr><th>topic</th><th class='num'>partition</th><th class='num'>committed position</th>"
             "<th class='num'>in flight up to</th><th class='num'>last stable offset</th><th class='num'>log start</th>"
             f"<th class='num'>lag</th></tr>{rows}</table>") if lag.rows else "<p class='muted'>no partitions yet</p>"
    source = f"<div class='muted small'>read from <code>{_e(lag.servers)}</code> (read_committed)</div>" if lag.servers else ""
    return "<h2>Lag per partition</h2>" + error + table + source


def _drift(drift: DriftResult) -> str:
    """What `airflow-exactly-once check` says about the mirrored group and Airflow's Asset events."""
    errors = "".join(f'<div class="error drift-error"><b>Not compared.</b> {_e(e)}</div>' for e in drift.errors)
    found = drift.report
    if found is None:
        return "<h2>Drift</h2>" + errors
    verdict = ("<p id='drift-ok'>no drift: the accounts agree with the ledger</p>" if found.ok else
               f"<p class='bad' id='drift-found'>{len(found.drift)} difference(s) from the ledger</p>")
    rows = "".join(
        f'<tr data-kind="{_e(f.kind)}" data-drift="{str(f.drift).lower()}"><td class="{"bad" if f.drift else "muted"}">'
        f"{_e(f.kind)}</td><td>{_e(f.subject)}</td><td>{_e(f.detail)}</td><td>{_e(f.cause)}</td>"
        f"<td>{_e(f.repair)}</td></tr>" for f in found.findings)
    table = ("<table id='drift'><tr><th>kind</th><th>where</th><th>what differs</th><th>cause</th><th>repair</th>"
             f"</tr>{rows}</table>") if rows else ""
    compared = f"<div class='muted small' id='drift-compared'>compared with {_e('; '.join(found.compared))}</div>"
    return "<h2>Drift</h2>" + errors + verdict + table + compared


def _in_flight(report: PipelineReport) -> str:
    if not report.in_flight:
        return "<h2>In flight</h2><p class='muted' id='in-flight-none'>no batch in flight</p>"
    deadline = ("the sink keeps staged output until the batch is committed or aborted"
                if report.commit_deadline_ms is None else
                f"the sink's transactions time out after {_seconds(report.commit_deadline_ms / 1000)} "
                "(transaction_timeout_ms)")
    rows = "".join(
        f'<tr data-seq="{b.seq}" data-age="{b.age_s:.1f}" data-deadline="{_e(b.deadline_s)}" '
        f'data-overdue="{str(b.overdue).lower()}"><td class="num">{b.seq}</td><td>{_state(b.state.value)}</td>'
        f"<td><code>{_e(b.run_id)}</code></td><td class='num'>{_seconds(b.age_s)}</td>"
        f"<td class='num'>{_seconds(b.deadline_s)}</td>"
        f"<td class='num {'bad' if b.overdue else 'warn' if (b.remaining_s or 1e9) < 0.2 * (b.deadline_s or 1) else ''}'>"
        f"{'past the deadline' if b.overdue else _seconds(b.remaining_s)}</td></tr>"
        for b in report.in_flight)
    return (f"<h2>In flight</h2><div class='muted small'>{_e(deadline)}</div><table id='in-flight'><tr>"
            "<th class='num'>batch</th><th>state</th><th>run</th><th class='num'>age</th><th class='num'>deadline</th>"
            f"<th class='num'>left</th></tr>{rows}</table>")


def _ranges(batch_ranges: Iterable[Any]) -> str:
    parts = [f"{r.topic}[{r.partition}] {r.start}..{r.end}" for r in batch_ranges if r.size]
    return _e("; ".join(parts) or "no new offsets")


def _batches(report: PipelineReport) -> str:
    rows = "".join(
        f'<tr data-seq="{b.seq}" data-state="{b.state.value}" data-in="{_e(b.input_records)}" '
        f'data-out="{_e(b.output_records)}" data-epoch="{b.epoch}"><td class="num">{b.seq}</td>'
        f"<td>{_state(b.state.value)}</td><td><code>{_e(b.run_id)}</code></td><td class='small'>{_ranges(b.ranges)}</td>"
        f"<td class='num'>{_count(b.input_records)}</td><td class='num'>{_count(b.output_records)}</td>"
        f"<td>{_e(_time(b.created_at))}</td><td class='num'>{_seconds(b.duration_s)}</td><td class='num'>{b.epoch}</td>"
        f"<td class='small'>{_e((b.error or '')[:300])}</td></tr>"
        for b in report.batches)
    more = report.last_seq - len(report.batches)
    note = f"<div class='muted small'>the newest {len(report.batches)} of {report.last_seq} batches</div>" if more > 0 else ""
    return ("<h2>Batches</h2><table id='batches'><tr><th class='num'>batch</th><th>state</th><th>run</th><th>ranges</th>"
            "<th class='num'>records in</th><th class='num'>records out</th><th>planned at (UTC)</th>"
            f"<th class='num'>duration</th><th class='num'>epoch</th><th>error</th></tr>{rows}</table>{note}")


def _events(report: PipelineReport) -> str:
    if not report.events:
        return "<h2>Events</h2><p class='muted'>no events recorded</p>"
    rows = "".join(
        f'<tr class="{"notable" if e["kind"] in NOTABLE_EVENTS else ""}" data-kind="{_e(e["kind"])}">'
        f"<td>{_e(_time(e['at']))}</td><td><b>{_e(e['kind'])}</b></td><td class='num'>{_e(e.get('batch_seq'))}</td>"
        f"<td class='small'>{_e(e['message'][:600])}</td></tr>"
        for e in report.events)
    return ("<h2>Events</h2><table id='events'><tr><th>at (UTC)</th><th>kind</th><th class='num'>batch</th>"
            f"<th>what happened</th></tr>{rows}</table>")


def svg_chart(points: list[tuple[int, float | None]], *, ident: str, unit: str, colour: str, bars: bool,
              width: int = 460, height: int = 130) -> str:
    """A small chart of (batch number, value): bars or a line, the largest value and the batch range labelled."""
    known = [(seq, v) for seq, v in points if v is not None]
    if not known:
        return f"<p class='muted' id='{ident}'>no committed batches yet</p>"
    left, top, bottom = 8, 16, 18
    plot_w, plot_h = width - left - 6, height - top - bottom
    peak = max(v for _, v in known) or 1.0
    step = plot_w / max(len(points), 1)
    shapes = []
    coords = []
    for i, (seq, value) in enumerate(points):
        if value is None:
            continue
        x = left + i * step
        h = plot_h * value / peak
        if bars:
            shapes.append(f'<rect x="{x + step * 0.15:.1f}" y="{top + plot_h - h:.1f}" width="{max(step * 0.7, 1):.1f}" '
                          f'height="{h:.1f}" fill="{colour}" data-seq="{seq}" data-value="{value:g}"/>')
        else:
            cx, cy = x + step / 2, top + plot_h - h
            coords.append(f"{cx:.1f},{cy:.1f}")
            shapes.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5" fill="{colour}" data-seq="{seq}" '
                          f'data-value="{value:g}"/>')
    line = f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(coords)}"/>' if coords else ""
    peak_label = f"{peak:,.0f}" if peak >= 10 else f"{peak:.1f}"
    return (f'<svg id="{ident}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">'
            f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 6}" y2="{top + plot_h}" stroke="#d0d7de"/>'
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#d0d7de"/>'
            f'<text x="{left}" y="{top - 5}" font-size="10" fill="#6b7280">max {peak_label} {_e(unit)}</text>'
            f'<text x="{left}" y="{height - 4}" font-size="10" fill="#6b7280">batch {points[0][0]}</text>'
            f'<text x="{width - 6}" y="{height - 4}" font-size="10" text-anchor="end" fill="#6b7280">batch {points[-1][0]}</text>'
            f"{line}{''.join(shapes)}</svg>")


def _charts(chart: list[ChartPoint]) -> str:
    records = svg_chart([(p.seq, None if p.records is None else float(p.records)) for p in chart],
                        ident="chart-records", unit="records", colour="#1e6fd9", bars=True)
    durations = svg_chart([(p.seq, p.duration_s) for p in chart], ident="chart-duration", unit="s",
                          colour="#b06f00", bars=False)
    return ("<h2>Committed batches over time</h2><div class='charts'>"
            f"<figure><figcaption>records out per batch</figcaption>{records}</figure>"
            f"<figure><figcaption>batch duration (planned to committed)</figcaption>{durations}</figure></div>")


def pipeline_page(*, ledger: str, now: datetime, pipelines: list[PipelineSummary], report: PipelineReport | None,
                  lag: LagResult | None, base: str, notice: str | None = None, drift: DriftResult | None = None,
                  ledger_warning: str | None = None) -> str:
    """The whole page: the pipelines this user may see, and the chosen one in detail."""
    body = _header(ledger, now, f"{base}?pipeline={quote(report.pipeline_id)}" if report else base, ledger_warning)
    if notice:
        body += f"<p class='muted' id='notice'>{_e(notice)}</p>"
    if not pipelines:
        body += ('<p id="no-pipelines">'
                 "No exactly-once pipeline that you may see has run yet (a pipeline is shown to "
                 "the users who may read the DAGs that drive it).</p>")
        return _document("Exactly-once pipelines", body)
    body += _nav(pipelines, report.pipeline_id if report else None, base)
    if report is not None:
        body += (f"<section id='pipeline' data-pipeline='{_e(report.pipeline_id)}'><h2 style='font-size:18px'>"
                 f"{_e(report.pipeline_id)}</h2>" + _cards(report, lag))
        body += (_lag_table(lag) if lag is not None else "") + _in_flight(report) + _charts(report.chart)
        body += (_drift(drift) if drift is not None else "") + _batches(report) + _events(report) + "</section>"
    return _document(f"Exactly-once pipelines: {report.pipeline_id if report else ''}", body)
