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
  var DEFAULTS = ["success/mean", "reward/mean", "success/heldout", "rollout/tokens_per_s", "policy_lag/max"];

  // Only the charted metrics are fetched (`?names=`): the picker lists every metric the runs
  // logged (page.metric_names), and picking one not loaded yet fetches the charted set again.
  var loaded = new Set();
  function snapshotUrl(run, names) {
    return run.snapshot_url + (names ? "?names=" + encodeURIComponent(names.join(",")) : "");
  }
  var generation = 0;
  function load(names) {
    var mine = ++generation;
    return Promise.all(page.runs.map(function (run) {
      return fetch(snapshotUrl(run, names), { credentials: "same-origin" }).then(function (r) {
        if (!r.ok) throw new Error("run " + run.id + ": HTTP " + r.status);
        return r.json();
      });
    })).then(function (snapshots) {
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
    params.set("runs", page.runs.map(function (r) { return r.id; }).join(","));
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

  function render() {
    var chosen = Array.from(select.selectedOptions).map(function (o) { return o.value; });
    saveState(chosen);
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
        if (run.step_offset && controls.axis !== "time") {
          columns.step = columns.step.map(function (s) { return s + run.step_offset; });
        }
        traces = traces.concat(C.seriesTraces("#" + run.id + " " + run.name, columns, controls.axis, controls.smoothing, C.PALETTE[r % C.PALETTE.length], ctx));
      });
      C.draw(plot, traces, C.layout(controls.axis, ""));
    });
  }
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
    var opened = false;  // the first open of this page's socket, or a reconnect
    function connect() {
      var socket = new WebSocket(scheme + location.host + run.ws_path);
      // What was missed between the page's fetch and this open; a run that had ended when the page
      // fetched it has nothing to miss on the first open (a resume says so by its status first).
      socket.onopen = function () {
        retryMs = 1000;
        if (opened || !InflightRuns.isTerminal(run.status)) scheduleReload(index, 0);
        opened = true;
      };
      socket.onmessage = function (event) {
        var message = JSON.parse(event.data);
        if (message.type === "metrics.batch") scheduleReload(index, 1000);
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
