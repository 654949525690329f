// A form with data-confirm="question" asks before it is sent (Stop run: a stopped run keeps
// only what its last checkpoint saved). Cancelling the question sends nothing.
(function () {
  "use strict";
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });
})();
