"""The run's interactive report: one self-contained Plotly HTML file.

Six panels on one time axis, every contender of the run overlaid:

1. load: requests arriving per second, and what the planner observed and
   predicted at its throughput ticks;
2. replicas per role (ready) over time;
3. TTFT: observed p50/p90 per window, the planner's estimate at its load
   ticks, and the SLA target;
4. ITL: the same;
5. SLA attainment per window;
6. GPU cost: GPU-hours spent so far.

The plotly.js bundle is embedded, so the file opens offline.
"""

from __future__ import annotations

import math
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fleetplan.sim.forecast_check import BASIS_TEXT
from fleetplan.sim.metrics import windowed
from fleetplan.sim.retune import describe_changes
from fleetplan.sim.runner import RunResult

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"]
_DASH = {"prefill": "solid", "decode": "dash", "agg": "solid"}


def write_report(
    path: str | Path,
    results: list[RunResult],
    ttft_ms: float,
    itl_ms: float,
    window_s: float,
    arrivals: list[tuple[float, int] | tuple[float, int, float]],
    title: str,
    sized_basis: str = "requests",
) -> Path:
    """``results[0]`` is the main policy; ``arrivals`` is (window start, count) per window, or
    (window start, count, seconds the window covers) where the last one is cut short.
    ``sized_basis`` is the main run's ``quantile_basis``: with ``tokens`` its sized-for lines
    are of the roles' tokens, in requests of the forecast lengths, and say so; with
    ``floor_tokens`` the sized-for line is the larger of the count's and prefill's prompt tokens'."""
    horizon = max(r.end_s for r in results)
    fig = make_subplots(
        rows=6, cols=1, shared_xaxes=True, vertical_spacing=0.035,
        subplot_titles=(
            "Load (requests/s)", "Ready replicas per role", "TTFT (ms)", "ITL (ms)",
            "SLA attainment per window", "GPU-hours spent",
        ),
    )
    minutes = [a[0] / 60.0 for a in arrivals]
    # a window's rate over the time it covers: a last window cut short by the end of the
    # trace read as a full one looked like half its load
    rates = [a[1] / (a[2] if len(a) > 2 and a[2] > 0 else window_s) for a in arrivals]
    fig.add_trace(go.Bar(
        x=minutes, y=rates, name="arrivals/s",
        marker_color="#bbbbbb", legendgroup="load", offset=0, width=window_s / 60.0,
    ), row=1, col=1)
    main = results[0]
    # the planner's view of the load; "sized-for" is what the throughput loop sized the fleet
    # for: the upper quantile of the busiest burst window over the startup horizon, above the point;
    # "window sized-for" the window count's, which prefill's rate count sizes for (burst_sizing: queueing)
    tokens = sized_basis == "tokens"
    sized_of = f"; {BASIS_TEXT[sized_basis]}" if sized_basis in BASIS_TEXT else ""
    for key, name, color, dash in (
        ("observed_rps", "observed rps (planner)", "#444444", "dot"),
        ("predicted_rps", "predicted rps (planner)", "#1f77b4", "dash"),
        ("sized_rps", f"sized-for rps (planner{sized_of})", "#d62728", "dash"),
        ("window_sized_rps", "window sized-for rps (prefill rate count" + ("; prompt tokens)" if tokens else ")"),
         "#ff7f0e", "dot"),
    ):
        pts = _series(main.ticks, key, "throughput_reason")
        if pts:
            fig.add_trace(_line(pts, name, color, dash, "load"), row=1, col=1)

    for i, result in enumerate(results):
        color = _COLORS[i % len(_COLORS)]
        tl = result.timeline.to_dict()
        for role in result.timeline.roles:
            fig.add_trace(go.Scatter(
                x=[t / 60.0 for t in tl["t"]] + [result.end_s / 60.0],
                y=tl[f"{role}_ready"] + tl[f"{role}_ready"][-1:],
                mode="lines", line={"shape": "hv", "color": color, "dash": _DASH[role]},
                name=f"{result.policy} {role}", legendgroup=result.policy,
            ), row=2, col=1)
        w = windowed(result.requests, window_s, horizon, ttft_ms, itl_ms)
        wm = [t / 60.0 for t in w["t"]]
        width = 2 if i == 0 else 1
        fig.add_trace(go.Scatter(x=wm, y=w["ttft_p90"], mode="lines", name=f"{result.policy} TTFT p90",
                                 line={"color": color, "width": width}, legendgroup=result.policy), row=3, col=1)
        fig.add_trace(go.Scatter(x=wm, y=w["itl_p90"], mode="lines", name=f"{result.policy} ITL p90",
                                 line={"color": color, "width": width}, legendgroup=result.policy), row=4, col=1)
        if i == 0:
            fig.add_trace(go.Scatter(x=wm, y=w["ttft_p50"], mode="lines", name=f"{result.policy} TTFT p50",
                                     line={"color": color, "dash": "dot"}, legendgroup=result.policy), row=3, col=1)
            fig.add_trace(go.Scatter(x=wm, y=w["itl_p50"], mode="lines", name=f"{result.policy} ITL p50",
                                     line={"color": color, "dash": "dot"}, legendgroup=result.policy), row=4, col=1)
        fig.add_trace(go.Scatter(x=wm, y=w["attainment"], mode="lines+markers", name=f"{result.policy} attainment",
                                 line={"color": color, "width": width}, legendgroup=result.policy), row=5, col=1)
        fig.add_trace(go.Scatter(
            x=[t / 60.0 for t in tl["t"]] + [result.end_s / 60.0],
            y=[s / 3600.0 for s in result.timeline.cumulative_gpu_seconds(result.end_s)],
            mode="lines", name=f"{result.policy} GPU-h", line={"color": color, "width": width},
            legendgroup=result.policy,
        ), row=6, col=1)

    for role in main.timeline.roles:
        # the load loop alone keeps each role at or above what the measured traffic needs
        floor = _series(main.ticks, f"{role}_measured_floor", "load_reason")
        if floor:
            fig.add_trace(_line(floor, f"measured floor ({role})", "#9467bd", "dot", "estimates"), row=2, col=1)
    for d in main.retune or []:
        # a retune decision that changed the planner's settings: from the next tick on
        if d["outcome"] == "applied":
            text = "retune: " + describe_changes(d["changes"])
            fig.add_vline(x=d["decided_at"] / 60.0, line={"color": "#8c564b", "dash": "dot"}, row=2, col=1,
                          annotation_text=text, annotation_position="top left")
    for key, row in (("est_ttft_ms", 3), ("est_itl_ms", 4)):
        for role in main.timeline.roles:
            pts = _series(main.ticks, f"{role}_{key}", "load_reason")
            if pts:
                fig.add_trace(_line(pts, f"planner estimate ({role})", "#17becf", "dashdot", "estimates"), row=row, col=1)
    for value, row, label in ((ttft_ms, 3, "TTFT SLA"), (itl_ms, 4, "ITL SLA")):
        fig.add_hline(y=value, line={"color": "black", "dash": "dash"}, row=row, col=1)
        # on a log axis an annotation's y is the log of its position (a line's is not): given
        # as the value, add_hline's own label put the ITL axis's top at 10^50
        fig.add_annotation(text=label, x=1, xref="x domain", y=math.log10(value), row=row, col=1,
                           showarrow=False, xanchor="right", yanchor="bottom")
    fig.update_yaxes(type="log", row=3, col=1)
    fig.update_yaxes(type="log", row=4, col=1)
    fig.update_yaxes(range=[0, 1.02], row=5, col=1)
    fig.update_xaxes(title_text="minutes", row=6, col=1)
    fig.update_layout(title=title, height=1700, template="plotly_white", hovermode="x unified")
    path = Path(path)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


def _series(ticks: list[dict], key: str, loop: str) -> list[tuple[float, float | None]]:
    """``key`` at every tick where ``loop`` (the tick row's reason column) ran: None where it
    ran and had no value (the load loop waiting on a decision in flight), so the line breaks
    there; a line joining the ticks that had one drew minutes of estimates the planner never
    made. Empty when no tick has one."""
    idle = (None, "not_due", "disabled")
    pts = [(t["t"], t.get(key)) for t in ticks if key in t or t.get(loop) not in idle]
    return pts if any(v is not None for _, v in pts) else []


def _line(points, name, color, dash, group):
    return go.Scatter(
        x=[t / 60.0 for t, _ in points], y=[v for _, v in points], mode="lines+markers",
        name=name, line={"color": color, "dash": dash}, legendgroup=group,
    )
