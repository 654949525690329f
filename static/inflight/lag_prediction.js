// Create page: the policy-lag side panel. As the config changes (either tab) or an assumption is
// edited, the config and the assumptions are posted to runs/new/lag.json (debounced) and the
// predicted distribution drawn as bars: lag 0..7, 8+.
(function () {
  "use strict";
  var panel = document.getElementById("lag-panel");
  if (!panel) return;
  var DEBOUNCE_MS = 400;
  var timer = null;
  var sent = 0; // answers older than the last request are dropped
  var formEl = document.querySelector('form[data-panel="form"]');
  var yamlForm = document.querySelector('form[data-panel="yaml"]');

  function activeForm() {
    return yamlForm && !yamlForm.classList.contains("hidden") ? yamlForm : formEl;
  }

  function show(prediction) {
    var bars = document.getElementById("lag-bars");
    bars.textContent = "";
    var top = Math.max.apply(null, prediction.shares.concat([0.01]));
    prediction.shares.forEach(function (share, k) {
      var row = document.createElement("div");
      row.className = "lag-bar" + (k > prediction.max_lag ? " past" : "");
      var label = document.createElement("span");
      label.className = "lag-bar-label";
      label.textContent = k + (k === prediction.shares.length - 1 ? "+" : "");
      var fill = document.createElement("span");
      fill.className = "lag-bar-fill";
      fill.style.width = (65 * share / top).toFixed(1) + "%"; // of the row, beside its label and value
      var value = document.createElement("span");
      value.className = "lag-bar-value";
      value.textContent = (100 * share).toFixed(1) + "%";
      row.appendChild(label); row.appendChild(fill); row.appendChild(value);
      bars.appendChild(row);
    });
    document.getElementById("lag-mean").textContent = prediction.mean.toFixed(2);
    document.getElementById("lag-max").textContent = prediction.max_lag;
    document.getElementById("lag-past").textContent = (100 * prediction.share_past_max_lag).toFixed(1) + "%";
    document.getElementById("lag-past-note").textContent = prediction.mode === "sync"
      ? "(sync mode: closed form)"
      : "(the bound holds these back instead; unbounded mean " + prediction.unbounded_mean.toFixed(2) + ")";
  }

  function refresh() {
    var form = activeForm();
    if (!form) return;
    var body = new FormData(form);
    panel.querySelectorAll("input[name^='assume.']").forEach(function (input) { body.set(input.name, input.value); });
    var token = (form.querySelector('[name="csrfmiddlewaretoken"]') || {}).value || "";
    var mine = ++sent;
    fetch(panel.dataset.url, { method: "POST", body: body, credentials: "same-origin", headers: { Accept: "application/json", "X-CSRFToken": token } })
      .then(function (r) { return r.json().then(function (data) { return { ok: r.ok, data: data }; }); })
      .then(function (answer) {
        if (mine !== sent) return;
        var error = document.getElementById("lag-error");
        error.classList.toggle("hidden", answer.ok);
        panel.classList.toggle("stale", !answer.ok);
        if (!answer.ok) { error.textContent = "No prediction: " + answer.data.error; return; }
        show(answer.data.prediction);
      })
      .catch(function () { /* offline: the last prediction stays, marked by nothing new */ });
  }

  function later() { clearTimeout(timer); timer = setTimeout(refresh, DEBOUNCE_MS); }
  [formEl, yamlForm, panel].forEach(function (el) {
    if (!el) return;
    el.addEventListener("input", later);
    el.addEventListener("change", later);
  });
  document.querySelectorAll(".tab").forEach(function (tab) { tab.addEventListener("click", later); });
  refresh();
})();
