"""``report.html``: one self-contained page that opens offline.

plotly.js is inlined once in the page head; each chart is a ``<div>`` plus its figure
JSON.  The input is the small tables the job collected (plain Python lists of dicts), so
this module knows nothing about Spark and its tests need none.
"""

import datetime
import html
import json

import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline

from loadgen.analysis import RANK_ERROR

PLOT_CONFIG = {"displaylogo": False, "responsive": True,
               "modeBarButtonsToRemove": ["select2d", "lasso2d"]}

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 18px 32px; }
header h1 { margin: 0; font-size: 22px; }
header p { margin: 4px 0 0; color: #b8c0d0; }
main { padding: 8px 32px 40px; max-width: 1400px; }
section { background: #fff; border: 1px solid #e1e4ea; border-radius: 6px;
          margin: 18px 0; padding: 14px 18px; }
h2 { font-size: 17px; margin: 0 0 6px; }
p.note { color: #5a6478; margin: 2px 0 10px; }
p.empty { color: #5a6478; font-style: italic; }
table { border-collapse: collapse; font-size: 13px; width: 100%; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eceef2; text-align: left;
         white-space: nowrap; }
th { background: #f0f2f5; position: sticky; top: 0; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.scroll { max-height: 460px; overflow: auto; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0; }
dt { color: #5a6478; } dd { margin: 0; }
.chart { min-height: 420px; }
"""


def ns_to_text(ns, millis=True):
    """ns since the epoch as ``YYYY-MM-DD HH:MM:SS[.mmm]`` (UTC), which plotly reads as a
    date (it takes no time-zone suffix)."""
    t = datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S") + (".%03d" % (t.microsecond // 1000) if millis else "")


def ns_to_iso(ns):
    """ns since the epoch as ISO 8601 UTC with milliseconds, as in the CSV files."""
    return ns_to_text(ns).replace(" ", "T") + "Z"


def _label(row, with_source=True):
    route = row.get("route") or row.get("protocol") or "-"
    text = f"{route} {row.get('opcode') or '-'}"
    if with_source and row.get("source") not in (None, "proxy"):
        text += f" ({row['source']})"
    return text


def _layout(fig, title, ytitle, xtitle=None, log=False, barmode=None):
    fig.update_layout(
        title={"text": title, "x": 0, "font": {"size": 15}}, template="plotly_white",
        margin={"l": 60, "r": 20, "t": 80, "b": 60}, height=420, hovermode="closest",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "right",
                "x": 1}, barmode=barmode)
    fig.update_yaxes(title_text=ytitle, type="log" if log else "linear")
    if xtitle:
        fig.update_xaxes(title_text=xtitle)
    return fig


def latency_figure(summary):
    rows = [r for r in summary if r.get("p50_ms") is not None]
    if not rows:
        return None
    labels = [_label(r) for r in rows]
    fig = go.Figure()
    for key, name in (("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"),
                      ("p999_ms", "p99.9"), ("max_ms", "max")):
        fig.add_trace(go.Bar(
            x=labels, y=[r[key] for r in rows], name=name,
            customdata=[[r["responses"]] for r in rows],
            hovertemplate="%{x}<br>" + name + " %{y:.3f} ms<br>%{customdata[0]} answered"
                          "<extra></extra>"))
    _layout(fig, "Latency percentiles per opcode", "ms (log scale)", log=True, barmode="group")
    if len(rows) > 8:                   # room for the slanted opcode labels
        fig.update_layout(height=520, margin={"b": 150})
    return fig


def _series_by_route(series):
    grouped = {}
    for r in series:
        grouped.setdefault((r.get("route") or "-", r["source"]), []).append(r)
    return sorted(grouped.items())


def time_figures(series, bucket_s):
    """Throughput, p99 and error ratio over time, one line per (route, source)."""
    if not series:
        return None, None, None
    per = "s" if bucket_s == 1 else f"{bucket_s} s"
    throughput, p99, errors = go.Figure(), go.Figure(), go.Figure()
    for (route, source), rows in _series_by_route(series):
        name = route if source == "proxy" else f"{route} ({source})"
        x = [ns_to_text(r["bucket_s"] * 1_000_000_000, millis=False) for r in rows]
        throughput.add_trace(go.Scatter(
            x=x, y=[r["requests"] / bucket_s for r in rows], name=name, mode="lines",
            hovertemplate="%{x}<br>%{y:.1f} requests/s<extra>" + html.escape(name) + "</extra>"))
        p99.add_trace(go.Scatter(
            x=x, y=[r["p99_ms"] for r in rows], name=name, mode="lines", connectgaps=False,
            hovertemplate="%{x}<br>p99 %{y:.3f} ms<extra>" + html.escape(name) + "</extra>"))
        errors.add_trace(go.Scatter(
            x=x, y=[(r["errors"] / r["responses"]) if r["responses"] else None for r in rows],
            name=name, mode="lines", connectgaps=False,
            hovertemplate="%{x}<br>%{y:.2%} of answers<extra>" + html.escape(name) + "</extra>"))
    xt = f"time (UTC), per {per}"
    _layout(throughput, "Throughput per route", "requests / s", xt)
    _layout(p99, "p99 latency per route", "ms", xt)
    _layout(errors, "Error ratio per route (error answers / answers)", "ratio", xt)
    errors.update_yaxes(tickformat=".1%", rangemode="tozero")
    answered = any(r["responses"] for r in series)
    return throughput, p99 if answered else None, errors if answered else None


def problems_figure(summary):
    rows = [r for r in summary if r.get("timeouts") or r.get("unmatched")]
    if not rows:
        return None
    labels = [_label(r) for r in rows]
    fig = go.Figure([
        go.Bar(x=labels, y=[r["timeouts"] for r in rows], name="timeouts",
               hovertemplate="%{x}<br>%{y} timeouts<extra></extra>"),
        go.Bar(x=labels, y=[r["unmatched"] for r in rows], name="unmatched responses",
               hovertemplate="%{x}<br>%{y} unmatched<extra></extra>"),
    ])
    return _layout(fig, "Timeouts (by request opcode) and unmatched responses (by their own "
                        "opcode)", "count", barmode="group")


def decomposition_figure(decomposition):
    if not decomposition:
        return None
    labels = [_label(r, with_source=False) for r in decomposition]
    fig = go.Figure()
    colours = {"client": "#636efa", "server": "#00cc96", "outside": "#ef553b"}
    for q in ("p50", "p99"):
        for part, title in (("client", "client-observed"),
                            ("server", "server (proxy ↔ upstream)"),
                            ("outside", "outside the server")):
            key = f"{part}_{q}_ms"
            fig.add_trace(go.Bar(
                x=labels, y=[r[key] for r in decomposition], name=f"{title} {q}",
                marker={"color": colours[part], "opacity": 1.0 if q == "p50" else 0.55},
                customdata=[[r["pairs"]] for r in decomposition],
                hovertemplate="%{x}<br>" + f"{title} {q}" + " %{y:.3f} ms<br>%{customdata[0]} "
                              "pairs<extra></extra>"))
    return _layout(fig, "Client-observed latency split: server time and the rest", "ms",
                   barmode="group")


def _cell(value):
    if value is None:
        return "<td></td>"
    if isinstance(value, float):
        return f'<td class="n">{value:,.3f}</td>'
    if isinstance(value, int):
        return f'<td class="n">{value:,}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def html_table(rows, columns, headings=None):
    head = "".join(f"<th>{html.escape(h)}</th>" for h in (headings or columns))
    body = "\n".join("<tr>" + "".join(_cell(r.get(c)) for c in columns) + "</tr>"
                     for r in rows)
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>\n{body}\n</tbody></table></div>")


def _figure_html(fig, div_id):
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div_id,
                       config=PLOT_CONFIG, default_height="420px")


def _section(title, body, note=None):
    note = f'<p class="note">{note}</p>' if note else ""
    return f"<section><h2>{html.escape(title)}</h2>{note}{body}</section>"


def _chart_or(fig, div_id, sentence):
    if fig is None:
        return f'<p class="empty">{html.escape(sentence)}</p>'
    return f'<div class="chart">{_figure_html(fig, div_id)}</div>'


def render(data):
    """The report page (a str).  ``data``: ``meta``, ``summary``, ``series``,
    ``bucket_s``, ``slowest``, ``decomposition`` (see loadgen.analysis.job)."""
    meta, summary = data["meta"], data["summary"]
    slowest_rows, decomposition = data["slowest"], data["decomposition"]
    throughput, p99, errors = time_figures(data["series"], data["bucket_s"])
    figures = {"latency": latency_figure(summary), "throughput": throughput, "p99": p99,
               "errors": errors, "problems": problems_figure(summary),
               "decomposition": decomposition_figure(decomposition)}
    accuracy = f"{RANK_ERROR * 100:g} %"

    runs = meta["runs"]
    shown_runs = ", ".join(sorted({r["run_id"] or "(none)" for r in runs})[:20])
    if len({r["run_id"] for r in runs}) > 20:
        shown_runs += f", ... ({len({r['run_id'] for r in runs})} runs)"
    span = "no records"
    if meta["first_ns"] is not None:
        seconds = (meta["last_ns"] - meta["first_ns"]) / 1e9
        span = (f"{ns_to_text(meta['first_ns'])} – {ns_to_text(meta['last_ns'])} UTC "
                f"({seconds:,.1f} s)")
    facts = [
        ("run id(s)", shown_runs or "(none)"),
        ("time span", span),
        ("sources", ", ".join(meta["sources"]) or "(none)"),
        ("records", f"{meta['records']:,} in {meta['files']:,} file(s)"),
        ("inputs", ", ".join(meta["paths"])),
        ("percentiles", f"Spark percentile_approx, rank error ≤ {accuracy} of the answered "
                        "requests (each value is a logged latency)"),
        ("generated", meta["generated"]),
    ]
    dl = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in facts)

    summary_cols = ["source", "route", "protocol", "opcode", "requests", "responses", "errors",
                    "error_ratio", "timeouts", "unmatched", "rate_per_s", "p50_ms", "p90_ms",
                    "p99_ms", "p999_ms", "max_ms", "frame_bytes", "messages"]
    slow_cols = ["ts", "source", "route", "protocol", "opcode", "conn_id", "peer",
                 "correlation_id", "latency_ms", "status"]
    slow_rows = [dict(r, ts=ns_to_iso(r["ts_ns"])) for r in slowest_rows]
    no_data = "No answered requests in these frame logs."
    sections = [
        _section("Run", f"<dl>{dl}</dl>"),
        _section("Latency per opcode", _chart_or(figures["latency"], "latency", no_data),
                 "Per (route, opcode) of the request; client-side rows are marked (client)."),
        _section("Throughput over time", _chart_or(throughput, "throughput",
                                                   "No requests in these frame logs.")),
        _section("p99 over time", _chart_or(p99, "p99", no_data)),
        _section("Error ratio over time", _chart_or(errors, "errors", no_data)),
        _section("Timeouts and unmatched responses",
                 _chart_or(figures["problems"], "problems",
                           "No timeouts and no unmatched responses.")),
        _section("Client vs. proxy: where the time goes",
                 _chart_or(figures["decomposition"], "decomposition",
                           "No client-side frame logs could be paired with the proxy's "
                           "(pairs need source=client rows with the same protocol, peer "
                           "and correlation_id as a proxy response), so there is no "
                           "decomposition."),
                 "outside = client-observed latency minus the proxy's upstream latency, per "
                 "pair: the client, the proxy and the network between them."),
        _section(f"Slowest {len(slow_rows)} answered requests",
                 html_table(slow_rows, slow_cols) if slow_rows
                 else f'<p class="empty">{html.escape(no_data)}</p>',
                 "ts is the time of the row with the latency: for the proxy when the "
                 "response passed, for the client when the request started."),
        _section("Summary", html_table(summary, summary_cols) if summary
                 else '<p class="empty">No records.</p>'),
    ]
    title = "frametap analysis"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{title}</title>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<style>{CSS}</style>",
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>',
        "</head><body>",
        f"<header><h1>{title}</h1><p>{html.escape(span)} · {meta['records']:,} records"
        f"</p></header>",
        "<main>", *sections, "</main>",
        # the charts drawn, for tests and tools that check the page
        f'<script type="application/json" id="frametap-meta">'
        f"{json.dumps({'charts': [k for k, f in figures.items() if f is not None]})}</script>",
        "</body></html>",
    ])
