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

  function formatDuration(s) {
    s = Math.floor(s);
    if (s < 60) return s + "s";
    var m = Math.floor(s / 60); s = s % 60;
    if (m < 60) return m + "m " + String(s).padStart(2, "0") + "s";
    return Math.floor(m / 60) + "h " + String(m % 60).padStart(2, "0") + "m";
  }

  var TERMINAL = ["succeeded", "failed", "cancelled", "lost"];

  function update(run) {
    var row = table.querySelector('tr[data-run-id="' + run.id + '"]');
    if (!row) return;
    var badge = row.querySelector('[data-status-of="' + run.id + '"]');
    if (badge) { badge.className = "status status-" + run.status; badge.textContent = run.status; }
    var wall = row.querySelector('[data-walltime-of="' + run.id + '"]');
    if (wall && run.wall_time_s !== undefined && run.wall_time_s !== null) wall.textContent = formatDuration(run.wall_time_s);
    if (TERMINAL.indexOf(run.status) >= 0) row.dataset.terminal = "1";
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

  connect(1000);
  setTimeout(poll, 3000);
})();
