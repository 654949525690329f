// Create page: the Form and YAML tabs are one config in two views. An edit on either is sent,
// after a pause in typing, to the server (runs/new/sync.json), which parses it as a submission
// would and answers the other view: the YAML text for the form's fields, each input's value for
// the YAML. A tab switch or a launch first waits for the sync in flight, so either tab launches
// the same config. What the YAML holds that the form cannot show (an unknown key, a comment) is
// said on the form, which then stays read-only so that it never drops it.
(function () {
  "use strict";
  var formEl = document.querySelector('form[data-panel="form"]');
  var yamlForm = document.querySelector('form[data-panel="yaml"]');
  if (!formEl || !yamlForm || !formEl.dataset.syncUrl) return;
  var textarea = yamlForm.querySelector('textarea[name="config_yaml"]');
  var url = formEl.dataset.syncUrl;
  var notice = document.getElementById("form-unshown");
  var noticeWhat = document.getElementById("form-unshown-what");
  var yamlError = document.getElementById("yaml-sync-error");
  var token = (formEl.querySelector('[name="csrfmiddlewaretoken"]') || {}).value || "";
  var PAUSE_MS = 250;
  var timer = null;
  var due = null;  // the sync waiting for the pause: "yaml" (form → YAML) or "form" (YAML → form)
  var inFlight = Promise.resolve();
  var asked = 0;
  var applying = false;  // inputs being filled from the YAML: not an edit of the form

  function ask(body) {
    body.set("csrfmiddlewaretoken", token);
    return fetch(url, { method: "POST", body: body, credentials: "same-origin", headers: { Accept: "application/json", "X-CSRFToken": token } })
      .then(function (r) {
        return r.json().catch(function () { return { error: "the server answered " + r.status }; })
          .then(function (json) { return { ok: r.ok, json: json }; });
      });
  }

  function setReadOnly(reasons) {
    var blocked = reasons.length > 0;
    if (notice) notice.classList.toggle("hidden", !blocked);
    if (noticeWhat) noticeWhat.textContent = reasons.join("; ");
    formEl.querySelectorAll("fieldset").forEach(function (set) { set.disabled = blocked; });
    var launch = document.getElementById("launch-form");
    if (launch) launch.disabled = blocked;
  }

  function formToYaml(mine) {
    if (mine !== asked) return;  // outdated while it waited its turn
    var body = new FormData(formEl);
    body.set("to", "yaml");
    return ask(body).then(function (answer) {
      if (mine !== asked || !answer.ok) return;
      textarea.value = answer.json.yaml;
      // Setting a value fires no "input": say so, and the clone page's YAML diff follows.
      yamlForm.dispatchEvent(new Event("yaml-synced"));
    });
  }

  function yamlToForm(mine) {
    if (mine !== asked) return;
    var body = new FormData();
    body.set("to", "form");
    body.set("config_yaml", textarea.value);
    return ask(body).then(function (answer) {
      if (mine !== asked) return;
      if (yamlError) {
        yamlError.textContent = answer.ok ? "" : (answer.json.error || "the YAML could not be read") + " (the form shows the last YAML that could be read)";
        yamlError.classList.toggle("hidden", answer.ok);
      }
      if (!answer.ok) return;
      applying = true;
      try {
        Object.keys(answer.json.values).forEach(function (name) {
          var input = formEl.elements.namedItem(name);
          if (!input) return;
          var value = answer.json.values[name];
          if (input.type === "checkbox") input.checked = !!value;
          else input.value = value;
        });
        formEl.dispatchEvent(new Event("change"));  // the clone page's diff follows
      } finally {
        applying = false;
      }
      var reasons = [];
      if (answer.json.unshown.length) reasons.push("fields the form has no input for: " + answer.json.unshown.join(", "));
      if (answer.json.comments) reasons.push(answer.json.comments + " comment line" + (answer.json.comments === 1 ? "" : "s"));
      setReadOnly(reasons);
    });
  }

  // Numbered when asked for, not when sent: a sync queued behind a slow one is outdated by an
  // edit made while it waited, and is then never sent.
  function run(direction) {
    var mine = ++asked;
    var sync = direction === "yaml" ? formToYaml : yamlToForm;
    inFlight = inFlight.catch(function () {}).then(function () { return sync(mine); });
    return inFlight;
  }
  function schedule(direction) {
    // A new edit outdates every answer in flight: one landing now would overwrite what was just
    // typed (e.g. the form's YAML arriving after the user's first keys on the YAML tab).
    asked++;
    clearTimeout(timer);
    due = direction;
    timer = setTimeout(function () { timer = null; var d = due; due = null; run(d); }, PAUSE_MS);
  }
  // The sync waiting for its pause now, then whatever is in flight.
  function flush() {
    if (timer) { clearTimeout(timer); timer = null; var d = due; due = null; return run(d); }
    return inFlight.catch(function () {});
  }

  formEl.addEventListener("input", function () { if (!applying) schedule("yaml"); });
  formEl.addEventListener("change", function () { if (!applying) schedule("yaml"); });
  yamlForm.addEventListener("input", function () { schedule("form"); });
  document.querySelectorAll(".tab").forEach(function (tab) { tab.addEventListener("click", flush); });
  // Opened on the YAML tab (a refused YAML submission): say now what the form cannot show.
  if (!yamlForm.classList.contains("hidden")) run("form");
  [formEl, yamlForm].forEach(function (form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      flush().then(function () {
        form.submit();  // no submit event again: the launch buttons carry no name or value
      });
    });
  });
})();
