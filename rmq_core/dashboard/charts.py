"""The console's plots: time series (history.py) drawn as SVG line charts by pygal, server side, so
the page needs no script library and nothing is fetched from the internet (pygal's own tooltip
script, which it would load from a CDN, is left out)."""
from __future__ import annotations

import datetime

import pygal
from pygal.style import Style

_STYLE = Style(background="#fff", plot_background="#fff", foreground="#4a5568", foreground_strong="#1d2330",
               foreground_subtle="#edf0f3", opacity=".9", font_family="system-ui, sans-serif",
               colors=("#2d5283", "#1e6b34", "#b42318", "#8a5a00", "#6b46c1", "#0f766e", "#9d174d", "#475569"))


def line_chart(title: str, series: dict[str, list], y_title: str, empty: str) -> str:
    """An SVG line chart of `series` (name -> [(epoch s, value), ...]); `empty` is shown when no
    series has a point yet."""
    chart = pygal.DateTimeLine(
        title=title, y_title=y_title, style=_STYLE, js=[], disable_xml_declaration=True, width=640, height=300,
        show_dots=False, stroke_style={"width": 2}, legend_at_bottom=True, truncate_legend=40, min_scale=1,
        x_label_rotation=0, show_minor_x_labels=False, x_labels_major_count=6, include_x_axis=True,
        no_data_text=empty, x_value_formatter=lambda d: d.strftime("%H:%M:%S"))
    for name, points in series.items():
        chart.add(name, [(datetime.datetime.fromtimestamp(t), v) for t, v in points])
    return chart.render(is_unicode=True)
