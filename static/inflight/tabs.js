// Create page: switch between the generated form and the raw YAML editor.
(function () {
  "use strict";
  document.querySelectorAll(".tab").forEach(function (tab) {
    tab.addEventListener("click", function () {
      document.querySelectorAll(".tab").forEach(function (t) { t.classList.toggle("active", t === tab); });
      document.querySelectorAll(".tab-panel").forEach(function (panel) {
        panel.classList.toggle("hidden", panel.dataset.panel !== tab.dataset.tab);
      });
    });
  });
})();

// Create page after a refused submit: the error summary at the top is scrolled to and focused
// (a screen reader reads it), and each of its links focuses the field it names, opening the
// section it sits in; the browser's own jump would leave the focus on the link.
(function () {
  "use strict";
  var summary = document.querySelector(".tab-panel:not(.hidden) .error-summary");
  if (summary) {
    // Under the page's title when it fits the first screen; brought into view otherwise.
    var top = summary.getBoundingClientRect().top;
    if (top < 0 || top > window.innerHeight * 0.6) summary.scrollIntoView({ block: "center" });
    summary.focus({ preventScroll: true });
  }
  document.querySelectorAll("[data-error-link]").forEach(function (link) {
    link.addEventListener("click", function (event) {
      var target = document.getElementById(link.dataset.errorLink);
      if (!target) return;
      event.preventDefault();
      var details = target.closest("details");
      if (details) details.open = true;
      var field = target.closest(".field") || target;
      field.scrollIntoView({ block: "center" });
      // A switch's checkbox is visually hidden: focus it anyway (keyboard users toggle it).
      if (typeof target.focus === "function") target.focus({ preventScroll: true });
      field.classList.add("error-target");
      setTimeout(function () { field.classList.remove("error-target"); }, 1600);
    });
  });
})();
