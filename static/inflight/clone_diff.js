// "New run from this": as the form is edited, list the fields whose value differs from the
// source run's (the page embeds what each input showed for the source).
(function () {
  "use strict";
  var sourceEl = document.getElementById("clone-source");
  var form = document.querySelector('form[data-panel="form"]');
  var body = document.querySelector("#clone-diff-table tbody");
  if (!sourceEl || !form || !body) return;
  var source = JSON.parse(sourceEl.textContent);
  var empty = document.getElementById("clone-diff-empty");

  function current(el) { return el.type === "checkbox" ? el.checked : String(el.value).trim(); }
  function same(a, b) {
    if (typeof a === "boolean" || typeof b === "boolean") return a === b;
    a = String(a).trim(); b = String(b).trim();
    if (a === b) return true;
    // 1e-4 and 0.0001 are the same number.
    return a !== "" && b !== "" && !isNaN(Number(a)) && !isNaN(Number(b)) && Number(a) === Number(b);
  }
  function shown(v) { return typeof v === "boolean" ? String(v) : (v === "" ? "—" : v); }

  function render() {
    var rows = [];
    form.querySelectorAll("[name]").forEach(function (el) {
      if (el.type === "hidden" || !Object.prototype.hasOwnProperty.call(source, el.name) || el.name === "name") return;
      var value = current(el);
      if (!same(value, source[el.name])) rows.push([el.name, shown(source[el.name]), shown(value)]);
    });
    body.innerHTML = "";
    rows.forEach(function (row) {
      var tr = document.createElement("tr");
      tr.dataset.path = row[0];
      row.forEach(function (text, i) {
        var td = document.createElement("td");
        td.className = "mono";
        td.textContent = text;
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    if (empty) empty.classList.toggle("hidden", rows.length > 0);
  }

  form.addEventListener("input", render);
  form.addEventListener("change", render);
  render();
})();
