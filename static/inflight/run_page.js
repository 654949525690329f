// Run page: a downsampled snapshot, then live pushes over ws/runs/<id>/.
// Pushes that arrive while the snapshot loads are buffered and applied after it;
// those the snapshot already covers (seq <= snapshot seq) are ignored; a gap or a
// reconnect refetches the snapshot.
(function () {
  "use strict";
  var D = window.InflightDownsample;
  var C = window.InflightCharts;
  var page = JSON.parse(document.getElementById("page-data").textContent);
  var chartsEl = document.getElementById("charts");
  var state = null;
  var loading = false;
  var buffered = [];
  var renderTimer = null;
  var plots = {}; // chart id -> plot div
  var evals = page.evals.slice();
  var status = page.status;
  var socket = null;
  var connects = 0; // socket opens so far
  // Pushes beyond the charts' that a tab asked for ({rollouts: true} while the Rollouts tab shows):
  // asked again on every (re)connect, since a new connection starts with none of them.
  var watching = {};
  var retryMs = 1000;
  var controls = C.bindControls(scheduleRender);

  // ---- snapshot + pushes

  var again = false; // a refetch asked for while one is in flight runs once it is done

  function refetch() {
    if (loading) { again = true; return; }
    loading = true;
    return fetch(page.snapshot_url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) throw new Error("snapshot: HTTP " + response.status);
        return response.json();
      })
      .then(function (snapshot) {
        state = D.State.fromSnapshot(snapshot);
        loading = false;
        var pending = buffered;
        buffered = [];
        pending.forEach(applyPush);
        scheduleRender();
        if (again) { again = false; refetch(); }
      })
      .catch(function (error) {
        loading = false;
        setLive("error", String(error));
        setTimeout(refetch, 3000);
      });
  }

  function applyPush(message) {
    if (loading || state === null) {
      buffered.push(message);
      return;
    }
    var outcome = state.applyBatch(message);
    if (outcome === "gap") refetch();
    else if (outcome === "applied") scheduleRender();
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + page.ws_path);
    var openedAt = 0;
    socket.onopen = function () {
      // The back-off is reset only once a connection has lasted (see onclose): a server that
      // accepts and at once closes (1011 while Redis is away) must not be retried every second,
      // each time refetching the snapshot.
      openedAt = Date.now();
      setLive("live", InflightRuns.isTerminal(status) ? "finished" : "live");
      if (Object.keys(watching).length) socket.send(JSON.stringify(Object.assign({ type: "watch" }, watching)));
      refetch(); // on first connect and on every reconnect: whatever was missed is in the snapshot
      // And in the panel, on a reconnect; the first open follows the page's own render by a moment.
      if (connects++ > 0) requestPanel(pushedPanelDelayMs());
    };
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      // Subscribed: a status that changed between the page's render and now was pushed to nobody;
      // the panel's answer carries it (and its error) to setStatus.
      if (message.type === "hello") { if (message.status && message.status !== status) requestPanel(0); }
      else if (message.type === "metrics.batch") { applyPush(message); if (hasListedHeldout(message)) requestPanel(pushedPanelDelayMs()); }
      else if (message.type === "run.status") { setStatus(message.status, message.error); setDetail(message.detail); }
      else if (message.type === "run.panel") requestPanel(pushedPanelDelayMs());
      else if (message.type === "eval.score") {
        evals.push(message); scheduleRender(); noteEvaluation(message);
        if (checkpointListed(message.step)) requestPanel(pushedPanelDelayMs());
      }
      // Other pushes (rollouts.batch, watching, alert.fired) are for rollouts.js, on the same socket.
      else document.dispatchEvent(new CustomEvent("inflight:push", { detail: message }));
    };
    socket.onclose = function (event) {
      if (event.code === 4401 || event.code === 4403) { setLive("off", "not allowed"); return; }
      if (openedAt && Date.now() - openedAt > 10000) retryMs = 1000;
      // A finished run is reconnected too: it may be resumed (from another tab, the API or the
      // CLI), and its page must then follow it without a reload.
      setLive("off", InflightRuns.isTerminal(status) ? "finished" : "reconnecting");
      setTimeout(connect, retryMs + Math.random() * 500);
      retryMs = Math.min(retryMs * 2, 30000);
    };
  }

  // ---- status

  function setLive(kind, text) {
    var el = document.getElementById("live-indicator");
    el.className = "live live-" + kind;
    document.getElementById("live-text").textContent = text;
  }

  // `fromPanel`: the status came with a panel.json answer, which needs no second fetch.
  function setStatus(newStatus, error, fromPanel) {
    var was = status;
    rebaseWallTime(); // the clock counted under the old status up to now
    status = newStatus;
    var holder = document.getElementById("run-status");
    holder.dataset.status = newStatus;
    holder.innerHTML = '<span class="status status-' + newStatus + '">' + newStatus + "</span>";
    var finished = InflightRuns.isTerminal(newStatus);
    // Shown again when a finished run is resumed: stoppable while queued, starting or running.
    document.getElementById("stop-form").classList.toggle("hidden", finished || newStatus === "cancelling");
    if (socket && socket.readyState === WebSocket.OPEN) setLive("live", finished ? "finished" : "live");
    var box = document.getElementById("run-error");
    box.classList.toggle("hidden", !error);
    box.querySelector("pre").textContent = error || "";
    if (was !== newStatus) {
      // The notices above the page ("queued", "stop requested") told the status at the moment of an
      // action; once it moved on they would mislead.
      var notices = document.querySelector("main > .messages");
      if (notices) notices.remove();
      if (!fromPanel) requestPanel(0);
      // The end is pushed after the run's last lines were stored: a page that missed a push on the
      // way (the channel layer drops what waits too long under load) ends complete all the same.
      if (finished && state !== null) refetch();
    }
  }

  // What a starting run waits for (a cluster run's placement group), beside its status.
  function setDetail(detail) {
    var el = document.getElementById("run-status-detail");
    el.textContent = detail || "";
    el.classList.toggle("hidden", !detail);
  }

  // The per-problem tables are rendered by the server: offer a reload when a new evaluation lands.
  function noteEvaluation(message) {
    var note = document.getElementById("eval-note");
    note.textContent = "New " + message.benchmark + " evaluation at step " + message.step +
      " (mean@" + message.k + " " + (100 * message.mean_at_k).toFixed(1) + "%). ";
    var link = document.createElement("a");
    link.href = location.pathname;
    link.textContent = "Reload for per-problem results";
    note.appendChild(link);
    note.classList.remove("hidden");
  }

  // The status line and the actions panel (checkpoints, Resume, Delete, runs made from this one,
  // tags, note) follow the run: panel.json is fetched again when something in it changed, as the
  // socket says — a `run.panel` push (a checkpoint saved, a run forked or cloned from this one, its
  // tags, note or archive edited), an `eval.score` push or a held-out success point at the step of a
  // listed checkpoint (the list shows their scores), a status change — and on every reconnect
  // (whatever changed while the socket was down). Pushes close together cause one fetch, after 0.5-2 s
  // at random: the runs of a sweep checkpoint and evaluate at the same steps, and their hundreds of
  // open pages must not all ask in the same instant (bench/platform_scale.py: 500 pages asking at
  // once on each evaluation held the metric pushes back by seconds). Pages used to poll it every 5 s while
  // the run was active: 500 open pages made ~100 panel renders a second on a 2-core web node, and
  // the metric pushes came late (issue 24). What is left is a slow safety poll, for a push the
  // channel layer dropped (it drops what waits too long under load): every 60 s while the run is
  // active, every 5 min once it ended — an ended run's panel changes only by someone's action
  // (a resume pushes its status, a fork or an edit pushes run.panel), so there the poll only covers a
  // lost push, and ended runs' pages stay open for hours. Each poll is jittered ±10 % so pages opened
  // together do not keep asking together. The panel is replaced only when it changed and the user
  // is not typing in it (its tags/note form).
  var PANEL_DEBOUNCE_MS = 500;
  var PANEL_SPREAD_MS = 1500;
  var SAFETY_POLL_ACTIVE_MS = 60000;
  var SAFETY_POLL_ENDED_MS = 300000;
  var PANEL_RETRY_MS = 15000; // after a failed fetch (network error)
  var panelTimer = null;
  var panelDue = 0; // when the scheduled fetch runs (Date.now() ms)
  var panelBusy = false;
  var panelAgain = false; // a change was announced while a fetch was in flight: fetch once more after it
  var panelHtml = null;

  // A fetch within `delayMs`; one already due sooner is kept (this is the debounce).
  function requestPanel(delayMs) {
    if (panelBusy) { panelAgain = true; return; }
    var due = Date.now() + delayMs;
    if (panelTimer !== null) {
      if (panelDue <= due) return;
      clearTimeout(panelTimer);
    }
    panelDue = due;
    panelTimer = setTimeout(refreshPanel, delayMs);
  }

  function safetyPollMs() {
    var base = !InflightRuns.isTerminal(status) ? SAFETY_POLL_ACTIVE_MS : SAFETY_POLL_ENDED_MS;
    return base * (0.9 + 0.2 * Math.random());
  }

  function pushedPanelDelayMs() {
    return PANEL_DEBOUNCE_MS + PANEL_SPREAD_MS * Math.random();
  }

  function checkpointListed(step) {
    return document.querySelector('#checkpoints-table tr[data-step="' + Number(step) + '"]') !== null;
  }

  // A held-out success point ([name, step, t, value]) at a listed checkpoint's step.
  function hasListedHeldout(message) {
    var points = message.points || [];
    for (var i = 0; i < points.length; i++) if (points[i][0] === InflightRuns.metricNames.HELDOUT_SUCCESS && checkpointListed(points[i][1])) return true;
    return false;
  }

  function refreshPanel() {
    panelTimer = null;
    panelBusy = true;
    var retryMs = null;
    fetch(page.panel_url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (row) {
        if (!row) return;
        if (row.status !== status) setStatus(row.status, row.error, true);
        setDetail(row.detail);
        setWallTime(row.wall_time_s);
        var worker = document.getElementById("run-worker");
        worker.classList.toggle("hidden", !row.worker_name);
        worker.querySelector("b").textContent = row.worker_name;
        replacePanel(row.actions_html);
      })
      .catch(function () { retryMs = PANEL_RETRY_MS; })
      .finally(function () {
        panelBusy = false;
        if (panelAgain) { panelAgain = false; requestPanel(PANEL_DEBOUNCE_MS); }
        requestPanel(retryMs !== null ? retryMs : safetyPollMs());
      });
  }

  // Wall time: panel.json's `wall_time_s` no longer comes every few seconds, so the page counts on
  // from the last one it got. It counts while the run has started and not ended (starting, running,
  // cancelling), the rule of Run.wall_time_s on the server; a queued run (a resume not yet picked
  // up) shows the time banked by its earlier attempts, without counting.
  var COUNTING = ["starting", "running", "cancelling"];
  var wallS = null; // the last wall_time_s received, as counted on to `wallAt`
  var wallAt = 0; // performance.now() of that

  function wallTimeNow() {
    if (wallS === null) return null;
    return wallS + (COUNTING.indexOf(status) >= 0 ? (performance.now() - wallAt) / 1000 : 0);
  }

  function rebaseWallTime() {
    var now = wallTimeNow();
    if (now !== null) { wallS = now; wallAt = performance.now(); }
  }

  function setWallTime(seconds) {
    wallS = seconds === null || seconds === undefined ? null : Number(seconds);
    wallAt = performance.now();
    showWallTime();
  }

  function showWallTime() {
    var s = wallTimeNow();
    if (s !== null) document.getElementById("run-walltime").textContent = InflightRuns.formatDuration(s);
  }

  function replacePanel(html) {
    var current = document.getElementById("run-actions");
    if (!current || html === panelHtml) return;
    if (current.contains(document.activeElement) || current.querySelector("details.edit-labels[open]")) return;
    var holder = document.createElement("div");
    holder.innerHTML = html.trim();
    var fresh = holder.firstElementChild;
    if (!fresh) return;
    // The checkpoint list keeps the user's open/closed choice once it has rows.
    var before = current.querySelector("#checkpoints"), after = fresh.querySelector("#checkpoints");
    if (before && after && before.querySelector("tbody tr")) after.open = before.open;
    current.replaceWith(fresh);
    panelHtml = html;
  }


  // ---- charts

  function groupOf(name) {
    for (var i = 0; i < page.charts.length; i++) {
      var group = page.charts[i];
      for (var j = 0; j < group.patterns.length; j++) {
        if (new RegExp(group.patterns[j]).test(name)) return group;
      }
    }
    var prefix = name.indexOf("/") > 0 ? name.slice(0, name.indexOf("/")) : name;
    return { id: "more-" + prefix.replace(/[^a-z0-9_-]/gi, "_"), title: prefix, y: "value" };
  }

  function plotFor(group) {
    if (!plots[group.id]) {
      plots[group.id] = C.chartCard(group.section ? sectionFor(group.section).grid : chartsEl, group.id, group.title);
      // A chart's `help` (web/charts.py): what each of its series is, on hovering its title.
      if (group.help) plots[group.id].parentNode.querySelector("h3").title = group.help;
    }
    return plots[group.id];
  }

  // A chart with a `section` (web/charts.py: the Tools charts of a multi-turn env) goes into that
  // section's own block, a heading over its own grid, made when its first chart has data: a run
  // that logs none of its series has no such block.
  var sections = {};
  function sectionFor(title) {
    if (!sections[title]) {
      var box = document.createElement("section");
      box.className = "chart-section";
      box.id = "charts-section-" + title.toLowerCase().replace(/[^a-z0-9]+/g, "-");
      var heading = document.createElement("h2");
      heading.textContent = title;
      var grid = document.createElement("div");
      grid.className = "charts";
      box.appendChild(heading);
      box.appendChild(grid);
      sections[title] = { box: box, grid: grid };
    }
    return sections[title];
  }

  function scheduleRender() {
    if (renderTimer === null) renderTimer = setTimeout(render, 250);
  }

  function render() {
    renderTimer = null;
    if (state === null) return;
    var ctx = { t0: C.firstTime(state), samplesPerStep: page.samples_per_step };
    var byGroup = {};
    var order = [];
    var names = Array.from(state.series.keys()).sort();
    var buckets = 0;
    names.forEach(function (name) {
      var group = groupOf(name);
      if (!byGroup[group.id]) { byGroup[group.id] = { group: group, traces: [] }; order.push(group.id); }
      var columns = state.columns(name);
      buckets += columns.b.length;
      var color = nextColor(byGroup[group.id]);
      // A group's `labels` say what a series is (the Tools charts); the metric's name otherwise.
      var label = (group.labels && group.labels[name]) || name;
      byGroup[group.id].traces = byGroup[group.id].traces.concat(C.seriesTraces(label, columns, controls.axis, controls.smoothing, color, ctx));
    });
    addEvalTraces(byGroup, order, ctx);
    // Keep the configured chart order, extra prefixes after.
    var configured = page.charts.map(function (g) { return g.id; });
    order.sort(function (a, b) {
      var ia = configured.indexOf(a), ib = configured.indexOf(b);
      return (ia < 0 ? 1000 : ia) - (ib < 0 ? 1000 : ib) || (a < b ? -1 : 1);
    });
    var empty = document.getElementById("charts-empty");
    if (empty && order.length) empty.remove();
    order.forEach(function (id) {
      var entry = byGroup[id];
      var plot = plotFor(entry.group);
      if (entry.group.section) {
        chartsEl.appendChild(sectionFor(entry.group.section).box); // the block stands where its charts' order puts it
        sections[entry.group.section].grid.appendChild(plot.parentNode);
      } else {
        chartsEl.appendChild(plot.parentNode); // keeps DOM order = chart order
      }
      var chartLayout = C.layout(controls.axis, entry.group.y);
      // Alerts are marked where they fired (rollouts.js draws the marks).
      if (window.inflightAlertMarks) chartLayout.shapes = window.inflightAlertMarks(controls.axis, ctx);
      C.draw(plot, entry.traces, chartLayout, !!entry.group.learning_signal).then(function () { fitWidth(plot); });
    });
    var info = document.getElementById("points-info");
    info.dataset.buckets = String(buckets);
    info.dataset.seq = String(state.seq);
    info.dataset.maxStep = String(state.maxStep === null ? -1 : state.maxStep);
    info.textContent = names.length + " series · " + buckets + " buckets · width " + Math.pow(2, state.shift) + " · seq " + state.seq;
  }

  // A plot first drawn while its tab was hidden (the page opened on #rollouts) took Plotly's
  // default width and overflowed its card once shown; Plotly.react keeps that size, so a shown
  // plot whose width is not its card's is fitted again.
  function fitWidth(plot) {
    var drawn = plot._fullLayout && plot._fullLayout.width;
    if (plot.clientWidth && drawn && Math.abs(drawn - plot.clientWidth) > 2) Plotly.Plots.resize(plot);
  }

  function nextColor(entry) {
    entry.count = (entry.count || 0) + 1;
    return C.PALETTE[(entry.count - 1) % C.PALETTE.length];
  }

  // Benchmark scores from the evaluation table (mean@k per step), on the "eval" chart,
  // for runs whose metrics stream does not carry them.
  function addEvalTraces(byGroup, order, ctx) {
    if (!evals.length || controls.axis === "time") return;
    var group = page.charts.filter(function (g) { return g.id === "eval"; })[0];
    if (!byGroup.eval) { byGroup.eval = { group: group, traces: [], count: 0 }; order.push("eval"); }
    var benches = {};
    evals.forEach(function (e) { (benches[e.benchmark] = benches[e.benchmark] || {})[e.step] = e.mean_at_k; });
    Object.keys(benches).sort().forEach(function (bench) {
      // The metrics stream usually carries the same score as eval/<bench>/mean_at_k: draw it once.
      if (state.series.has("eval/" + bench + "/mean_at_k")) return;
      var steps = Object.keys(benches[bench]).map(Number).sort(function (a, b) { return a - b; });
      var color = nextColor(byGroup.eval);
      byGroup.eval.traces.push({
        x: steps.map(function (s) { return controls.axis === "samples" ? s * ctx.samplesPerStep : s; }),
        y: steps.map(function (s) { return benches[bench][s]; }),
        mode: "lines+markers", name: bench + " mean@k", line: { color: color, width: 2 }, marker: { color: color },
      });
    });
  }

  // `topics`: e.g. {rollouts: true}; the socket answers {"type": "watching", ...} (an "inflight:push"
  // event) once the server sends them, now or after the next (re)connect.
  function watch(topics) {
    Object.keys(topics).forEach(function (topic) { if (topics[topic]) watching[topic] = true; else delete watching[topic]; });
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(Object.assign({ type: "watch" }, topics)));
  }

  window.inflightRunPage = { state: function () { return state; }, refetch: refetch, rerender: scheduleRender, watch: watch };
  // The snapshot does not wait for the socket: a finished run's charts draw even if the socket
  // never opens; every (re)connect fetches it again for what was missed meanwhile.
  refetch();
  connect();
  requestPanel(safetyPollMs()); // the page was rendered with its panel: from here pushes ask, this is the safety poll
  if (page.wall_time_s !== null && page.wall_time_s !== undefined) setWallTime(page.wall_time_s);
  setInterval(showWallTime, 1000);
})();
