"""``report.html``: one self-contained page that opens offline.

What a performance engineer brings to a run's report, in the order the page answers it:

1. **Headline** - what ran (protocols, users, spawn rate, run time, host; the proxy's
   routes and timeouts, from the run files beside the frame logs) and the numbers a
   person quotes: requests, requests/s, error ratio, timeouts, p50 / p99, for the
   clients (Locust) and for the proxy, per protocol.
2. **Latency over time per opcode** - one opcode at a time, picked from a selector,
   client and proxy lines together (p50 and p99 above, requests / errors / timeouts /
   cut-offs per second below), as a Grafana panel with a variable would show it.
3. **Client vs. proxy** per protocol and opcode: Locust's own counts (run file), the
   client frame log and each leg of the proxy, with the differences explained (a
   fleximq REQ crosses the proxy twice; a RabbitMQ Stream Publish is one request per
   batch for Locust and one per message on the wire).
4. **Errors** by status / exception per opcode, timeouts and cut-offs apart (a request
   whose connection closed first is not a timeout), Locust's error messages; then, when
   a fault rule acted, the **injected faults**: rows each rule touched and the replies
   the proxy made itself, per route and opcode, apart from the real answers.
5. Latency percentiles per opcode, throughput / p99 / error ratio per route over time,
   the latency decomposition, the slowest requests, the summary table.

Charts are plotly.js (inlined once in the page head, so the page opens from a file with
no network): interactive (hover, zoom, legend toggles), maintained, and already what the
tables' consumers know from Grafana-like tools.  The selectors are plain ``<select>``
elements; the page's own script swaps the traces with ``Plotly.react``.  The input is the
small tables the job collected (plain Python lists of dicts), so this module knows
nothing about Spark and its tests need none.
"""

import datetime
import html
import json

import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline
from plotly.subplots import make_subplots

from loadgen.analysis import RANK_ERROR

PLOT_CONFIG = {"displaylogo": False, "responsive": True,
               "modeBarButtonsToRemove": ["select2d", "lasso2d"]}

#: a colour per side of the comparison (plotly's default palette, kept stable)
SIDE_COLOURS = {"client": "#636efa", "proxy": "#00cc96", "proxy s2c": "#ab63fa"}
STATUS_COLOURS = {"timeout": "#ef553b", "closed": "#9aa0ac"}
PALETTE = ["#636efa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff", "#fecb52",
           "#ab63fa", "#00cc96", "#8c564b"]

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 16px 32px 12px; }
header h1 { margin: 0; font-size: 21px; font-weight: 600; }
header p { margin: 4px 0 0; color: #b8c0d0; }
nav { position: sticky; top: 0; z-index: 10; background: #2a3142; padding: 6px 32px; }
nav a { color: #d6dcea; text-decoration: none; margin-right: 18px; font-size: 13px; }
nav a:hover { color: #fff; text-decoration: underline; }
main { padding: 8px 32px 40px; max-width: 1600px; }
section { background: #fff; border: 1px solid #e1e4ea; border-radius: 6px;
          margin: 16px 0; padding: 14px 18px; scroll-margin-top: 40px; }
h2 { font-size: 17px; margin: 0 0 6px; }
h3 { font-size: 14px; margin: 14px 0 4px; color: #3a4357; }
p.note { color: #5a6478; margin: 2px 0 10px; }
p.empty { color: #5a6478; font-style: italic; }
table { border-collapse: collapse; font-size: 13px; width: 100%; }
th, td { padding: 3px 6px; border-bottom: 1px solid #eceef2; text-align: left;
         white-space: nowrap; }
th { background: #f0f2f5; position: sticky; top: 0; font-weight: 600; }
th.group { text-align: center; border-left: 2px solid #fff; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
td.sep, th.sep { border-left: 2px solid #e1e4ea; }
td.warn { background: #fff4d6; }
td.bad { background: #fde2df; }
td.wrap { white-space: normal; min-width: 240px; color: #3a4357; }
tr.notes td.wrap { color: #6b5a1e; }
tr.expected td { color: #6b7488; }
.scroll { max-height: 520px; overflow: auto; }
.scroll.tall { max-height: 760px; }
table.dense { font-size: 12.5px; }
table.dense th, table.dense td { padding: 3px 5px; }
tr.notes td { border-bottom: 1px solid #e1e4ea; padding-top: 0; font-size: 12px; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0; }
dt { color: #5a6478; } dd { margin: 0; }
.tiles { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr));
         gap: 10px; margin: 8px 0 6px; }
.tile { border: 1px solid #e1e4ea; border-radius: 6px; padding: 8px 12px; }
.tile .v { font-size: 22px; font-weight: 600; font-variant-numeric: tabular-nums; }
.tile .k { color: #5a6478; font-size: 12px; }
.tile.bad .v { color: #c0392b; }
.side { font-weight: 600; margin: 10px 0 0; }
.chart { min-height: 420px; }
.picker { margin: 4px 0 6px; }
.picker select { font: inherit; padding: 3px 6px; min-width: 340px; }
.picker label { color: #5a6478; margin-right: 8px; }
.badge { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 11px;
         background: #e8ebf2; color: #3a4357; margin-left: 4px; }
"""


# ---- formatting ------------------------------------------------------------------------

def ns_to_text(ns, millis=True):
    """ns since the epoch as ``YYYY-MM-DD HH:MM:SS[.mmm]`` (UTC), which plotly reads as a
    date (it takes no time-zone suffix)."""
    t = datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S") + (".%03d" % (t.microsecond // 1000) if millis else "")


def ns_to_iso(ns):
    """ns since the epoch as ISO 8601 UTC with milliseconds, as in the CSV files."""
    return ns_to_text(ns).replace(" ", "T") + "Z"


def _esc(text):
    return html.escape(str(text))


def _n(value):
    return "-" if value is None else f"{value:,}"


def _ms(value):
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _pct(part, whole):
    if not whole:
        return "-"
    ratio = part / whole
    if ratio == 0:
        return "0 %"
    if ratio < 0.0001:
        return "<0.01 %"
    return f"{ratio * 100:.2f} %"


def _duration(seconds):
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(round(seconds)), 60)
    if minutes < 120:
        return f"{minutes} min {s} s"
    return f"{minutes // 60} h {minutes % 60} min"


def _json(value):
    """JSON for inside a <script> element."""
    return json.dumps(value, separators=(",", ":"), default=str).replace("</", "<\\/")


def _label(row, with_source=True):
    route = row.get("route") or row.get("protocol") or "-"
    text = f"{route} {row.get('opcode') or '-'}"
    if with_source and row.get("source") not in (None, "proxy"):
        text += f" ({row['source']})"
    return text


def _side_name(source, leg):
    if source == "client":
        return "client"
    return "proxy" if leg in (None, "c2s") else "proxy s2c"


# ---- chart helpers ------------------------------------------------------------------------

def _layout(fig, title, ytitle, xtitle=None, log=False, barmode=None, height=420):
    fig.update_layout(
        title={"text": title, "x": 0, "font": {"size": 15}}, template="plotly_white",
        margin={"l": 60, "r": 20, "t": 80, "b": 60}, height=height, hovermode="closest",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "right",
                "x": 1}, barmode=barmode)
    fig.update_yaxes(title_text=ytitle)
    if log:
        fig.update_yaxes(type="log")
    if xtitle:
        fig.update_xaxes(title_text=xtitle)
    return fig


def _figure_html(fig, div_id):
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div_id,
                       config=PLOT_CONFIG, default_height=f"{fig.layout.height or 420}px")


def _chart_or(fig, div_id, sentence):
    if fig is None:
        return f'<p class="empty">{_esc(sentence)}</p>'
    return (f'<div class="chart" style="min-height: {fig.layout.height or 420}px">'
            f'{_figure_html(fig, div_id)}</div>')


def _figure_json(fig):
    """A figure as the plain JSON Plotly.newPlot takes (template included)."""
    return json.loads(pio.to_json(fig, validate=False))


# ---- derived views ------------------------------------------------------------------------

class View:
    """The collected tables, with the lookups the sections share."""

    def __init__(self, data):
        self.meta = data["meta"]
        self.summary = data.get("summary") or []
        self.series = data.get("series") or []
        self.bucket_s = data.get("bucket_s") or 1
        self.slowest = data.get("slowest") or []
        self.decomposition = data.get("decomposition") or []
        self.legs = data.get("legs") or []
        self.errors = data.get("errors") or []
        self.faults = data.get("faults") or []
        self.totals = data.get("totals") or []
        self.op_series = data.get("op_series") or []
        self.op_bucket_s = data.get("op_bucket_s") or self.bucket_s
        runs = data.get("runs")
        if runs is None or isinstance(runs, (list, tuple)):
            from loadgen.analysis.runs import Runs
            runs = Runs(runs or [])
        self.runs = runs
        self.expected = self._expected()

    def _expected(self):
        """{(protocol, opcode or None, status): why} of failures the run meant to cause
        (the demo's run file lists them)."""
        out = {}
        for e in self.runs.demo().get("expected_failures") or []:
            if isinstance(e, dict) and e.get("protocol") and e.get("status"):
                out[(e["protocol"], e.get("opcode"), e["status"])] = e.get("why") or "expected"
        return out

    def expected_why(self, protocol, opcode, status):
        return (self.expected.get((protocol, opcode, status))
                or self.expected.get((protocol, None, status)))

    def protocols(self):
        names = {r["protocol"] for r in self.legs if r.get("protocol")}
        names |= {r["protocol"] for r in self.summary if r.get("protocol")}
        return sorted(names)

    def leg(self, source, protocol, opcode, leg="c2s"):
        for r in self.legs:
            if (r["source"], r["protocol"], r["opcode"], r["leg"]) == (
                    source, protocol, opcode, leg):
                return r
        return None

    def total(self, source, protocol=None, leg="c2s"):
        for r in self.totals:
            if (r["source"], r.get("protocol"), r.get("leg", "c2s")) == (source, protocol, leg):
                return r
        return None


# ---- 1. headline ------------------------------------------------------------------------

def _rate(total):
    first, last = total.get("first_req_ns"), total.get("last_req_ns")
    if not total.get("requests") or first is None or last is None:
        return None
    return total["requests"] / max((last - first) / 1e9, 1.0)


def _tiles(total, label):
    answers = total.get("responses") or 0
    errors = total.get("errors") or 0
    rate = _rate(total)
    tiles = [("requests", _n(total.get("requests")), False),
             ("requests / s", "-" if rate is None else f"{rate:,.0f}", False),
             ("errors (of answers)", _pct(errors, answers), errors > 0),
             ("timeouts", _n(total.get("timeouts")), bool(total.get("timeouts"))),
             ("cut off at close", _n(total.get("cut_off")), False),
             ("p50", _ms(total.get("p50_ms")) + " ms", False),
             ("p99", _ms(total.get("p99_ms")) + " ms", False),
             ("max", _ms(total.get("max_ms")) + " ms", False)]
    cells = "".join(f'<div class="tile{" bad" if bad else ""}"><div class="v">{_esc(v)}</div>'
                    f'<div class="k">{_esc(k)}</div></div>' for k, v, bad in tiles)
    return f'<p class="side">{_esc(label)}</p><div class="tiles">{cells}</div>'


def headline_section(view):
    meta = view.meta
    body = []
    client, proxy = view.total("client"), view.total("proxy")
    if client is None and proxy is None:
        body.append('<p class="empty">No requests in these frame logs.</p>')
    if client is not None:
        body.append(_tiles(client, "Clients (Locust users' frame log: what they sent and "
                                    "measured)"))
    if proxy is not None:
        body.append(_tiles(proxy, "Proxy (requests clients sent through it, and their "
                                  "upstream latency)"))
        s2c = view.total("proxy", leg="s2c")
        if s2c is not None and s2c.get("requests"):
            top = sorted((r for r in view.legs if r["source"] == "proxy" and r["leg"] == "s2c"
                          and r.get("requests")), key=lambda r: -r["requests"])
            named = ", ".join(f"{r['protocol']} {r['opcode']} {r['requests']:,}"
                              for r in top[:4]) + (", ..." if len(top) > 4 else "")
            body.append(f'<p class="note">Not in these numbers: {s2c["requests"]:,} requests '
                        f"and one-way messages the servers sent through the proxy ({named}) - "
                        "server-initiated requests, deliveries, and requests a broker "
                        "forwards (a fleximq REQ crosses the proxy a second time on its way "
                        "to a responder). The comparison below shows them per opcode.</p>")
    # per protocol
    rows = []
    for proto in view.protocols():
        c, p = view.total("client", proto), view.total("proxy", proto)
        if c is None and p is None:
            continue
        rows.append((proto, c, p))
    if rows:
        head = ('<tr><th></th><th class="group sep" colspan="5">clients (Locust)</th>'
                '<th class="group sep" colspan="7">proxy</th></tr>'
                '<tr><th>protocol</th><th class="sep">requests</th><th>req/s</th>'
                '<th>errors</th><th>p50 ms</th><th>p99 ms</th><th class="sep">requests</th>'
                '<th>req/s</th><th>errors</th><th>timeouts</th><th>cut off</th><th>p50 ms</th>'
                '<th>p99 ms</th></tr>')
        lines = []
        for proto, c, p in rows:
            cells = [f"<td>{_esc(proto)}</td>"]
            for i, t in enumerate((c, p)):
                sep = ' sep'
                if t is None:
                    cells.append(f'<td class="n{sep}">-</td>' + '<td class="n">-</td>' * (
                        4 if i == 0 else 6))
                    continue
                rate = _rate(t)
                err_cls = " warn" if t.get("errors") else ""
                cells.append(f'<td class="n{sep}">{_n(t["requests"])}</td>'
                             f'<td class="n">{"-" if rate is None else f"{rate:,.0f}"}</td>'
                             f'<td class="n{err_cls}">'
                             f'{_pct(t.get("errors") or 0, t.get("responses"))}</td>')
                if i == 1:
                    to = ' bad' if t.get("timeouts") else ''
                    cells.append(f'<td class="n{to}">{_n(t.get("timeouts"))}</td>'
                                 f'<td class="n">{_n(t.get("cut_off"))}</td>')
                cells.append(f'<td class="n">{_ms(t.get("p50_ms"))}</td>'
                             f'<td class="n">{_ms(t.get("p99_ms"))}</td>')
            lines.append("<tr>" + "".join(cells) + "</tr>")
        body.append("<h3>Per protocol</h3><div class='scroll'><table><thead>" + head +
                    "</thead><tbody>" + "".join(lines) + "</tbody></table></div>")
    body.append('<p class="note">errors = error answers / answers (a client request that '
                "failed without an answer counts as an answered error, as Locust counts it); "
                "timeouts: no answer within the route's request timeout; cut off: the "
                "connection closed before the answer (a run that stopped, a peer that went "
                "away) - not a timeout. Percentiles: Spark percentile_approx, rank error ≤ "
                f"{RANK_ERROR * 100:g} % of the answers.</p>")
    return _section("headline", "Headline", "".join(body))


def ran_section(view):
    meta = view.meta
    facts = []
    span = "no records"
    if meta.get("first_ns") is not None:
        seconds = (meta["last_ns"] - meta["first_ns"]) / 1e9
        span = (f"{ns_to_text(meta['first_ns'])} – {ns_to_text(meta['last_ns'])} UTC "
                f"({_duration(seconds)})")
    facts.append(("time span", span))
    routes = view.runs.routes()
    facts.extend(view.runs.settings(routes=not routes))     # the routes: a table below
    if not view.runs:
        facts.append(("settings", "unknown: no run files (run-*.json) beside these frame "
                                  "logs - frametap proxy, frametap load and frametap demo "
                                  "write them; copy them along with the logs"))
    runs = meta.get("runs") or []
    ids = sorted({r["run_id"] or "(none)" for r in runs})
    shown = ", ".join(ids[:12]) + (f", ... ({len(ids)} runs)" if len(ids) > 12 else "")
    facts += [("run id(s)", shown or "(none)"),
              ("sources", ", ".join(meta.get("sources") or []) or "(none)"),
              ("records", f"{meta.get('records', 0):,} in {meta.get('files', 0):,} file(s)"
                          + (f" and {meta['run_files']} run file(s)"
                             if meta.get("run_files") else "")),
              ("inputs", ", ".join(meta.get("paths") or [])),
              ("generated", meta.get("generated", ""))]
    dl = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in facts)
    extra = ""
    if routes:
        shown = [{k: (f"{v:g}" if isinstance(v, float) else v) for k, v in r.items()}
                 for r in routes]
        extra = "<h3>Proxy routes</h3>" + html_table(
            shown, ["name", "protocol", "listen", "upstream", "request_timeout",
                     "connect_timeout", "max_connections", "framelog"],
            ["route", "protocol", "listen", "upstream", "request timeout s",
             "connect timeout s", "max connections", "frame log"])
    return _section("ran", "What ran", f"<dl>{dl}</dl>{extra}")


# ---- 2. latency over time per opcode ------------------------------------------------------

def _op_options(view):
    """[(protocol, opcode, requests)] for the selector, busiest first per protocol."""
    seen = {}
    for r in view.legs:
        key = (r["protocol"], r["opcode"])
        seen[key] = max(seen.get(key, 0), (r.get("requests") or 0) + (r.get("responses") or 0))
    return sorted(((p, o, n) for (p, o), n in seen.items() if p and o),
                  key=lambda t: (t[0], -t[2], t[1]))


def opcode_figures(view):
    """{"protocol · opcode": figure JSON} for the per-opcode chart, and the default key."""
    per = "s" if view.op_bucket_s == 1 else f"{view.op_bucket_s} s"
    by_key = {}
    for r in view.op_series:
        by_key.setdefault((r["protocol"], r["opcode"]), []).append(r)
    figures, default, best = {}, None, -1
    for proto, opcode, weight in _op_options(view):
        rows = by_key.get((proto, opcode))
        if not rows:
            continue
        troubled = any(r["errors"] or r["timeouts"] or r["cut_off"] for r in rows)
        nrows = 3 if troubled else 2
        fig = make_subplots(rows=nrows, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                            row_heights=[0.56, 0.26, 0.18] if troubled else [0.66, 0.34])
        sides = {}
        for r in rows:
            sides.setdefault(_side_name(r["source"], r["leg"]), []).append(r)
        for side in ("proxy", "proxy s2c", "client"):     # the client's lines on top
            points = sorted(sides.get(side, []), key=lambda r: r["bucket_s"])
            if not points:
                continue
            colour = SIDE_COLOURS[side]
            group = {"legendgroup": side, "legendgrouptitle_text": {
                "proxy": "proxy (c2s)", "proxy s2c": "proxy (s2c leg)",
                "client": "clients"}[side]}
            x = [ns_to_text(r["bucket_s"] * 1_000_000_000, millis=False) for r in points]
            for q, dash in (("p50", "solid"), ("p99", "dot")):
                y = [r[f"{q}_ms"] for r in points]
                if any(v is not None for v in y):
                    fig.add_trace(go.Scatter(
                        x=x, y=y, name=q, mode="lines", connectgaps=False,
                        line={"color": colour, "dash": dash, "width": 2}, **group,
                        hovertemplate="%{x}<br>" + f"{side} {q}" + " %{y:.3f} ms"
                                      "<extra></extra>"), row=1, col=1)
            fig.add_trace(go.Scatter(
                x=x, y=[r["requests"] / view.op_bucket_s for r in points],
                name="requests/s", mode="lines", line={"color": colour, "width": 1.5},
                fill="tozeroy" if side == "proxy" else None, opacity=0.6, **group,
                hovertemplate="%{x}<br>" + side + " %{y:.1f} requests/s<extra></extra>"),
                row=2, col=1)
            if not troubled:
                continue
            for key, name, colour2 in (("errors", "errors", "#c0392b"),
                                       ("timeouts", "timeouts", STATUS_COLOURS["timeout"]),
                                       ("cut_off", "cut off", STATUS_COLOURS["closed"])):
                y = [r[key] / view.op_bucket_s for r in points]
                if any(y):
                    fig.add_trace(go.Bar(
                        x=x, y=y, name=f"{name}/s", opacity=0.85, **group,
                        marker={"color": colour2, "line": {"color": colour, "width": 1.5}},
                        hovertemplate="%{x}<br>" + f"{side} {name}" + " %{y:.2f}/s"
                                      "<extra></extra>"), row=3, col=1)
        title = (f"{proto} · {opcode}: latency, rate" + (", what went wrong" if troubled
                                                         else "") + f" - per {per}")
        _layout(fig, title, "ms", height=620 if troubled else 540)
        fig.update_layout(barmode="stack", margin={"t": 60, "r": 20},
                          legend={"orientation": "v", "x": 1.01, "xanchor": "left", "y": 1,
                                  "yanchor": "top", "groupclick": "toggleitem"})
        fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=1)
        fig.update_yaxes(title_text="requests/s", rangemode="tozero", row=2, col=1)
        if troubled:
            fig.update_yaxes(title_text="problems/s", rangemode="tozero", row=3, col=1)
        fig.update_xaxes(title_text="time (UTC)", row=nrows, col=1)
        key = f"{proto} · {opcode}"
        figures[key] = _figure_json(fig)
        if weight > best:
            default, best = key, weight
    return figures, default


def opcode_section(view):
    figures, default = opcode_figures(view)
    if not figures:
        return _section("opcode", "Latency over time, per opcode",
                        '<p class="empty">No requests in these frame logs.</p>'), None
    groups = {}
    for key in figures:
        proto, _, opcode = key.partition(" · ")
        groups.setdefault(proto, []).append((key, opcode))
    weights = {f"{p} · {o}": n for p, o, n in _op_options(view)}
    options = "".join(
        f'<optgroup label="{_esc(proto)}">' + "".join(
            f'<option value="{_esc(key)}"{" selected" if key == default else ""}>'
            f'{_esc(proto)} · {_esc(opcode)} ({weights.get(key, 0):,})</option>'
            for key, opcode in items) + "</optgroup>"
        for proto, items in sorted(groups.items()))
    body = (f'<div class="picker"><label for="opcode-pick">opcode</label>'
            f'<select id="opcode-pick">{options}</select> '
            f'<span class="badge">{len(figures)} opcodes</span></div>'
            f'<div class="chart" id="opcode"></div>')
    note = ("Pick an opcode: the clients' and the proxy's p50 (solid) and p99 (dotted) over "
            "the run, below it the requests per second, and at the bottom - when any went "
            "wrong - error answers, timeouts and cut-offs per second, each bar edged in its "
            "side's colour. The number beside each opcode is its request and answer rows.")
    script = {"id": "opcode", "select": "opcode-pick", "figures": figures}
    return _section("opcode", "Latency over time, per opcode", body, note), script


# ---- 3. client vs proxy -----------------------------------------------------------------

def compare_rows(view):
    """One row per (protocol, opcode): Locust's counts, the client log's, each proxy leg,
    the decomposition; ``notes`` say why they differ where a rule knows."""
    locust = view.runs.locust_stats()
    decomposition = {}
    for d in view.decomposition:
        key = (d["protocol"], d["opcode"])
        if key not in decomposition or d["pairs"] > decomposition[key]["pairs"]:
            decomposition[key] = d
    keys = sorted({(r["protocol"], r["opcode"]) for r in view.legs if r.get("protocol")}
                  | {k for k in locust if k[0] in view.protocols()})
    out = []
    for proto, opcode in keys:
        client = view.leg("client", proto, opcode)
        proxy = view.leg("proxy", proto, opcode)
        s2c = view.leg("proxy", proto, opcode, "s2c")
        lc = locust.get((proto, opcode))
        row = {"protocol": proto, "opcode": opcode, "locust": lc, "client": client,
               "proxy": proxy, "s2c": s2c, "decomposition": decomposition.get((proto, opcode)),
               "notes": []}
        notes = row["notes"]
        if s2c and proxy and s2c.get("requests") and proxy.get("requests"):
            if abs(s2c["requests"] - proxy["requests"]) <= max(5, 0.05 * proxy["requests"]):
                notes.append(f"each {opcode} crosses the proxy twice - from the requester "
                             f"(c2s: {proxy['requests']:,}) and on to the peer that answers "
                             f"(s2c: {s2c['requests']:,}); Locust counts it once: compare "
                             "with c2s")
            else:
                notes.append(f"the proxy also saw {s2c['requests']:,} {opcode} sent by the "
                             "server side (s2c)")
        elif s2c and s2c.get("requests") and not proxy:
            notes.append(f"sent by the server side only: the proxy saw {s2c['requests']:,} "
                         "(s2c)")
        if lc and client and client["requests"] != lc["requests"]:
            if client["requests"] > lc["requests"]:
                notes.append(f"the client log has one row per message ({client['requests']:,}),"
                             f" Locust one per request or batch ({lc['requests']:,})")
            else:
                notes.append(f"{lc['requests'] - client['requests']:,} of Locust's requests "
                             "never went out (a failed connect) and have no client row")
        base = (client or {}).get("requests") or (lc or {}).get("requests")
        if proxy and base and proxy["requests"] and not s2c:
            gap = proxy["requests"] - base
            if abs(gap) > max(5, 0.01 * base):
                notes.append(f"the proxy saw {abs(gap):,} {'more' if gap > 0 else 'fewer'} "
                             "than the clients sent")
        if proxy and proxy.get("cut_off"):
            notes.append(f"{proxy['cut_off']:,} cut off when connections closed (not "
                         "timeouts)")
        out.append(row)
    return out


def compare_section(view):
    rows = compare_rows(view)
    if not rows:
        return _section("compare", "Client vs. proxy, per protocol and opcode",
                        '<p class="empty">No requests in these frame logs.</p>')
    rows.sort(key=lambda r: (r["protocol"], -max(
        [(x or {}).get("requests") or 0 for x in (r["locust"], r["client"], r["proxy"],
                                                  r["s2c"])]), r["opcode"]))
    have_locust = any(r["locust"] for r in rows)
    groups = [("", 2, "")]
    cols = ["protocol", "opcode"]
    if have_locust:
        groups.append(("Locust's own count", 2, " sep"))
        cols += ["requests", "failures"]
    groups += [("client frame log", 5, " sep"), ("proxy: requests from clients (c2s)", 6,
                                                   " sep"),
               ("outside the server", 2, " sep")]
    cols += ["requests", "errors", "timeouts", "p50 ms", "p99 ms", "requests", "errors",
             "timeouts", "cut off", "p50 ms", "p99 ms", "p50 ms", "p99 ms"]
    seps = {2} | ({4} if have_locust else set())
    first_client = 4 if have_locust else 2
    seps |= {first_client, first_client + 5, first_client + 11}
    head = ("<tr>" + "".join(f'<th class="group{sep}" colspan="{n}">{_esc(t)}</th>'
                             for t, n, sep in groups) + "</tr><tr>" +
            "".join(f'<th class="{"sep" if i in seps else ""}">{_esc(c)}</th>'
                    for i, c in enumerate(cols)) + "</tr>")
    width = len(cols)
    body = []

    def num(value, cls=""):
        return f'<td class="n{cls}">{"-" if value is None else _n(value)}</td>'

    for r in rows:
        lc, c, p, s, d = r["locust"], r["client"], r["proxy"], r["s2c"], r["decomposition"]
        cells = [f"<td>{_esc(r['protocol'])}</td><td>{_esc(r['opcode'])}</td>"]
        if have_locust:
            cells.append(num((lc or {}).get("requests"), " sep") +
                         num((lc or {}).get("failures"),
                             " warn" if (lc or {}).get("failures") else ""))
        c = c or {}
        cells.append(num(c.get("requests"), " sep") +
                     num(c.get("errors"), " warn" if c.get("errors") else "") +
                     num(c.get("timeouts"), " bad" if c.get("timeouts") else "") +
                     f'<td class="n">{_ms(c.get("p50_ms"))}</td>'
                     f'<td class="n">{_ms(c.get("p99_ms"))}</td>')
        p = p or {}
        base = c.get("requests") or (lc or {}).get("requests")
        differs = bool(p.get("requests") and base and not s
                       and abs(p["requests"] - base) > max(5, 0.01 * base))
        cells.append(num(p.get("requests"), " sep" + (" warn" if differs else "")) +
                     num(p.get("errors"), " warn" if p.get("errors") else "") +
                     num(p.get("timeouts"), " bad" if p.get("timeouts") else "") +
                     num(p.get("cut_off")) +
                     f'<td class="n">{_ms(p.get("p50_ms"))}</td>'
                     f'<td class="n">{_ms(p.get("p99_ms"))}</td>')
        d = d or {}
        cells.append(f'<td class="n sep">{_ms(d.get("outside_p50_ms"))}</td>'
                     f'<td class="n">{_ms(d.get("outside_p99_ms"))}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
        if r["notes"]:
            body.append(f'<tr class="notes"><td></td><td class="wrap" colspan="{width - 1}">'
                        f'↳ {_esc("; ".join(r["notes"]))}</td></tr>')
    table = ("<div class='scroll tall'><table class='dense'><thead>" + head + "</thead><tbody>" +
             "".join(body) + "</tbody></table></div>")
    note = ("Per protocol and opcode, busiest first: what Locust counted (its run file), "
            "what the clients logged, and what the proxy saw of the requests clients sent "
            "(c2s); the same opcode sent the other way (s2c: by servers, or a broker "
            "forwarding) is in legs.csv and in a note under the row. The client's latency includes the client library, the "
            "proxy and the network; the proxy's is its upstream round trip; 'outside the "
            "server' is their difference per joined pair (client and proxy row with the same "
            "peer and correlation id). Amber: errors, or a proxy count more than 1 % off "
            "the clients'; red: timeouts. A note under a row says why counts differ.")
    return _section("compare", "Client vs. proxy, per protocol and opcode", table, note)


# ---- 4. errors ----------------------------------------------------------------------------

def error_rows(view):
    """Every (source, protocol, opcode, status) that went wrong: error answers by status,
    then timeouts and cut-offs, with the opcode's answers for the share."""
    answers = {}
    for r in view.legs:
        key = (r["source"], r["protocol"], r["opcode"])
        answers[key] = answers.get(key, 0) + (r.get("responses") or 0)
    out = {}
    for e in view.errors:
        key = (e["source"], e["protocol"], e["opcode"], e["status"])
        out[key] = out.get(key, 0) + e["errors"]
    injected = {}                 # the proxy's error answers that it made itself, apart
    for f in view.faults:
        if f.get("injected_errors"):
            key = ("proxy", f["protocol"], f["opcode"], f["status"])
            if key in out:
                out[key] -= f["injected_errors"]
            ikey = key + (f.get("fault") or "?",)
            injected[ikey] = injected.get(ikey, 0) + f["injected_errors"]
    for r in view.legs:
        for col, status in (("timeouts", "timeout"), ("cut_off", "closed")):
            if r.get(col):
                key = (r["source"], r["protocol"], r["opcode"], status)
                out[key] = out.get(key, 0) + r[col]
    rows = []
    for (source, proto, opcode, status), n in out.items():
        if n <= 0:
            continue
        rows.append({"source": source, "protocol": proto, "opcode": opcode, "status": status,
                     "count": n, "answers": answers.get((source, proto, opcode), 0),
                     "expected": view.expected_why(proto, opcode, status)})
    for (source, proto, opcode, status, fault), n in injected.items():
        rows.append({"source": source, "protocol": proto, "opcode": opcode,
                     "status": f"{status} (injected: {fault})", "count": n,
                     "answers": answers.get((source, proto, opcode), 0),
                     "expected": f"the proxy answered these itself (fault rule {fault})"})
    rows.sort(key=lambda r: (r["protocol"] or "", r["opcode"] or "", r["source"] or "",
                             -r["count"]))
    return rows


def errors_figure(rows):
    if not rows:
        return None
    labels = []
    for r in rows:
        label = f"{r['protocol']} {r['opcode']} ({r['source']})"
        if label not in labels:
            labels.append(label)
    statuses = []
    for r in sorted(rows, key=lambda r: -r["count"]):
        if r["status"] not in statuses:
            statuses.append(r["status"])
    fig = go.Figure()
    colour_no = 0
    for status in statuses:
        if status in STATUS_COLOURS:
            colour = STATUS_COLOURS[status]
        else:
            colour = PALETTE[colour_no % len(PALETTE)]
            colour_no += 1
        counts = {f"{r['protocol']} {r['opcode']} ({r['source']})": r["count"]
                  for r in rows if r["status"] == status}
        name = {"timeout": "timeout", "closed": "cut off (connection closed)"}.get(status,
                                                                                  status)
        fig.add_trace(go.Bar(
            y=labels, x=[counts.get(label, 0) for label in labels], name=name,
            orientation="h", marker={"color": colour},
            hovertemplate="%{y}<br>" + _esc(name) + ": %{x:,}<extra></extra>"))
    height = max(300, 120 + 22 * len(labels))
    _layout(fig, "What went wrong, per opcode and side: error answers by status, timeouts, "
                 "cut-offs", "", barmode="stack", height=height)
    fig.update_layout(margin={"l": 260, "t": 90})
    fig.update_xaxes(title_text="requests")
    fig.update_yaxes(autorange="reversed")
    return fig


def errors_section(view):
    rows = error_rows(view)
    fig = errors_figure(rows)
    body = [_chart_or(fig, "errors-by-status", "No error answers, no timeouts and no "
                                               "cut-offs.")]
    if rows:
        lines = []
        for r in rows:
            status = {"timeout": "timeout (no answer in time)",
                      "closed": "cut off (connection closed first)"}.get(r["status"],
                                                                          r["status"])
            share = (_pct(r["count"], r["answers"]) if r["status"] not in ("timeout", "closed")
                     else "-")
            exp = r["expected"]
            lines.append(
                f'<tr{" class=expected" if exp else ""}><td>{_esc(r["protocol"])}</td>'
                f'<td>{_esc(r["opcode"])}</td><td>{_esc(r["source"])}</td>'
                f'<td>{_esc(status)}</td><td class="n">{r["count"]:,}</td>'
                f'<td class="n">{share}</td>'
                f'<td class="wrap">{_esc("expected: " + exp if exp else "")}</td></tr>')
        body.append("<h3>By status</h3><div class='scroll'><table><thead><tr><th>protocol</th>"
                    "<th>opcode</th><th>side</th><th>status / exception</th><th>count</th>"
                    "<th>of answers</th><th></th></tr></thead><tbody>" + "".join(lines) +
                    "</tbody></table></div>")
    messages = view.runs.locust_errors()
    if messages:
        shown = messages[:25]
        body.append("<h3>Locust's error messages</h3>" + html_table(
            shown, ["type", "name", "error", "occurrences"],
            ["type", "name", "error", "occurrences"]) +
            (f'<p class="note">{len(messages) - 25:,} more in the run file.</p>'
             if len(messages) > 25 else ""))
    note = ("Status is the protocol's own status name of the answer (FlyMQ ERROR, a "
            "RocketMQ ResponseCode, a Thrift exception type...), on the client side the "
            "exception's class when no answer came. A timeout is a request the proxy "
            "stopped waiting for after the route's request timeout; a cut-off is one whose "
            "connection closed before an answer - usually the end of the run - and is "
            "never a timeout." + (" Grey rows are failures the run caused on purpose."
                                  if view.expected else ""))
    return _section("errors", "Errors, timeouts and cut-offs", "".join(body), note)


# ---- 4b. injected faults -------------------------------------------------------------------

def fault_rows(view):
    """One row per (route, protocol, opcode, fault) of the fault view: the rows the rule
    touched, the replies the proxy injected (by status) and, apart from them, the real
    answers and real errors of that opcode on that route (the proxy's summary less the
    injected ones)."""
    real = {}
    for r in view.summary:
        if r.get("source") == "proxy":
            real[(r["route"], r["protocol"], r["opcode"])] = r
    out = {}
    for f in view.faults:
        key = (f["route"], f["protocol"], f["opcode"], f.get("fault"))
        row = out.setdefault(key, {"route": f["route"], "protocol": f["protocol"],
                                   "opcode": f["opcode"], "fault": f.get("fault"),
                                   "touched": 0, "injected": 0, "injected_errors": 0,
                                   "statuses": {}})
        row["touched"] += f.get("touched") or 0
        row["injected"] += f.get("injected") or 0
        row["injected_errors"] += f.get("injected_errors") or 0
        if f.get("injected") and f.get("status") is not None:
            row["statuses"][f["status"]] = row["statuses"].get(f["status"], 0) + f["injected"]
    rows = []
    for (route, proto, opcode, _fault), row in sorted(
            out.items(), key=lambda kv: tuple(x or "" for x in kv[0])):
        s = real.get((route, proto, opcode)) or {}
        injected = sum(r["injected"] for k, r in out.items() if k[:3] == (route, proto, opcode))
        inj_err = sum(r["injected_errors"] for k, r in out.items()
                      if k[:3] == (route, proto, opcode))
        row["real_answers"] = max(0, (s.get("responses") or 0) - injected) if s else None
        row["real_errors"] = max(0, (s.get("errors") or 0) - inj_err) if s else None
        row["status"] = ", ".join(f"{k} ×{v:,}" for k, v in sorted(row["statuses"].items()))
        rows.append(row)
    return rows


def faults_figure(rows):
    """Per route and opcode a fault touched: real answers and, stacked on them, the
    replies the proxy injected, one colour per fault and status."""
    if not any(r["touched"] or r["injected"] for r in rows):
        return None
    labels = []
    for r in rows:
        label = f"{r['route']} {r['opcode']}"
        if label not in labels:
            labels.append(label)
    fig = go.Figure()
    real = {}
    for r in rows:
        if r.get("real_answers") is not None:
            real[f"{r['route']} {r['opcode']}"] = r["real_answers"]
    fig.add_trace(go.Bar(y=labels, x=[real.get(label, 0) for label in labels],
                         name="real answers", orientation="h",
                         marker={"color": SIDE_COLOURS["proxy"]},
                         hovertemplate="%{y}<br>real answers: %{x:,}<extra></extra>"))
    colour_no = 0
    for r in rows:
        for status, n in sorted(r["statuses"].items()):
            name = f"injected {status} ({r['fault'] or 'rule not named'})"
            fig.add_trace(go.Bar(
                y=[f"{r['route']} {r['opcode']}"], x=[n], name=name, orientation="h",
                marker={"color": STATUS_COLOURS["timeout"] if colour_no == 0
                        else PALETTE[colour_no % len(PALETTE)]},
                hovertemplate="%{y}<br>" + _esc(name) + ": %{x:,}<extra></extra>"))
            colour_no += 1
    _layout(fig, "Answers per route and opcode a fault touched: real, and injected by the "
                 "proxy", "", barmode="stack", height=max(300, 140 + 28 * len(labels)))
    fig.update_layout(margin={"l": 260, "t": 90})
    fig.update_xaxes(title_text="answers")
    fig.update_yaxes(autorange="reversed")
    return fig


def faults_section(view):
    """The fault view, or '' when no fault touched the run (the section is left out)."""
    rows = fault_rows(view)
    if not rows:
        return "", None
    fig = faults_figure(rows)
    table = html_table(rows, ["route", "protocol", "opcode", "fault", "touched", "injected",
                              "status", "real_answers", "real_errors"],
                       ["route", "protocol", "opcode", "fault rule", "rows touched",
                        "injected replies", "injected status", "real answers",
                        "real errors"])
    note = ("Rows touched: frame-log rows with attrs.fault (the requests a rule delayed, "
            "dropped, closed or answered). Injected replies: rows with attrs.injected = "
            "\"1\" - answers the proxy made itself, counted by the proxy as answers with "
            "the injected status; real answers and real errors are the proxy's answers "
            "of that opcode on that route less the injected ones (faults.csv). An injected "
            "reply's row does not name its rule: it is the rule that touched that opcode "
            "when only one did.")
    return _section("faults", "Injected faults", _chart_or(fig, "faults", "") + table,
                    note), fig


# ---- 5. per-opcode percentiles, per-route time series -----------------------------------

def latency_figures(view):
    """{protocol or "all": dot-plot figure JSON} of p50/p90/p99/p99.9/max per opcode."""
    rows = [r for r in view.summary if r.get("p50_ms") is not None]
    if not rows:
        return {}, None
    groups = {"all protocols": rows}
    for r in rows:
        groups.setdefault(r["protocol"] or "-", []).append(r)
    out = {}
    for name, group in groups.items():
        group = sorted(group, key=lambda r: (r["protocol"] or "", r["opcode"] or "",
                                             r["source"] != "client", r["route"] or ""))
        labels = [_label(r) for r in group]
        fig = go.Figure()
        for key, q, symbol, colour in (("p50_ms", "p50", "circle", "#636efa"),
                                       ("p90_ms", "p90", "circle-open", "#19d3f3"),
                                       ("p99_ms", "p99", "diamond", "#ef553b"),
                                       ("p999_ms", "p99.9", "diamond-open", "#ffa15a"),
                                       ("max_ms", "max", "x", "#5a6478")):
            fig.add_trace(go.Scatter(
                y=labels, x=[r[key] for r in group], name=q, mode="markers",
                marker={"symbol": symbol, "size": 9, "color": colour},
                customdata=[[r["responses"]] for r in group],
                hovertemplate="%{y}<br>" + q + " %{x:.3f} ms<br>%{customdata[0]:,} answered"
                              "<extra></extra>"))
        height = max(280, 130 + 24 * len(group))
        _layout(fig, "Latency percentiles per opcode (route, opcode; client rows marked)",
                "", log=False, height=height)
        fig.update_xaxes(type="log", title_text="ms (log scale)")
        fig.update_yaxes(autorange="reversed", type="category")
        fig.update_layout(margin={"l": 280, "t": 90})
        out[name] = _figure_json(fig)
    default = "all protocols" if len(rows) <= 30 else sorted(k for k in out
                                                            if k != "all protocols")[0]
    return out, default


def latency_section(view):
    figures, default = latency_figures(view)
    if not figures:
        return _section("latency", "Latency percentiles per opcode",
                        '<p class="empty">No answered requests in these frame logs.</p>'), None
    options = "".join(f'<option value="{_esc(k)}"{" selected" if k == default else ""}>'
                      f'{_esc(k)}</option>' for k in
                      ["all protocols"] + sorted(k for k in figures if k != "all protocols"))
    body = (f'<div class="picker"><label for="latency-pick">protocol</label>'
            f'<select id="latency-pick">{options}</select></div>'
            f'<div class="chart" id="latency"></div>')
    script = {"id": "latency", "select": "latency-pick", "figures": figures}
    return _section("latency", "Latency percentiles per opcode", body,
                    "Per (route, opcode) of the request: p50, p90, p99, p99.9 and max on a "
                    "log scale; client-side rows are marked (client)."), script


def _series_by_route(series):
    grouped = {}
    for r in series:
        name = r.get("route") or r.get("protocol") or "-"
        grouped.setdefault((name, r["source"]), []).append(r)
    return sorted(grouped.items())


def time_figures(series, bucket_s):
    """Throughput, p99 and error ratio over time, one line per (route, source)."""
    if not series:
        return None, None, None
    per = "s" if bucket_s == 1 else f"{bucket_s} s"
    throughput, p99, errors = go.Figure(), go.Figure(), go.Figure()
    colours = {}
    for (route, source), rows in _series_by_route(series):
        name = route if source == "proxy" else f"{route} ({source})"
        dash = "solid" if source == "proxy" else "dot"
        colour = colours.setdefault(route, PALETTE[len(colours) % len(PALETTE)])
        x = [ns_to_text(r["bucket_s"] * 1_000_000_000, millis=False) for r in rows]
        throughput.add_trace(go.Scatter(
            x=x, y=[r["requests"] / bucket_s for r in rows], name=name, mode="lines",
            line={"dash": dash, "color": colour}, legendgroup=route,
            hovertemplate="%{x}<br>%{y:.1f} requests/s<extra>" + _esc(name) + "</extra>"))
        p99.add_trace(go.Scatter(
            x=x, y=[r["p99_ms"] for r in rows], name=name, mode="lines", connectgaps=False,
            line={"dash": dash, "color": colour}, legendgroup=route,
            hovertemplate="%{x}<br>p99 %{y:.3f} ms<extra>" + _esc(name) + "</extra>"))
        errors.add_trace(go.Scatter(
            x=x, y=[(r["errors"] / r["responses"]) if r["responses"] else None for r in rows],
            name=name, mode="lines", connectgaps=False, line={"dash": dash, "color": colour},
            legendgroup=route,
            hovertemplate="%{x}<br>%{y:.2%} of answers<extra>" + _esc(name) + "</extra>"))
    xt = f"time (UTC), per {per}"
    _layout(throughput, "Throughput per route (dotted: the clients' view)", "requests / s", xt)
    _layout(p99, "p99 latency per route", "ms", xt)
    _layout(errors, "Error ratio per route (error answers / answers)", "ratio", xt)
    errors.update_yaxes(tickformat=".1%", rangemode="tozero")
    answered = any(r["responses"] for r in series)
    return throughput, p99 if answered else None, errors if answered else None


def problems_figure(summary):
    rows = [r for r in summary if r.get("timeouts") or r.get("unmatched") or r.get("cut_off")]
    if not rows:
        return None
    labels = [_label(r) for r in rows]
    fig = go.Figure([
        go.Bar(x=labels, y=[r["timeouts"] for r in rows], name="timeouts",
               marker={"color": STATUS_COLOURS["timeout"]},
               hovertemplate="%{x}<br>%{y:,} timeouts<extra></extra>"),
        go.Bar(x=labels, y=[r.get("cut_off") or 0 for r in rows],
               name="cut off (connection closed first)",
               marker={"color": STATUS_COLOURS["closed"]},
               hovertemplate="%{x}<br>%{y:,} cut off<extra></extra>"),
        go.Bar(x=labels, y=[r["unmatched"] for r in rows], name="unmatched responses",
               marker={"color": "#ffa15a"},
               hovertemplate="%{x}<br>%{y:,} unmatched<extra></extra>"),
    ])
    return _layout(fig, "Timeouts and cut-offs (by request opcode), unmatched responses (by "
                        "their own opcode)", "count", barmode="group")


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


# ---- tables and page --------------------------------------------------------------------

def _cell(value):
    if value is None:
        return "<td></td>"
    if isinstance(value, bool):
        return f"<td>{'yes' if value else 'no'}</td>"
    if isinstance(value, float):
        return f'<td class="n">{value:,.3f}</td>'
    if isinstance(value, int):
        return f'<td class="n">{value:,}</td>'
    return f"<td>{_esc(value)}</td>"


def html_table(rows, columns, headings=None):
    head = "".join(f"<th>{_esc(h)}</th>" for h in (headings or columns))
    body = "\n".join("<tr>" + "".join(_cell(r.get(c)) for c in columns) + "</tr>"
                     for r in rows)
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>\n{body}\n</tbody></table></div>")


def _section(anchor, title, body, note=None):
    note = f'<p class="note">{_esc(note)}</p>' if note else ""
    return f'<section id="s-{anchor}"><h2>{_esc(title)}</h2>{note}{body}</section>'


#: the page's script: draws the selector charts and redraws them on a change
PAGE_SCRIPT = """
(function () {
  var config = %s;
  var pickers = JSON.parse(document.getElementById('frametap-pickers').textContent);
  pickers.forEach(function (p) {
    var select = document.getElementById(p.select);
    var draw = function (first) {
      var fig = p.figures[select.value];
      var div = document.getElementById(p.id);
      (first ? Plotly.newPlot : Plotly.react)(div, fig.data, fig.layout, config);
    };
    select.addEventListener('change', function () { draw(false); });
    draw(true);
  });
})();
"""


def render(data):
    """The report page (a str).  ``data``: ``meta``, ``summary``, ``series``,
    ``bucket_s``, ``slowest``, ``decomposition`` and, from this version's job, ``legs``,
    ``errors``, ``totals``, ``op_series``, ``op_bucket_s``, ``runs`` (see
    loadgen.analysis.job; the newer keys may be missing)."""
    view = View(data)
    meta = view.meta
    throughput, p99, errors = time_figures(view.series, view.bucket_s)
    problems = problems_figure(view.summary)
    decomposition = decomposition_figure(view.decomposition)

    opcode_html, opcode_script = opcode_section(view)
    latency_html, latency_script = latency_section(view)
    errors_html = errors_section(view)
    faults_html, faults_fig = faults_section(view)
    pickers = [p for p in (opcode_script, latency_script) if p]

    slow_cols = ["ts", "source", "route", "protocol", "opcode", "conn_id", "peer",
                 "correlation_id", "latency_ms", "status"]
    slow_rows = [dict(r, ts=ns_to_iso(r["ts_ns"])) for r in view.slowest]
    summary_cols = ["source", "route", "protocol", "opcode", "requests", "responses", "errors",
                    "error_ratio", "timeouts", "cut_off", "unmatched", "rate_per_s", "p50_ms",
                    "p90_ms", "p99_ms", "p999_ms", "max_ms", "frame_bytes", "messages"]
    no_data = "No answered requests in these frame logs."
    sections = [
        headline_section(view),
        ran_section(view),
        opcode_html,
        compare_section(view),
        errors_html,
        faults_html,
        latency_html,
        _section("time", "Throughput, p99 and error ratio per route",
                 _chart_or(throughput, "throughput", "No requests in these frame logs.") +
                 _chart_or(p99, "p99", no_data) + _chart_or(errors, "errors", no_data),
                 "One line per route; the clients' view of the same route dotted (a client "
                 "row's route is the proxy listener it connected to, named from the proxy's "
                 "run file)."),
        _section("problems", "Timeouts, cut-offs and unmatched responses",
                 _chart_or(problems, "problems",
                           "No timeouts, no cut-offs and no unmatched responses.")),
        _section("decomposition", "Client vs. proxy: where the time goes",
                 _chart_or(decomposition, "decomposition",
                           "No client-side frame logs could be paired with the proxy's "
                           "(pairs need source=client rows with the same protocol, peer "
                           "and correlation_id as a proxy response), so there is no "
                           "decomposition."),
                 "outside = client-observed latency minus the proxy's upstream latency, per "
                 "pair: the client, the proxy and the network between them."),
        _section("slowest", f"Slowest {len(slow_rows)} answered requests",
                 html_table(slow_rows, slow_cols) if slow_rows
                 else f'<p class="empty">{_esc(no_data)}</p>',
                 "Answered requests only (timeouts and cut-offs have no latency). ts is the "
                 "time of the row with the latency: for the proxy when the response passed, "
                 "for the client when the request started."),
        _section("summary", "Summary (summary.csv)",
                 html_table(view.summary, summary_cols) if view.summary
                 else '<p class="empty">No records.</p>'),
    ]
    # the charts in page order, for tests and tools that check the page
    charts = []
    if opcode_script:
        charts.append("opcode")
    if any(r["count"] for r in error_rows(view)):
        charts.append("errors-by-status")
    if faults_fig is not None:
        charts.append("faults")
    if latency_script:
        charts.append("latency")
    charts += [k for k, f in (("throughput", throughput), ("p99", p99), ("errors", errors),
                              ("problems", problems), ("decomposition", decomposition))
               if f is not None]
    span = "no records"
    if meta.get("first_ns") is not None:
        seconds = (meta["last_ns"] - meta["first_ns"]) / 1e9
        span = (f"{ns_to_text(meta['first_ns'], millis=False)} – "
                f"{ns_to_text(meta['last_ns'], millis=False)} UTC, {_duration(seconds)}")
    protocols = ", ".join(view.protocols())
    title = "frametap run report"
    subtitle = " · ".join(x for x in (protocols, span, f"{meta.get('records', 0):,} records")
                          if x)
    nav = "".join(f'<a href="#s-{a}">{_esc(t)}</a>' for a, t in (
        ("headline", "Headline"), ("ran", "What ran"), ("opcode", "Per opcode"),
        ("compare", "Client vs. proxy"), ("errors", "Errors"),
        *((("faults", "Faults"),) if faults_html else ()), ("latency", "Percentiles"),
        ("time", "Over time"), ("decomposition", "Decomposition"), ("slowest", "Slowest"),
        ("summary", "Summary")))
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)} – {_esc(protocols or 'no data')}</title>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<style>{CSS}</style>",
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>',
        "</head><body>",
        f"<header><h1>{_esc(title)}</h1><p>{_esc(subtitle)}</p></header>",
        f"<nav>{nav}</nav>",
        "<main>", *sections, "</main>",
        f'<script type="application/json" id="frametap-pickers">{_json(pickers)}</script>',
        f"<script>{PAGE_SCRIPT % _json(PLOT_CONFIG)}</script>",
        f'<script type="application/json" id="frametap-meta">'
        f"{json.dumps({'charts': charts})}</script>",
        "</body></html>",
    ])
