// Compare page: every run's snapshot, brought onto one grid (the coarsest run's
// width: pairs of buckets merge exactly because widths are powers of two), one
// overlaid chart per selected metric.
(function () {
  "use strict";
  var D = window.InflightDownsample;
  var C = window.InflightCharts;
  var page = JSON.parse(document.getElementById("page-data").textContent);
  var chartsEl = document.getElementById("charts");
  var select = document.getElementById("metric-select");
  var states = [];
  var controls = C.bindControls(render);
  var DEFAULTS = ["success/mean", "reward/mean", "success/heldout", "rollout/tokens_per_s", "policy_lag/max"];

  Promise.all(page.runs.map(function (run) {
    return fetch(run.snapshot_url, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) throw new Error("run " + run.id + ": HTTP " + r.status);
      return r.json();
    });
  })).then(function (snapshots) {
    states = snapshots.map(function (s) { return D.State.fromSnapshot(s); });
    var shared = Math.max.apply(null, states.map(function (s) { return s.shift; }));
    states.forEach(function (s) { s.coarsenTo(shared); });
    var names = new Set();
    states.forEach(function (s) { s.series.forEach(function (_, name) { names.add(name); }); });
    var sorted = Array.from(names).sort();
    select.size = Math.min(8, Math.max(3, sorted.length));
    sorted.forEach(function (name) {
      var option = document.createElement("option");
      option.value = name; option.textContent = name;
      option.selected = DEFAULTS.indexOf(name) >= 0;
      select.appendChild(option);
    });
    if (!select.selectedOptions.length && sorted.length) select.options[0].selected = true;
    select.addEventListener("change", render);
    render();
  }).catch(function (error) {
    chartsEl.innerHTML = '<p class="error-text"></p>';
    chartsEl.firstChild.textContent = String(error);
  });

  function render() {
    var chosen = Array.from(select.selectedOptions).map(function (o) { return o.value; });
    chartsEl.innerHTML = "";
    if (!chosen.length) { chartsEl.innerHTML = '<p class="muted">Pick one or more metrics.</p>'; return; }
    chosen.forEach(function (name, i) {
      var plot = C.chartCard(chartsEl, "cmp-" + i, name);
      var traces = [];
      states.forEach(function (state, r) {
        var run = page.runs[r];
        var ctx = { t0: C.firstTime(state), samplesPerStep: run.samples_per_step };
        var columns = state.columns(name);
        if (!columns.b.length) return;
        traces = traces.concat(C.seriesTraces("#" + run.id + " " + run.name, columns, controls.axis, controls.smoothing, C.PALETTE[r % C.PALETTE.length], ctx));
      });
      Plotly.react(plot, traces, C.layout(controls.axis, ""), C.CONFIG);
    });
  }
})();
