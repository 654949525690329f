// Run page: the Timeline tab. Spans of every process (timeline.json: each lane's new lines since the
// byte offsets sent), drawn as a Gantt chart with plotly (one row per server, trainer rank and actor
// slot); polled every few seconds while the run runs and the tab is open. Below it the policy lag
// predicted before launch against the lag the run measured (lag.json).
(function () {
  "use strict";
  var panel = document.getElementById("timeline-panel");
  if (!panel) return;
  var POLL_MS = 3000;
  var LAG_POLL_MS = 15000;
  var ACTOR_ROWS = 12; // groups in flight are packed into at most this many rows
  var COLOURS = {
    decode: "#2563eb", pause: "#dc2626", wait: "#d1d5db", forward_backward: "#f59e0b", optimizer: "#7c3aed",
    broadcast: "#16a34a", checkpoint: "#92400e", group: "#93c5fd", zero_advantage: "#f87171", deferred: "#facc15",
    empty: "#9ca3af", truncated: "#000000",
  };
  var LABELS = {
    decode: "decode", pause: "pause (weight update)", wait: "waiting for samples", forward_backward: "forward/backward",
    optimizer: "optimizer", broadcast: "broadcast", checkpoint: "checkpoint", group: "group (written)",
    zero_advantage: "group dropped: zero advantage", deferred: "group deferred (tail batching)", empty: "group empty",
    truncated: "lane capped here",
  };
  var offsets = {};
  var lanes = {}; // lane -> {role, node}
  var spans = [];
  var live = true;
  var pollTimer = null;
  var lagTimer = null;
  var drawn = false;
  var chart = document.getElementById("timeline-chart");
  var select = document.getElementById("timeline-update");

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (!r.ok) throw new Error(url + " → " + r.status);
      return r.json();
    });
  }

  function visible() { return !panel.classList.contains("hidden"); }

  function laneLabel(lane) {
    var meta = lanes[lane] || {};
    return (meta.node === null || meta.node === undefined ? "" : "node" + meta.node + " · ") + lane;
  }

  function fetchSpans() {
    var pairs = Object.keys(offsets).map(function (lane) { return lane + ":" + offsets[lane]; });
    return getJSON(panel.dataset.timelineUrl + "?offsets=" + encodeURIComponent(pairs.join(","))).then(function (data) {
      data.lanes.forEach(function (meta) { lanes[meta.lane] = meta; });
      Object.keys(data.offsets).forEach(function (lane) { offsets[lane] = data.offsets[lane]; });
      spans = spans.concat(data.spans);
      live = data.live;
      if (data.more) return fetchSpans();
      return null;
    });
  }

  // Rows: servers, then trainer ranks (in the order the server answered), then actor slots.
  function rows() {
    var order = Object.keys(lanes);
    var out = [];
    order.forEach(function (lane) { if (lanes[lane].role !== "actor") out.push(laneLabel(lane)); });
    return out;
  }

  function actorRows(groupSpans) {
    // Greedy interval packing: each group on the first row free at its launch.
    var ends = [];
    var label = laneLabel("actor");
    return groupSpans.map(function (s) {
      var row = ends.findIndex(function (end) { return end <= s.start; });
      if (row < 0) { row = ends.length < ACTOR_ROWS ? ends.length : ends.indexOf(Math.min.apply(null, ends)); }
      ends[row] = s.end;
      return label + " " + (row + 1);
    });
  }

  function hover(s) {
    var parts = [LABELS[s.reason || s.kind] || s.kind, (s.end - s.start).toFixed(3) + " s"];
    if (s.version !== undefined) parts.push("version " + s.version);
    if (s.kind === "decode") parts.push(s.count + " steps, up to " + s.running + " sequences in flight");
    if (s.kind === "group") parts.push(s.count + " samples");
    return parts.join("<br>");
  }

  function render() {
    var empty = spans.length === 0;
    document.getElementById("timeline-empty").classList.toggle("hidden", !empty);
    chart.classList.toggle("hidden", empty);
    document.getElementById("timeline-live").classList.toggle("hidden", !live);
    if (empty || !window.Plotly) return;
    var traces = {};
    var drops = { x: [], y: [], text: [] };
    var groups = spans.filter(function (s) { return s.kind === "group"; }).sort(function (a, b) { return a.start - b.start; });
    var groupRows = actorRows(groups);
    function add(key, s, y) {
      var t = traces[key] || (traces[key] = { base: [], x: [], y: [], text: [], running: [] });
      t.base.push(new Date(s.start * 1000).toISOString());
      t.x.push(Math.max(1, (s.end - s.start) * 1000));
      t.y.push(y);
      t.text.push(hover(s));
      t.running.push(s.running || 0);
    }
    spans.forEach(function (s) {
      if (s.kind === "group") return;
      if (s.kind === "drop") {
        drops.x.push(new Date(s.start * 1000).toISOString()); drops.y.push(laneLabel(s.lane));
        drops.text.push(s.count + " samples dropped: " + s.reason);
        return;
      }
      add(s.kind, s, laneLabel(s.lane));
    });
    groups.forEach(function (s, i) { add(s.reason || "group", s, groupRows[i]); });
    var maxRunning = Math.max.apply(null, [1].concat((traces.decode || { running: [] }).running));
    var data = Object.keys(traces).map(function (key) {
      var t = traces[key];
      var colour = key === "decode"
        ? t.running.map(function (r) { return "rgba(37, 99, 235, " + (0.3 + 0.7 * r / maxRunning).toFixed(2) + ")"; })
        : COLOURS[key] || "#6b7280";
      return {
        type: "bar", orientation: "h", name: LABELS[key] || key, base: t.base, x: t.x, y: t.y, hovertext: t.text,
        hoverinfo: "text", marker: { color: colour, line: { width: 0 } }, width: key === "pause" ? 0.9 : 0.6,
      };
    });
    if (drops.x.length) {
      data.push({ type: "scatter", mode: "markers", name: "dropped as stale", x: drops.x, y: drops.y, hovertext: drops.text,
                  hoverinfo: "text", marker: { symbol: "x", size: 10, color: "#b91c1c" } });
    }
    var categories = rows().concat(groupRows.filter(function (y, i, all) { return all.indexOf(y) === i; }).sort(function (a, b) {
      return Number(a.split(" ").pop()) - Number(b.split(" ").pop());
    }));
    var layout = {
      barmode: "overlay", height: Math.max(260, 60 + 26 * categories.length), margin: { l: 110, r: 10, t: 10, b: 40 },
      xaxis: { type: "date", title: "wall time" },
      yaxis: { type: "category", categoryorder: "array", categoryarray: categories.slice().reverse(), automargin: true },
      legend: { orientation: "h", y: -0.15 }, hovermode: "closest",
    };
    var range = zoomRange(select.value);
    if (range) layout.xaxis.range = range;
    else if (drawn && chart.layout && chart.layout.xaxis && !chart.layout.xaxis.autorange) layout.xaxis.range = chart.layout.xaxis.range;
    Plotly.react(chart, data, layout, { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] });
    drawn = true;
    updateChoices();
    var updates = spans.filter(function (s) { return s.kind === "pause"; }).length;
    document.getElementById("timeline-info").textContent = spans.length + " spans, " + Object.keys(lanes).length + " lanes, " + updates + " server pauses";
  }

  // One update: from the start of the trainer step that made version v to the last server's pause of it.
  function zoomRange(value) {
    if (value === "") return null;
    var version = Number(value);
    var mine = spans.filter(function (s) { return s.version === version; });
    var broadcast = mine.find(function (s) { return s.kind === "broadcast"; });
    if (!broadcast) return null;
    var fb = spans.filter(function (s) { return s.kind === "forward_backward" && s.lane === broadcast.lane && s.end <= broadcast.start + 1e-6; })
      .reduce(function (best, s) { return !best || s.start > best.start ? s : best; }, null);
    var start = fb ? fb.start : broadcast.start;
    var end = Math.max.apply(null, mine.map(function (s) { return s.end; }));
    var pad = Math.max(0.05, (end - start) * 0.1);
    return [new Date((start - pad) * 1000).toISOString(), new Date((end + pad) * 1000).toISOString()];
  }

  function updateChoices() {
    var versions = spans.filter(function (s) { return s.kind === "broadcast" && s.version !== undefined; }).map(function (s) { return s.version; });
    var have = {};
    Array.prototype.forEach.call(select.options, function (o) { have[o.value] = true; });
    versions.forEach(function (v) {
      if (have[String(v)]) return;
      var option = document.createElement("option");
      option.value = String(v);
      option.textContent = "version " + v;
      select.appendChild(option);
      have[String(v)] = true;
    });
  }

  select.addEventListener("change", function () {
    var range = zoomRange(select.value);
    Plotly.relayout(chart, range ? { "xaxis.range": range } : { "xaxis.autorange": true });
  });

  function poll() {
    clearTimeout(pollTimer);
    fetchSpans().then(render).catch(function (err) {
      document.getElementById("timeline-info").textContent = "could not read the timeline (" + err.message + ")";
    }).then(function () {
      if (live && visible()) pollTimer = setTimeout(poll, POLL_MS);
    });
  }

  function percent(x) { return (100 * x).toFixed(1) + "%"; }

  function renderLag(data) {
    var body = document.querySelector("#lag-compare-table tbody");
    body.textContent = "";
    var p = data.prediction, m = data.measured;
    function row(label, predicted, measured) {
      var tr = document.createElement("tr");
      [label, predicted, measured].forEach(function (text, i) {
        var td = document.createElement("td");
        td.textContent = text;
        if (i) td.className = "num";
        tr.appendChild(td);
      });
      body.appendChild(tr);
    }
    p.shares.forEach(function (share, k) {
      var seen = m ? m.shares[k] : null;
      if (share < 0.0005 && (seen === null || seen < 0.0005)) return;
      row("lag " + k + (k === p.shares.length - 1 ? "+" : ""), percent(share), seen === null ? "—" : percent(seen));
    });
    row("mean lag", p.mean.toFixed(2), m ? m.mean.toFixed(2) : "—");
    row("past max_lag " + p.max_lag, percent(p.share_past_max_lag) + " unbounded", m ? percent(m.dropped_stale_share) + " dropped" : "—");
    document.getElementById("lag-compare-note").textContent = m
      ? "Predicted from the config alone (default assumptions); measured over " + m.steps + " steps. Past max_lag: the share the actor's bound had to hold back (predicted without the bound) against the samples the trainer dropped as stale."
      : "Predicted from the config alone; the measured lag appears with the run's first step.";
  }

  function pollLag() {
    clearTimeout(lagTimer);
    getJSON(panel.dataset.lagUrl).then(renderLag).catch(function (err) {
      document.getElementById("lag-compare-note").textContent = "no prediction: " + err.message;
    }).then(function () {
      if (live && visible()) lagTimer = setTimeout(pollLag, LAG_POLL_MS);
    });
  }

  function open() { poll(); pollLag(); }
  var tab = document.getElementById("timeline-tab");
  if (tab) tab.addEventListener("click", function () { setTimeout(open, 0); });
  if (location.hash === "#timeline" && tab) tab.click();
})();
