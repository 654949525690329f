// Create page, Sweep panel: "Add a row" adds a grid row; the launch button says what it launches.
(function () {
  "use strict";
  var add = document.getElementById("sweep-add-row");
  var body = document.querySelector("#sweep-grid tbody");
  var on = document.getElementById("sweep-on");
  var launch = document.getElementById("launch-form");
  if (add && body) {
    add.addEventListener("click", function () {
      var row = body.rows[body.rows.length - 1].cloneNode(true);
      row.querySelectorAll("input").forEach(function (input) {
        input.value = "";
        input.setAttribute("aria-label", input.getAttribute("aria-label").replace(/\d+$/, String(body.rows.length + 1)));
      });
      body.appendChild(row);
      row.querySelector("input").focus();
    });
  }
  function label() { if (launch && on) launch.textContent = on.checked ? "Launch sweep" : "Launch run"; }
  if (on) { on.addEventListener("change", label); label(); }
})();
