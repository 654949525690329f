// "New run from this": list the fields whose value differs from the source run's, for the tab
// being edited. The Form tab is diffed here against what each input showed for the source (the
// page embeds it); the YAML tab's text is posted to the server (`data-diff-url`), which parses
// it and diffs it with the same function as a submission, so the two tabs never disagree on
// what YAML means (there is no YAML parser among the page's scripts).
(function () {
  "use strict";
  var sourceEl = document.getElementById("clone-source");
  var card = document.getElementById("clone-diff");
  var form = document.querySelector('form[data-panel="form"]');
  var yamlForm = document.querySelector('form[data-panel="yaml"]');
  var body = document.querySelector("#clone-diff-table tbody");
  if (!sourceEl || !form || !body) return;
  var source = JSON.parse(sourceEl.textContent);
  var empty = document.getElementById("clone-diff-empty");
  var errorEl = document.getElementById("clone-diff-error");

  function current(el) { return el.type === "checkbox" ? el.checked : String(el.value).trim(); }
  function same(a, b) {
    if (typeof a === "boolean" || typeof b === "boolean") return a === b;
    a = String(a).trim(); b = String(b).trim();
    if (a === b) return true;
    // 1e-4 and 0.0001 are the same number.
    return a !== "" && b !== "" && !isNaN(Number(a)) && !isNaN(Number(b)) && Number(a) === Number(b);
  }
  function shown(v) {
    if (v === null || v === undefined || v === "") return "—";
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }

  function showError(message) {
    if (!errorEl) return;
    errorEl.textContent = message || "";
    errorEl.classList.toggle("hidden", !message);
  }

  function showRows(rows) {
    body.innerHTML = "";
    rows.forEach(function (row) {
      var tr = document.createElement("tr");
      tr.dataset.path = row[0];
      row.forEach(function (text) {
        var td = document.createElement("td");
        td.className = "mono";
        td.textContent = text;
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    if (empty) empty.classList.toggle("hidden", rows.length > 0);
  }

  function renderForm() {
    var rows = [];
    form.querySelectorAll("[name]").forEach(function (el) {
      if (el.type === "hidden" || !Object.prototype.hasOwnProperty.call(source, el.name) || el.name === "name") return;
      var value = current(el);
      if (!same(value, source[el.name])) rows.push([el.name, shown(source[el.name]), shown(value)]);
    });
    showError("");
    showRows(rows);
  }

  // YAML tab: one request at a time in effect — a slower, older answer never overwrites a
  // newer one (each request is numbered), and typing waits for a pause before asking.
  var diffUrl = card ? card.dataset.diffUrl : "";
  var asked = 0;
  var timer = null;
  function renderYaml() {
    if (!yamlForm || !diffUrl) return;
    var mine = ++asked;
    var data = new FormData(yamlForm);  // holds the CSRF token the page's own forms send
    var token = data.get("csrfmiddlewaretoken") || "";
    fetch(diffUrl, { method: "POST", body: data, credentials: "same-origin", headers: { Accept: "application/json", "X-CSRFToken": token } })
      .then(function (r) {
        return r.json().catch(function () { return { error: "the server answered " + r.status }; })
          .then(function (json) { return { ok: r.ok, json: json }; });
      })
      .then(function (answer) {
        if (mine !== asked || !yamlActive()) return;
        if (!answer.ok) {
          showRows([]);
          if (empty) empty.classList.add("hidden");
          showError(answer.json.error || "the YAML could not be read");
          return;
        }
        // Still a diff, but say now what a submission would be refused for.
        var errors = answer.json.errors || {};
        var refused = Object.keys(errors).map(function (path) { return path + ": " + errors[path].join(", "); });
        showError(refused.length ? "A submission would be refused: " + refused.join("; ") : "");
        showRows(answer.json.diff.map(function (row) { return [row.path, shown(row.source), shown(row.new)]; }));
      })
      .catch(function () { if (mine === asked) showError("could not reach the server to compare the YAML"); });
  }
  function yamlActive() { return !!yamlForm && !yamlForm.classList.contains("hidden"); }
  function render() { if (yamlActive()) renderYaml(); else renderForm(); }

  // On the YAML tab the form is filled from the YAML (config_sync.js) and fires "change": the
  // YAML's own diff (asked of the server) owns the table there, or the two would race to write it.
  function formEdited() { if (!yamlActive()) renderForm(); }
  form.addEventListener("input", formEdited);
  form.addEventListener("change", formEdited);
  if (yamlForm) {
    yamlForm.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(renderYaml, 300);
    });
    // config_sync.js rewrote the text from the form (the tab was opened mid-sync).
    yamlForm.addEventListener("yaml-synced", function () { if (yamlActive()) renderYaml(); });
  }
  // tabs.js (loaded first) shows the clicked panel; the diff then follows the visible tab.
  document.querySelectorAll(".tab").forEach(function (tab) { tab.addEventListener("click", render); });
  render();
})();
