// Compare page: every run's snapshot, brought onto one grid (the coarsest run's
// width: pairs of buckets merge exactly because widths are powers of two), one
// overlaid chart per selected metric. The address holds the view (runs, metrics, x axis,
// smoothing) and is kept up to date, so it can be shared; a fork's curves start at its fork
// step on the step axis (page.runs[i].step_offset).
(function () {
  "use strict";
  var D = window.InflightDownsample;
  var C = window.InflightCharts;
  var page = JSON.parse(document.getElementById("page-data").textContent);
  var chartsEl = document.getElementById("charts");
  var select = document.getElementById("metric-select");
  var states = [];
  var controls = C.bindControls(render);
  controls.axis = page.x || "step";
  if (typeof page.smooth === "number") controls.smoothing = page.smooth;
  var wanted = page.metrics && page.metrics.length ? page.metrics : null;
  var N = window.InflightRuns.metricNames;
  var DEFAULTS = [N.ROLLOUT_SUCCESS_MEAN, N.ROLLOUT_REWARD_MEAN, N.HELDOUT_SUCCESS, N.ROLLOUT_TOKENS_PER_S, N.POLICY_LAG_MAX];

  // Only the charted metrics are fetched (`?names=`): the picker lists every metric the runs
  // logged (page.metric_names), and picking one not loaded yet fetches the charted set again.
  var loaded = new Set();
  function snapshotUrl(run, names) {
    return run.snapshot_url + (names ? "?names=" + encodeURIComponent(names.join(",")) : "");
  }
  var generation = 0;
  // Every run's snapshot in one request (compare/snapshots.json), in page.runs' order; a run's
  // own snapshot.json is fetched alone when only that run changed (reloadRun below).
  function load(names) {
    var mine = ++generation;
    var url = page.snapshots_url + "?runs=" + page.runs.map(function (run) { return run.id; }).join(",") +
      (names ? "&names=" + encodeURIComponent(names.join(",")) : "");
    return fetch(url, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) {
        return r.json().catch(function () { return {}; }).then(function (body) {
          throw new Error("snapshots: HTTP " + r.status + (body.error ? ": " + body.error : ""));
        });
      }
      return r.json();
    }).then(function (answer) {
      var snapshots = answer.snapshots;
      if (mine !== generation) return;  // a later pick's fetch supersedes this one
      states = snapshots.map(function (s) { return D.State.fromSnapshot(s); });
      var shared = Math.max.apply(null, states.map(function (s) { return s.shift; }));
      states.forEach(function (s) { s.coarsenTo(shared); });
      loaded = new Set(names || []);
      if (!names) states.forEach(function (s) { s.series.forEach(function (_, name) { loaded.add(name); }); });
    });
  }
  function chosenNames() {
    return Array.from(select.selectedOptions).map(function (o) { return o.value; });
  }
  function showError(error) {
    chartsEl.innerHTML = '<p class="error-text"></p>';
    chartsEl.firstChild.textContent = String(error);
  }

  // The metric list can be long (40+ names): a search box narrows it; chosen metrics stay
  // listed (and charted) whatever the search, so narrowing never unselects anything.
  var search = document.getElementById("metric-search");
  var count = document.getElementById("metric-count");
  function showMatches() {
    var words = (search ? search.value : "").toLowerCase().split(/\s+/).filter(Boolean);
    var shown = 0;
    Array.from(select.options).forEach(function (option) {
      var name = option.value.toLowerCase();
      var match = option.selected || words.every(function (w) { return name.indexOf(w) >= 0; });
      option.hidden = !match;
      if (match) shown += 1;
    });
    if (count) count.textContent = shown + " of " + select.options.length + " metrics · " + select.selectedOptions.length + " charted";
  }
  function bindSearch(total) {
    if (!search) return;
    search.addEventListener("input", showMatches);
    // Enter charts the first match not yet charted.
    search.addEventListener("keydown", function (event) {
      if (event.key !== "Enter") return;
      event.preventDefault();
      var first = Array.from(select.options).filter(function (o) { return !o.hidden && !o.selected; })[0];
      if (first) { first.selected = true; select.dispatchEvent(new Event("change")); }
    });
    if (total) showMatches();
  }

  function saveState(chosen) {
    var params = new URLSearchParams(location.search);
    // Groups compared: the address keeps the sweeps (`groups`) and the runs listed on their own.
    params.set("runs", (page.groups ? page.loose_runs : page.runs.map(function (r) { return r.id; })).join(","));
    if (page.groups) params.set("band", page.band);
    params.set("metrics", chosen.join(","));
    params.set("x", controls.axis);
    params.set("smooth", controls.smoothing.toFixed(2));
    history.replaceState(null, "", location.pathname + "?" + params.toString());
  }

  var copy = document.getElementById("copy-link");
  if (copy) copy.addEventListener("click", function () {
    if (navigator.clipboard) navigator.clipboard.writeText(location.href).catch(function () {});
    copy.textContent = "Link copied";
  });

  // A curve's name says which env ran it when the compared runs differ in env (a tool-using run
  // against a plain math one), so the legend alone tells them apart.
  var mixedEnvs = page.runs.some(function (run) { return run.env !== page.runs[0].env; });
  function runLabel(run) {
    return "#" + run.id + " " + run.name + (mixedEnvs ? " [" + run.env + "]" : "");
  }

  function render() {
    var chosen = Array.from(select.selectedOptions).map(function (o) { return o.value; });
    saveState(chosen);
    chartsEl.innerHTML = "";
    if (!chosen.length) { chartsEl.innerHTML = '<p class="muted">Pick one or more metrics.</p>'; return; }
    chosen.forEach(function (name, i) {
      if (page.groups) {
        var card = C.chartCard(chartsEl, "cmp-" + i, name + " — mean per group, band: " + page.band_words);
        C.draw(card, groupTraces(name), C.layout(controls.axis, ""));
        return;
      }
      var plot = C.chartCard(chartsEl, "cmp-" + i, name);
      var traces = [];
      states.forEach(function (state, r) {
        var run = page.runs[r];
        var ctx = { t0: C.firstTime(state), samplesPerStep: run.samples_per_step };
        var columns = state.columns(name);
        if (!columns.b.length) return;
        if (run.step_offset && controls.axis !== "time") {
          columns.step = columns.step.map(function (s) { return s + run.step_offset; });
        }
        traces = traces.concat(C.seriesTraces(runLabel(run), columns, controls.axis, controls.smoothing, C.PALETTE[r % C.PALETTE.length], ctx));
      });
      C.draw(plot, traces, C.layout(controls.axis, ""));
    });
  }
  // ---- groups: each group's curve is the mean over its runs on a common x grid (the union of
  // the runs' x values, thinned), each run interpolated linearly inside its own range only (never
  // extrapolated: a run that stopped early — failed or still running — counts up to its last point,
  // and the hover says how many runs each point averages). Band: min–max or ±1 sd (page.band).
  var GROUP_POINTS = 400;
  function runCurve(index, name) {
    var state = states[index], run = page.runs[index];
    if (!state) return null;
    var columns = state.columns(name);
    if (!columns.b.length) return null;
    if (run.step_offset && controls.axis !== "time") columns.step = columns.step.map(function (s) { return s + run.step_offset; });
    var x = C.xValues(columns, controls.axis, { t0: C.firstTime(state), samplesPerStep: run.samples_per_step });
    var points = x.map(function (v, k) { return [v, columns.last[k]]; }).filter(function (p) { return isFinite(p[0]) && typeof p[1] === "number" && isFinite(p[1]); });
    points.sort(function (a, b) { return a[0] - b[0]; });
    return points.length ? points : null;
  }
  function valueAt(points, x) {
    if (x < points[0][0] || x > points[points.length - 1][0]) return null;
    var lo = 0, hi = points.length - 1;
    while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (points[mid][0] <= x) lo = mid; else hi = mid; }
    var a = points[lo], b = points[hi];
    if (b[0] === a[0]) return x === a[0] ? a[1] : b[1];
    return a[1] + (b[1] - a[1]) * (x - a[0]) / (b[0] - a[0]);
  }
  function aggregate(curves) {
    var xs = [];
    curves.forEach(function (c) { c.forEach(function (p) { xs.push(p[0]); }); });
    xs.sort(function (a, b) { return a - b; });
    xs = xs.filter(function (v, k) { return k === 0 || v !== xs[k - 1]; });
    if (xs.length > GROUP_POINTS) xs = xs.filter(function (_, k) { return k % Math.ceil(xs.length / GROUP_POINTS) === 0 || k === xs.length - 1; });
    var out = { x: [], mean: [], lo: [], hi: [], n: [] };
    xs.forEach(function (x) {
      var values = curves.map(function (c) { return valueAt(c, x); }).filter(function (v) { return v !== null; });
      if (!values.length) return;
      var mean = values.reduce(function (a, b) { return a + b; }, 0) / values.length;
      var sd = values.length > 1 ? Math.sqrt(values.reduce(function (a, v) { return a + (v - mean) * (v - mean); }, 0) / (values.length - 1)) : 0;
      out.x.push(x); out.mean.push(mean); out.n.push(values.length);
      out.lo.push(page.band === "sd" ? mean - sd : Math.min.apply(null, values));
      out.hi.push(page.band === "sd" ? mean + sd : Math.max.apply(null, values));
    });
    return out;
  }
  var runIndex = {};
  page.runs.forEach(function (run, index) { runIndex[run.id] = index; });
  function groupTraces(name) {
    var traces = [];
    page.groups.forEach(function (group, g) {
      var curves = group.run_ids.map(function (id) { return runCurve(runIndex[id], name); }).filter(Boolean);
      if (!curves.length) return;
      var agg = aggregate(curves);
      var color = C.PALETTE[g % C.PALETTE.length];
      var label = group.label + " (n=" + group.runs + (group.failed ? ", " + group.failed + " failed: partial" : "") + ")";
      traces.push({ x: agg.x, y: agg.lo, mode: "lines", line: { width: 0, color: color }, hoverinfo: "skip", showlegend: false, legendgroup: group.key, name: label + " low" });
      traces.push({ x: agg.x, y: agg.hi, mode: "lines", line: { width: 0, color: color }, fill: "tonexty", fillcolor: C.rgba(color, 0.18), hoverinfo: "skip", showlegend: false, legendgroup: group.key, name: label + " high" });
      var y = controls.smoothing > 0 && agg.mean.length > 1 ? D.ema(agg.mean, controls.smoothing) : agg.mean;
      traces.push({ x: agg.x, y: y, customdata: agg.n, mode: agg.x.length === 1 ? "markers" : "lines", name: label, legendgroup: group.key,
                    line: { width: 2, color: color }, marker: { color: color }, hovertemplate: label + ": %{y:.4g} (mean of %{customdata} runs)<extra></extra>" });
    });
    return traces;
  }
  // The time-to-target form keeps the view as it is now (the address is kept up to date as the
  // view changes; the form's hidden fields are the view the page was loaded with).
  var targetForm = document.querySelector("#time-to-target form");
  if (targetForm) targetForm.addEventListener("submit", function (event) {
    event.preventDefault();
    var params = new URLSearchParams(location.search);
    params.set("target", targetForm.querySelector('input[name="target"]').value);
    location.search = params.toString();
  });
  document.querySelectorAll('#compare-groups input[name="band"]').forEach(function (radio) {
    radio.addEventListener("change", function () {
      page.band = radio.value;
      page.band_words = radio.parentNode.textContent.trim();
      render();
    });
  });

  // ---- live: each run's socket (the run page's, ws/runs/<id>/) says when it logged or changed
  // status; its snapshot is then fetched again (a pause first, so a burst of batches is one
  // fetch) and the charts redrawn. A run without metrics when the page opened appears as it logs.
  var reloadTimers = {};
  var drawTimer = null;
  function namesToFetch() {
    var chosen = chosenNames();
    return chosen.length ? chosen : DEFAULTS;
  }
  function scheduleDraw() {
    clearTimeout(drawTimer);
    drawTimer = setTimeout(function () { addNewNames(); render(); showNoData(); }, 100);
  }
  function reloadRun(index) {
    var run = page.runs[index];
    return fetch(snapshotUrl(run, namesToFetch()), { credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error("run " + run.id + ": HTTP " + r.status); return r.json(); })
      .then(function (snapshot) {
        var state = D.State.fromSnapshot(snapshot);
        var shared = Math.max.apply(null, [state.shift].concat(states.filter(Boolean).map(function (s) { return s.shift; })));
        states.forEach(function (s) { if (s) s.coarsenTo(shared); });
        state.coarsenTo(shared);
        states[index] = state;
        scheduleDraw();
      })
      .catch(function () { /* the next push or reconnect fetches again */ });
  }
  function scheduleReload(index, delayMs) {
    if (reloadTimers[index]) return;
    reloadTimers[index] = setTimeout(function () { reloadTimers[index] = null; reloadRun(index); }, delayMs);
  }
  function setStatus(run, status) {
    run.status = status;
    document.querySelectorAll('[data-status-of="' + run.id + '"]').forEach(function (badge) {
      badge.className = "status status-" + status; badge.textContent = status;
    });
  }
  // A metric a run logs only now (the picker was built from what was logged at page load).
  function addNewNames() {
    var known = new Set(Array.from(select.options).map(function (o) { return o.value; }));
    var added = [];
    states.forEach(function (s) { if (s) s.series.forEach(function (_, name) { if (!known.has(name)) { known.add(name); added.push(name); } }); });
    var noneChosen = !select.selectedOptions.length;
    added.sort().forEach(function (name) {
      var option = document.createElement("option");
      option.value = name; option.textContent = name;
      option.selected = noneChosen && (wanted || DEFAULTS).indexOf(name) >= 0;
      select.appendChild(option);
    });
    if (added.length) { select.size = Math.min(8, Math.max(3, select.options.length)); showMatches(); }
  }
  // Says which selected runs have nothing yet for the charted metrics.
  function showNoData() {
    var chosen = chosenNames();
    page.runs.forEach(function (run, i) {
      var state = states[i];
      var has = !!state && chosen.some(function (name) { return state.columns(name).b.length > 0; });
      var mark = document.querySelector('[data-no-data-of="' + run.id + '"]');
      if (mark) mark.classList.toggle("hidden", has);
    });
  }
  function follow(index) {
    var run = page.runs[index];
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var retryMs = 1000;
    var opened = false;  // the first subscription of this page's socket, or a reconnect
    function connect() {
      var socket = new WebSocket(scheme + location.host + run.ws_path);
      // What was missed between the page's fetch and the subscription; a run that had ended when the
      // page fetched it, and still has, has nothing to miss the first time (a resume changes its status).
      socket.onopen = function () { retryMs = 1000; };
      socket.onmessage = function (event) {
        var message = JSON.parse(event.data);
        // "hello" comes once the server has subscribed this socket: what changed before it was
        // pushed to nobody, so the status it carries is taken and the series fetched again.
        if (message.type === "hello") {
          var wasTerminal = InflightRuns.isTerminal(run.status);
          if (message.status && message.status !== run.status) setStatus(run, message.status);
          if (opened || !wasTerminal || !InflightRuns.isTerminal(run.status)) scheduleReload(index, 0);
          opened = true;
        }
        else if (message.type === "metrics.batch") scheduleReload(index, 1000);
        else if (message.type === "run.status") setStatus(run, message.status);
      };
      socket.onclose = function (event) {
        if (event.code === 4401 || event.code === 4403) return;
        setTimeout(connect, retryMs + Math.random() * 500);
        retryMs = Math.min(retryMs * 2, 30000);
      };
    }
    connect();
  }

  // Run once the whole script is read: the search box and its helpers above are set by then.
  function start() {
    var names = page.metric_names || [];
    select.size = Math.min(8, Math.max(3, names.length));
    names.forEach(function (name) {
      var option = document.createElement("option");
      option.value = name; option.textContent = name;
      option.selected = (wanted || DEFAULTS).indexOf(name) >= 0;
      select.appendChild(option);
    });
    if (!select.selectedOptions.length && names.length) select.options[0].selected = true;
    select.addEventListener("change", function () {
      var missing = chosenNames().filter(function (name) { return !loaded.has(name); });
      showMatches();
      if (!missing.length) { render(); return; }
      load(chosenNames()).then(render).catch(showError);
    });
    bindSearch(names.length);
    load(chosenNames()).then(function () { render(); showNoData(); }).catch(showError);
    // Every run is followed, a finished one too: it may be resumed meanwhile.
    page.runs.forEach(function (_, i) { follow(i); });
  }
  start();
})();
