// Runs list: status changes of the user's runs are pushed over ws/runs/; every 3 s the
// status endpoint is polled as well for rows still active (staff rows of other users,
// and anything missed while the socket was down).
(function () {
  "use strict";
  var table = document.getElementById("runs-table");
  if (!table) return;
  var url = table.dataset.statusUrl;

  function activeIds() {
    return Array.from(table.querySelectorAll("tr[data-run-id]"))
      .filter(function (row) { return row.dataset.terminal !== "1"; })
      .map(function (row) { return row.dataset.runId; });
  }



  function update(run) {
    var row = table.querySelector('tr[data-run-id="' + run.id + '"]');
    if (!row) return;
    var badge = row.querySelector('[data-status-of="' + run.id + '"]');
    if (badge) { badge.className = "status status-" + run.status; badge.textContent = run.status; }
    var wall = row.querySelector('[data-walltime-of="' + run.id + '"]');
    if (wall && run.wall_time_s !== undefined && run.wall_time_s !== null) wall.textContent = InflightRuns.formatDuration(run.wall_time_s);
    if (run.step !== undefined) updateProgress(row, run);
    if (InflightRuns.isTerminal(run.status)) row.dataset.terminal = "1";
  }

  // The triage cells of an active run follow it: step x / N and the latest held-out and reward.
  function updateProgress(row, run) {
    var cell = row.querySelector("[data-progress-of]");
    if (cell && run.step !== null) {
      var share = run.max_steps ? Math.min(1, run.step / run.max_steps) : 0;
      cell.querySelector(".progress-bar").style.width = Math.round(share * 100) + "%";
      cell.querySelector(".progress-text").textContent = "step " + run.step + (run.max_steps ? " / " + run.max_steps : "");
    }
    // The trend cells: the server draws the sparkline (numbers only, no user text) as on page load.
    Object.keys(run.sparklines || {}).forEach(function (name) {
      var spark = row.querySelector('[data-spark="' + name + '"]');
      if (spark && spark.innerHTML !== run.sparklines[name]) spark.innerHTML = run.sparklines[name];
    });
    Object.keys(run.latest || {}).forEach(function (key) {
      var value = run.latest[key];
      var target = row.querySelector('[data-latest="' + key + '"]');
      if (!target || value === null || value === undefined) return;
      target.textContent = key === "heldout" ? (100 * value).toFixed(1) + "%" : Number(value.toPrecision(3)).toString();
    });
  }

  function poll() {
    var ids = activeIds();
    if (!ids.length) { setTimeout(poll, 3000); return; }
    fetch(url + "?ids=" + ids.join(","), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : { runs: [] }; })
      .then(function (data) { data.runs.forEach(update); })
      .catch(function () { /* the next poll retries */ })
      .finally(function () { setTimeout(poll, 3000); });
  }

  // An alert fired for one of the listed runs: show (or count up) its mark.
  function markAlert(runId) {
    var mark = document.querySelector('[data-alerts-of="' + runId + '"]');
    if (!mark) return;
    var n = (parseInt(mark.textContent.replace(/[^0-9]/g, ""), 10) || 0) + 1;
    mark.textContent = " ⚠ " + n;
    mark.title = n + (n === 1 ? " alert" : " alerts");
    mark.classList.remove("hidden");
  }

  function connect(delay) {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + "/ws/runs/");
    socket.onmessage = function (event) {
      var message = JSON.parse(event.data);
      if (message.type === "run.status") update({ id: message.run_id, status: message.status });
      else if (message.type === "alert.fired") markAlert(message.run_id);
    };
    socket.onclose = function (event) {
      if (event.code === 4401 || event.code === 4403) return;
      setTimeout(function () { connect(Math.min(delay * 2, 30000)); }, delay);
    };
  }

  // Columns the user picks (the "Columns…" menu), remembered in this browser.
  var STORE = "inflight.runList.hiddenColumns";
  var defaults = JSON.parse(document.getElementById("columns-hidden-by-default").textContent);
  function hiddenColumns() {
    try { var saved = JSON.parse(localStorage.getItem(STORE)); if (Array.isArray(saved)) return saved; } catch (e) { /* unreadable: defaults */ }
    return defaults.slice();
  }
  function applyColumns(hidden) {
    table.querySelectorAll("[data-col]").forEach(function (cell) { cell.classList.toggle("hidden", hidden.indexOf(cell.dataset.col) >= 0); });
    document.querySelectorAll("[data-pick-col]").forEach(function (box) { box.checked = hidden.indexOf(box.dataset.pickCol) < 0; });
  }
  document.querySelectorAll("[data-pick-col]").forEach(function (box) {
    box.addEventListener("change", function () {
      var hidden = Array.from(document.querySelectorAll("[data-pick-col]")).filter(function (b) { return !b.checked; }).map(function (b) { return b.dataset.pickCol; });
      try { localStorage.setItem(STORE, JSON.stringify(hidden)); } catch (e) { /* private mode: this page only */ }
      applyColumns(hidden);
    });
  });
  var reset = document.getElementById("columns-reset");
  if (reset) reset.addEventListener("click", function () { try { localStorage.removeItem(STORE); } catch (e) { /* ignore */ } applyColumns(defaults.slice()); });
  applyColumns(hiddenColumns());

  connect(1000);
  setTimeout(poll, 3000);
})();

// A sweep's row folds its runs: the toggle shows or hides the rows of its runs on this page.
(function () {
  "use strict";
  document.querySelectorAll("[data-group-toggle]").forEach(function (button) {
    button.addEventListener("click", function () {
      var open = button.getAttribute("aria-expanded") !== "true";
      button.setAttribute("aria-expanded", open ? "true" : "false");
      button.textContent = open ? "▾" : "▸";
      document.querySelectorAll('tr[data-group-member="' + button.dataset.groupToggle + '"]').forEach(function (row) {
        row.classList.toggle("hidden", !open);
      });
    });
  });
})();
