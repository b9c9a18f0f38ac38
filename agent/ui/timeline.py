"""The three clocks as a picture: one bar per step against the deadline and the job timeout.

`timeline_rows` is pure (steps + a turn summary -> rows); `timeline_chart` turns them into a Vega-Lite spec.
"""

from __future__ import annotations

from agent.contract import Kind, Outcome, Step, TurnSummary
from agent.spend import money

KIND_LABELS = {Kind.MODEL: "model call", Kind.TOOL: "tool run", Kind.RETRY: "retry wait", Kind.SKIP: "skipped call",
               Kind.RESUME: "worker lost, resumed", Kind.APPROVAL: "waiting for a person"}
TIMEOUT_LABEL = "timeout it was given"
RUNNING_LABEL = "running now"
COLOURS = {  # colour-blind friendly, and failures stand out
    "model call": "#4C78A8",
    "tool run": "#54A24B",
    "retry wait": "#B279A2",
    "skipped call": "#9D755D",
    "worker lost, resumed": "#BAB0AC",
    "waiting for a person": "#EECA3B",
    "timed out": "#E45756",
    "failed": "#F58518",
    RUNNING_LABEL: "#72B7B2",
    TIMEOUT_LABEL: "#D3D8DE",
}
MIN_BAR_FRACTION = 0.006  # of the x range: a 3 ms step still shows as a sliver
# The clocks' labels, in a band above the bars: each in the first row where it meets no other label. Whether two
# meet is judged on the narrowest plot the page draws (the widest estimate of each label), so they never do.
LABEL_FONT_PX = 12
LABEL_ROW_PX = 18  # one row of labels: a 12 px bold line, whatever the browser's font, and a gap
LABEL_CHAR_PX = 8.0  # at most, for a character of a 12 px bold label
LABEL_DX_PX = 5  # a label ends this far left of its line
LABEL_GAP_PX = 8  # the least room between two labels of one row
# The plot's width (the chart's, less the steps' labels on its left, up to 220 px) in the narrowest chart the page
# is meant for: a 1024 px window with the sidebar open.
NARROWEST_PLOT_PX = 320
LEGEND_COLUMNS = 2  # the legend's entries a row: two of its longest fit the narrowest plot (five ran past it)
LEGEND_ENTRY_PX = 20 + 7 * len("worker lost, resumed")  # a symbol and the longest label, at the legend's 11 px
VEGA_LITE_SCHEMA = "https://vega.github.io/schema/vega-lite/v6.4.1.json"  # the version Streamlit draws
CHART_TITLE = "How this turn used its time"
CHART_SUBTITLE = [
    "Each coloured bar is one step; the grey bar behind it is the timeout that step was given.",
    "The turn stops itself at its deadline (orange line); the queue kills the job at the job timeout (red line).",
    "The shaded margin between them is kept free, so the turn can always write how it ended.",
]
APPROVAL_SUBTITLE = [  # lines no longer than the ones above: the title is cut at the chart's width
    "The wait for a person's answer ran outside both jobs' clocks: the job that asked had ended,",
    "and the next one started on a fresh set of clocks (job 1's, then job 2's, ...).",
]


def cost_label(step: Step) -> str:
    """A model call's cost and its max_tokens, as its tooltip shows them ("" for other steps)."""
    if step.get("kind") != Kind.MODEL or step.get("cost_tokens") is None:
        return ""
    cost = money(step["cost_usd"]) if step.get("cost_usd") is not None else f"{step['cost_tokens']:,} tokens"
    worst = " (worst case)" if step.get("cost_worst") else ""
    limit = f", max_tokens {step['max_tokens']:,}" if step.get("max_tokens") is not None else ""
    return f"{cost}{worst}{limit}"


def _what(step: Step) -> str:
    if step["kind"] == Kind.SKIP:
        return KIND_LABELS[Kind.SKIP]
    if step["outcome"] == Outcome.TIMEOUT:
        return "timed out"
    if step["outcome"] == Outcome.ERROR:
        return "failed"
    return KIND_LABELS.get(step["kind"], step["kind"] or "step")


def _label(number: int, step: Step) -> str:
    kind, name = step["kind"], step["name"] or ""
    attempt = step.get("attempt") or 1
    labels = {
        Kind.MODEL: "model call" + (f" (try {attempt})" if attempt > 1 else ""),
        Kind.TOOL: name,
        Kind.RETRY: f"wait before {name}",
        Kind.SKIP: "call skipped",
        Kind.RESUME: f"worker lost: resume {step.get('attempt')}",
        Kind.APPROVAL: f"asks first: {name} ({step.get('outcome')})",
    }
    return f"{number}. {labels.get(kind, name or kind)}"


def parked_jobs(steps: list[Step]) -> list[Step]:
    """The answers to requests for approval: each ended one job's clocks (it parked the turn) and the
    next job started a fresh set, so a turn with n of them ran in n + 1 jobs."""
    return [s for s in steps if s.get("kind") == Kind.APPROVAL]


def origin(summary: TurnSummary, steps: list[Step]) -> float | None:
    """When the turn's first job started: the summary's start, unless a request for approval moved it to
    a later job; then the first job's start, from its job timeout (start + job timeout) as its answer
    recorded it, or its first step."""
    parked = parked_jobs(steps)
    if not parked:
        return summary.get("started_at")
    job_timeout_s = (summary.get("config") or {}).get("job_timeout_s")
    first_kill = parked[0].get("job_timeout_at")
    if first_kill and isinstance(job_timeout_s, int | float):
        return first_kill - job_timeout_s
    starts = [s["started_at"] for s in steps if s.get("started_at")] + [summary.get("started_at")]
    return min((t for t in starts if t), default=None)


def horizon_s(summary: TurnSummary, steps: list[Step], now: float | None = None) -> float:
    """The x range: up to the (last) job timeout, or further if something ran past it."""
    t0 = origin(summary, steps) or 0.0
    ends = [s.get("ended_at") or t0 for s in steps]
    clocks = [s.get(name) for s in parked_jobs(steps) for name in ("deadline_at", "job_timeout_at")]
    candidates = [summary.get("job_timeout_at"), summary.get("deadline_at"), summary.get("ended_at"), now, *ends,
                  *clocks]
    span = max((c - t0 for c in candidates if c), default=1.0)
    return max(span, 1.0)


def timeline_rows(steps: list[Step], summary: TurnSummary, *, now: float | None = None,
                  current: dict | None = None) -> list[dict]:
    """Two rows per step (the timeout it got, and what it took), in seconds since the turn started."""
    t0 = origin(summary, steps)
    if not t0:
        return []
    horizon = horizon_s(summary, steps, now)
    rows = []
    items = list(steps)
    if current and current.get("kind") and now:
        items.append({**current, "ended_at": now, "outcome": "running", "_running": True})
    for number, step in enumerate(items, start=1):
        start = max(0.0, (step["started_at"] or t0) - t0)
        end = max(start, (step["ended_at"] or t0) - t0)
        timeout_s = step["timeout_s"]
        what = RUNNING_LABEL if step.get("_running") else _what(step)
        label = _label(number, step)
        common = {
            "step": label,
            "order": number,
            "start_s": round(start, 3),
            "took_s": round(end - start, 3),
            "timeout_s": timeout_s,
            "detail": step.get("detail") or "",
            "cost": cost_label(step),
        }
        if timeout_s:
            rows.append({**common, "what": TIMEOUT_LABEL, "layer": "timeout",
                         "end_s": round(min(start + timeout_s, horizon * 1.02), 3)})
        rows.append({**common, "what": what, "layer": "step",
                     "end_s": round(max(end, start + horizon * MIN_BAR_FRACTION), 3)})
    return rows


def clock_rules(summary: TurnSummary, steps: list[Step] = (), domain_end: float | None = None) -> list[dict]:
    """Each job's deadline and job timeout: one job's, or, when the turn waited for a person, the clocks of
    each job that parked it (from its answer's step) and then the current job's (the summary's). Each rule's
    label is placed in a row of its own where it would meet another (`y_px`, see `label_rows`), on an x range
    of `domain_end` seconds (the chart's; by default the whole turn's)."""
    t0 = origin(summary, list(steps))
    if not t0:
        return []
    jobs = [*parked_jobs(list(steps)), summary]
    rules = []
    for number, clocks in enumerate(jobs, start=1):
        suffix = f" (job {number})" if len(jobs) > 1 else ""
        if clocks.get("deadline_at"):
            rules.append({"at_s": round(clocks["deadline_at"] - t0, 3), "clock": "deadline" + suffix,
                          "colour": "#D67500", "job": number})
        if clocks.get("job_timeout_at"):
            rules.append({"at_s": round(clocks["job_timeout_at"] - t0, 3), "clock": "job timeout" + suffix,
                          "colour": "#C0392B", "job": number})
    span = domain_end or horizon_s(summary, list(steps)) * 1.03
    for rule, row in zip(rules, label_rows(rules, span), strict=True):
        rule["y_px"] = 2 + LABEL_ROW_PX * row
    return rules


def label_extent_px(rule: dict, span_s: float) -> tuple[float, float]:
    """Where a rule's label lies, left and right, in pixels of the narrowest plot: it ends LABEL_DX_PX left of its
    line (right-aligned), and is as wide as its text could be."""
    right = rule["at_s"] / max(span_s, 1e-9) * NARROWEST_PLOT_PX - LABEL_DX_PX
    return right - LABEL_CHAR_PX * len(rule["clock"]), right


def label_rows(rules: list[dict], span_s: float) -> list[int]:
    """A row for each rule's label, in the rules' order: the first row (from the top) where it meets no label
    already placed, so that labels that would collide are placed apart, and a chart of one job keeps its
    two rows (its deadline's and its job timeout's)."""
    placed: list[list[tuple[float, float]]] = []
    rows = []
    for rule in rules:
        left, right = label_extent_px(rule, span_s)
        row = next((n for n, taken in enumerate(placed)
                    if all(right + LABEL_GAP_PX <= a or b + LABEL_GAP_PX <= left for a, b in taken)), len(placed))
        if row == len(placed):
            placed.append([])
        placed[row].append((left, right))
        rows.append(row)
    return rows


def timeline_chart(steps: list[Step], summary: TurnSummary, *, now: float | None = None, current: dict | None = None,
                   zoom: bool = False) -> dict | None:
    """The Vega-Lite spec, written as the dict it is: building it through Altair (and its schema
    validation) took 170-280 ms a chart, most of a page run; this takes well under a millisecond.
    `tests/test_app.py` validates it against Vega-Lite's schema."""
    rows = timeline_rows(steps, summary, now=now, current=current)
    if not rows:
        return None
    t0 = origin(summary, steps)
    if zoom:
        last = max(r["start_s"] + r["took_s"] for r in rows)
        domain_end = max(last * 1.15, 0.05)
    else:
        domain_end = horizon_s(summary, steps, now) * 1.03
    rules = clock_rules(summary, steps, domain_end)
    label_rows_n = 1 + max((r["y_px"] - 2) // LABEL_ROW_PX for r in rules) if rules else 0
    x_scale = {"domain": [0, domain_end], "nice": False}
    order = [r["step"] for r in rows if r["layer"] == "step"]
    jobs = len(parked_jobs(steps)) + 1
    parked = jobs > 1
    bar_encoding = _bar_encoding(rows, order, x_scale, jobs, label_rows_n)
    timeouts = [r for r in rows if r["layer"] == "timeout"]
    timeout_mark = {"type": "bar", "size": 20, "opacity": 0.8, "clip": True}
    layers = [_layer(timeouts, timeout_mark, bar_encoding)] if timeouts else []
    layers.append(_layer([r for r in rows if r["layer"] == "step"],
                         {"type": "bar", "size": 11, "clip": True, "cornerRadius": 2}, bar_encoding))
    layers = _clock_layers(rules, x_scale, layers)
    if now is not None:
        layers.append(_layer([{"at_s": round(now - t0, 3)}], {"type": "rule", "color": "#333", "strokeWidth": 1.5,
                                                              "clip": True}, {"x": _at_x("at_s", x_scale)}))
    # Streamlit fits title, legend and axes inside this height, so it counts them too.
    return {
        "$schema": VEGA_LITE_SCHEMA,
        "config": {"view": {"continuousWidth": 300, "continuousHeight": 300}},
        "layer": layers,
        "height": 220 + 36 * len(order) + LABEL_ROW_PX * max(0, label_rows_n - 2) + 16 * legend_rows(rows),
        "title": {"text": CHART_TITLE, "subtitle": CHART_SUBTITLE + APPROVAL_SUBTITLE * parked, "anchor": "start",
                  "subtitleColor": "#555"},
    }


def _layer(values: list[dict], mark: dict, encoding: dict) -> dict:
    return {"data": {"values": values}, "mark": mark, "encoding": encoding}


def _at_x(field: str, x_scale: dict) -> dict:
    return {"field": field, "type": "quantitative", "scale": x_scale}


def legend_rows(rows: list[dict]) -> int:
    """How many rows the legend takes, LEGEND_COLUMNS entries a row."""
    return -(-len({r["what"] for r in rows}) // LEGEND_COLUMNS)


def _bar_encoding(rows: list[dict], order: list[str], x_scale: dict, jobs: int = 1, label_rows_n: int = 2) -> dict:
    """One bar per row, on its step's line, coloured by what it was (the legend lists only those present, in
    as many columns as fit the narrowest plot: five of them ran past its right edge, and the last was cut)."""
    present = {r["what"] for r in rows}
    legend_domain = [k for k in COLOURS if k in present]
    colour = {"field": "what", "type": "nominal", "title": None,
              "scale": {"domain": legend_domain, "range": [COLOURS[k] for k in legend_domain]},
              "legend": {"orient": "bottom", "columns": LEGEND_COLUMNS, "symbolType": "square",
                         "labelLimit": LEGEND_ENTRY_PX - 20}}
    # The outer padding leaves a free band at the top for the clocks' labels: 0.45 of a step's band a row (two
    # rows, a chart of one job's, were 0.9).
    y = {"field": "step", "type": "nominal", "sort": order, "title": None,
         "axis": {"labelLimit": 220, "ticks": False},
         "scale": {"paddingInner": 0.25, "paddingOuter": 0.45 * max(2, label_rows_n)}}
    tooltip = [
        {"field": "step", "type": "nominal", "title": "step"},
        {"field": "what", "type": "nominal", "title": "kind"},
        {"field": "start_s", "type": "quantitative", "title": "started at (s)", "format": ".2f"},
        {"field": "took_s", "type": "quantitative", "title": "took (s)", "format": ".3f"},
        {"field": "timeout_s", "type": "quantitative", "title": "timeout (s)", "format": ".1f"},
        {"field": "cost", "type": "nominal", "title": "cost"},
        {"field": "detail", "type": "nominal", "title": "detail"},
    ]
    since = "the first job started" if jobs > 1 else "the job started"
    x = {"field": "start_s", "type": "quantitative", "scale": x_scale, "title": f"seconds since {since}"}
    return {"x": x, "x2": {"field": "end_s"}, "y": y, "color": colour, "tooltip": tooltip}


def _clock_layers(rules: list[dict], x_scale: dict, bars: list[dict]) -> list[dict]:
    """The bars with the clocks: the margin between deadline and job timeout shaded behind them, a
    dashed line and a label at each clock in front."""
    layers = list(bars)
    margins = [{"from": a["at_s"], "to": b["at_s"]} for a, b in zip(rules, rules[1:], strict=False)
               if a["job"] == b["job"] and a["clock"].startswith("deadline") and b["clock"].startswith("job timeout")]
    if margins:  # each job's margin, shaded behind the bars
        layers.insert(0, _layer(margins, {"type": "rect", "color": "#F2A65A", "opacity": 0.13, "clip": True},
                                {"x": _at_x("from", x_scale), "x2": {"field": "to"}}))
    for rule in rules:
        layers.append(_layer([rule], {"type": "rule", "strokeDash": [6, 3], "strokeWidth": 2, "clip": True,
                                      "color": rule["colour"]}, {"x": _at_x("at_s", x_scale)}))
        layers.append(_layer([rule], {"type": "text", "align": "right", "baseline": "top", "dx": -LABEL_DX_PX,
                                      "y": rule["y_px"], "fontSize": LABEL_FONT_PX, "fontWeight": "bold",
                                      "color": rule["colour"]},
                             {"x": _at_x("at_s", x_scale), "text": {"field": "clock", "type": "nominal"}}))
    return layers
