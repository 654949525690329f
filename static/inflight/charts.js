// Plotting helpers shared by the run page and the compare page: x axes, traces
// (min/max band + faint raw line + EMA-smoothed line) and the chart layout.
(function (root) {
  "use strict";
  var D = root.InflightDownsample;
  // Twelve distinct colours: a chart's series never share one below that (the lag-share chart
  // has nine: lag 0..7 and 8+).
  var PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#4b5563",
                 "#65a30d", "#92400e", "#1e3a8a", "#f472b6"];
  // Positive values spanning more than this ratio go on a log axis.
  var LOG_SPAN = 1000;

  function rgba(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + ((n >> 16) & 255) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  // x of each bucket: its last point's step, its wall time (minutes since the run's
  // first point), or samples seen (step x samples per optimizer step).
  function xValues(columns, axis, ctx) {
    if (axis === "time") return columns.t.map(function (t) { return (t - ctx.t0) / 60; });
    if (axis === "samples") return columns.step.map(function (s) { return s * ctx.samplesPerStep; });
    return columns.step;
  }

  function axisTitle(axis) {
    return axis === "time" ? "wall time (min)" : axis === "samples" ? "samples seen" : "trainer step";
  }

  function firstTime(state) {
    var t0 = Infinity;
    state.series.forEach(function (buckets) {
      buckets.forEach(function (bucket) { if (bucket[3] < t0) t0 = bucket[3]; });
    });
    return isFinite(t0) ? t0 : 0;
  }

  function seriesTraces(label, columns, axis, smoothing, color, ctx) {
    var x = xValues(columns, axis, ctx);
    var traces = [];
    var banded = columns.min.some(function (v, i) { return v !== columns.max[i]; });
    if (banded) {
      traces.push({ x: x, y: columns.min, mode: "lines", line: { width: 0, color: color }, hoverinfo: "skip", showlegend: false, legendgroup: label, name: label + " min" });
      traces.push({ x: x, y: columns.max, mode: "lines", line: { width: 0, color: color }, fill: "tonexty", fillcolor: rgba(color, 0.12), hoverinfo: "skip", showlegend: false, legendgroup: label, name: label + " max" });
    }
    var smooth = smoothing > 0 && columns.last.length > 1;
    traces.push({
      x: x, y: columns.last, mode: columns.last.length === 1 ? "markers" : "lines", name: label, legendgroup: label,
      showlegend: !smooth, line: { width: smooth ? 1 : 2, color: smooth ? rgba(color, 0.3) : color },
      marker: { color: color }, hovertemplate: label + ": %{y:.4g}<extra></extra>",
    });
    if (smooth) {
      traces.push({
        x: x, y: D.ema(columns.last, smoothing), mode: "lines", name: label, legendgroup: label,
        line: { width: 2, color: color }, hovertemplate: label + " (smoothed): %{y:.4g}<extra></extra>",
      });
    }
    return traces;
  }

  function layout(axis, yTitle) {
    return {
      margin: { l: 52, r: 12, t: 8, b: 40 }, height: 260,
      xaxis: { title: { text: axisTitle(axis), font: { size: 11 } }, zeroline: false, gridcolor: "#eef0f3" },
      yaxis: { title: { text: yTitle || "", font: { size: 11 } }, zeroline: false, gridcolor: "#eef0f3" },
      legend: { orientation: "h", y: -0.25, font: { size: 11 } },
      hovermode: "x unified", paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff",
      font: { family: "Inter, system-ui, sans-serif", size: 12, color: "#1f2937" },
    };
  }

  var CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };

  // What a chart's data asks of its layout, from the traces about to be drawn: a log y axis when
  // every value is positive and they span decades (a catch-all chart of metrics of different
  // scales, a throughput that starts near 0), and whether every series is constant (a panel that
  // would be a flat line: drawn small, after the others). `keepFull`: a learning signal's chart
  // (web/charts.py `learning_signal`) is never drawn small: a reward stuck at 0 is what to see first.
  function fitChart(layout, traces, keepFull) {
    var low = Infinity, high = -Infinity, flat = true, any = false, longest = 0;
    traces.forEach(function (trace) {
      var first = null;
      longest = Math.max(longest, (trace.y || []).length);
      (trace.y || []).forEach(function (v) {
        if (typeof v !== "number" || !isFinite(v)) return;
        any = true;
        if (v < low) low = v;
        if (v > high) high = v;
        if (first === null) first = v; else if (Math.abs(v - first) > 1e-12 * Math.max(1, Math.abs(first))) flat = false;
      });
    });
    var result = { log: any && low > 0 && high / low > LOG_SPAN, flat: !keepFull && any && flat && longest >= 3 };  // a young run's first points are not "flat"
    if (result.log) layout.yaxis.type = "log";
    if (result.flat) { layout.height = 130; layout.margin.b = 28; layout.showlegend = false; layout.xaxis.title = { text: "" }; }
    return result;
  }

  // Draw (or redraw) a chart card's plot, fitted to its data (fitChart): the run page and the
  // compare page both draw through here.
  function draw(plot, traces, layout, keepFull) {
    var fit = fitChart(layout, traces, keepFull);
    var card = plot.closest ? plot.closest(".chart-card") : null;
    if (card) {
      card.classList.toggle("chart-flat", fit.flat);
      card.classList.toggle("chart-log", fit.log);
    }
    return Plotly.react(plot, traces, layout, CONFIG);
  }

  // A chart card (title + plot div) appended to `container`; returns the plot div.
  function chartCard(container, id, title) {
    var card = document.createElement("section");
    card.className = "chart-card";
    card.id = "chart-" + id;
    var h = document.createElement("h3");
    h.textContent = title;
    var plot = document.createElement("div");
    plot.className = "plot";
    card.appendChild(h);
    card.appendChild(plot);
    container.appendChild(card);
    return plot;
  }

  function bindControls(onChange) {
    var slider = document.getElementById("smoothing");
    var label = document.getElementById("smoothing-value");
    var controls = { axis: "step", smoothing: slider ? parseFloat(slider.value) : 0 };
    document.querySelectorAll('input[name="xaxis"]').forEach(function (radio) {
      radio.addEventListener("change", function () { controls.axis = radio.value; onChange(); });
    });
    if (slider) {
      slider.addEventListener("input", function () {
        controls.smoothing = parseFloat(slider.value);
        label.textContent = controls.smoothing.toFixed(2);
        onChange();
      });
    }
    return controls;
  }

  root.InflightCharts = {
    PALETTE: PALETTE, rgba: rgba, xValues: xValues, firstTime: firstTime, seriesTraces: seriesTraces,
    layout: layout, CONFIG: CONFIG, chartCard: chartCard, bindControls: bindControls, axisTitle: axisTitle, fitChart: fitChart, draw: draw,
  };
})(window);
