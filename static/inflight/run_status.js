// What every page says about a run's status and time, from one place (loaded by base.html):
// the terminal statuses are the server's (the run model's, in base.html's "terminal-statuses"),
// and a duration is written as the server's `duration` template filter writes it
// (web/templatetags/inflight_ui.py), so a value a page updates live reads as the one rendered.
window.InflightRuns = (function () {
  "use strict";
  var node = document.getElementById("terminal-statuses");
  var terminal = node ? JSON.parse(node.textContent) : [];
  // The metric names a script reads (constant name → metric: rl_core/common/metric_names.py's
  // METRIC_NAMES_FOR_PAGES, in base.html's "metric-names"), so no script spells one itself.
  var namesNode = document.getElementById("metric-names");
  var metricNames = namesNode ? JSON.parse(namesNode.textContent) : {};

  function isTerminal(status) { return terminal.indexOf(status) >= 0; }

  function formatDuration(s) {
    s = Math.floor(s);
    if (s < 60) return s + "s";
    var m = Math.floor(s / 60); s = s % 60;
    if (m < 60) return m + "m " + String(s).padStart(2, "0") + "s";
    return Math.floor(m / 60) + "h " + String(m % 60).padStart(2, "0") + "m";
  }

  return { isTerminal: isTerminal, formatDuration: formatDuration, metricNames: metricNames };
})();
