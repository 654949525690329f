// Runs list: status badges refresh every 3 s while any listed run is still active.
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

  function poll() {
    var ids = activeIds();
    if (!ids.length) return;
    fetch(url + "?ids=" + ids.join(","), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : { runs: [] }; })
      .then(function (data) {
        data.runs.forEach(function (run) {
          var badge = table.querySelector('[data-status-of="' + run.id + '"]');
          if (badge) { badge.className = "status status-" + run.status; badge.textContent = run.status; }
          var wall = table.querySelector('[data-walltime-of="' + run.id + '"]');
          if (wall && run.wall_time_s !== null) wall.textContent = formatDuration(run.wall_time_s);
          if (run.is_terminal) table.querySelector('tr[data-run-id="' + run.id + '"]').dataset.terminal = "1";
        });
      })
      .catch(function () { /* next poll retries */ })
      .finally(function () { setTimeout(poll, 3000); });
  }
  setTimeout(poll, 3000);
})();
