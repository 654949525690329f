// Run page: the Rollouts tab (filtered table, live rows, token-coloured sample view, its group),
// evaluation samples in the same view, and alerts (banner + marks on the charts).
// Live pushes arrive on the run page's socket and are handed here as "inflight:push" events.
(function () {
  "use strict";
  var panel = document.getElementById("rollouts-panel");
  if (!panel) return;
  var base = panel.dataset.baseUrl;
  var VERSION_COLOURS = ["#dbeafe", "#fde68a", "#bbf7d0", "#fecaca", "#e9d5ff", "#fed7aa", "#a5f3fc", "#f5d0fe", "#d9f99d", "#e5e7eb"];
  var MAX_ROWS = 500;
  var filters = {};
  var nextCursor = null;
  var current = null; // the sample shown
  var colourBy = "version";
  var alerts = [];

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) { node.setAttribute(key, attrs[key]); });
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (!r.ok) throw new Error(url + " → " + r.status);
      return r.json();
    });
  }

  // ---------------------------------------------------------------- tabs

  function showTab(name, scroll) {
    document.querySelectorAll("[data-run-tab]").forEach(function (tab) { tab.classList.toggle("active", tab.dataset.runTab === name); });
    document.querySelectorAll("[data-run-panel]").forEach(function (p) { p.classList.toggle("hidden", p.dataset.runPanel !== name); });
    // The tab bar goes to the top of the screen: what the tab shows starts in view, whatever
    // stands above it (the run's actions and checkpoints).
    var bar = document.querySelector(".run-tabs");
    if (scroll && bar && bar.getBoundingClientRect().top > 80) bar.scrollIntoView({ block: "start" });
    if (name === "metrics" && window.inflightRunPage) window.inflightRunPage.rerender(); // plots sized while hidden
    history.replaceState(null, "", name === "rollouts" ? "#rollouts" : location.pathname + location.search);
    watchRows(name === "rollouts");
  }

  // New rows are pushed only while this tab shows (the server sends them to the pages that ask): on
  // showing it the page asks, loads the stored rows, and loads them again once the socket answers
  // that the rows come (and after every reconnect): a row stored between the first load and the
  // subscription is in the second.
  var watchingRows = false;
  function watchRows(on) {
    if (on === watchingRows) return;
    watchingRows = on;
    if (window.inflightRunPage) window.inflightRunPage.watch({ rollouts: on });
    if (on) load(false);
  }
  document.querySelectorAll("[data-run-tab]").forEach(function (tab) {
    tab.addEventListener("click", function () { showTab(tab.dataset.runTab, tab.dataset.runTab === "rollouts"); });
  });

  // ---------------------------------------------------------------- table

  // Why the actor did not train a sample (RolloutSummary.discarded): the badge's title. A reason not
  // listed here (a newer engine's) is shown as written.
  var DISCARD_REASONS = {
    zero_advantage: "its group's rewards were all equal (advantage 0): the run drops such groups",
    aborted: "its server aborted the response before it finished",
    empty: "the response has no token",
    stale: "the trainer dropped it: its tokens were older than actor.max_lag allows",
  };
  function reasonLabel(reason) { return reason.replace(/_/g, " "); }
  function discardBadge(reason) {
    return el("span", { "class": "discard-badge", "data-reason": reason, title: "not trained: " + (DISCARD_REASONS[reason] || reason) }, reasonLabel(reason));
  }

  function versionColour(v) { return VERSION_COLOURS[((v % VERSION_COLOURS.length) + VERSION_COLOURS.length) % VERSION_COLOURS.length]; }

  function rowFor(r) {
    var tr = el("tr", { "data-id": r.id, "data-step": r.step, "data-correct": r.correct ? "1" : "0", "data-discarded": r.discarded || "",
                        "class": "rollout-row" + (r.discarded ? " discarded" : "") });
    tr.appendChild(el("td", { "class": "num" }, r.step));
    tr.appendChild(el("td", { "class": "mono clip", title: r.prompt }, r.prompt));
    var response = el("td", { "class": "mono clip" }, r.response);
    if (r.discarded) response.insertBefore(discardBadge(r.discarded), response.firstChild); // before any tool badge
    if (r.tool_calls) { // a multi-turn sample: how many times it called the tool, before its text
      response.insertBefore(el("span", { "class": "tool-badge", title: "tool calls in this sample" }, r.tool_calls + (r.tool_calls === 1 ? " tool call" : " tool calls")), response.firstChild);
    }
    tr.appendChild(response);
    tr.appendChild(el("td", { "class": "num" }, Number(r.reward).toFixed(2)));
    tr.appendChild(el("td", {}, r.correct ? "✓" : "✗"));
    tr.appendChild(el("td", { "class": "num" }, r.length));
    var versions = el("td", { "class": "num" }, r.versions_spanned + (r.versions_spanned > 1 ? " (v" + r.min_version + "–" + r.max_version + ")" : " (v" + r.min_version + ")"));
    tr.appendChild(versions);
    tr.appendChild(el("td", { "class": "num" }, r.max_lag));
    tr.addEventListener("click", function () { openSample(r.id); });
    return tr;
  }

  function matches(r) {
    function num(name) { return filters[name] === undefined ? null : Number(filters[name]); }
    if (num("step_min") !== null && r.step < num("step_min")) return false;
    if (num("step_max") !== null && r.step > num("step_max")) return false;
    if (num("reward_min") !== null && r.reward < num("reward_min")) return false;
    if (num("reward_max") !== null && r.reward > num("reward_max")) return false;
    if (num("length_min") !== null && r.length < num("length_min")) return false;
    if (num("length_max") !== null && r.length > num("length_max")) return false;
    if (filters.correct !== undefined && String(r.correct) !== filters.correct) return false;
    if (filters.discarded === "false" && r.discarded) return false;
    if (filters.discarded === "true" && !r.discarded) return false;
    if (filters.discarded !== undefined && filters.discarded !== "true" && filters.discarded !== "false" && r.discarded !== filters.discarded) return false;
    return true;
  }

  // The first page's counts (trained, and per discard reason) under the other filters; a reason
  // present gets its own choice in the filter.
  var countsEl = document.getElementById("rollouts-counts");
  var reasonSelect = document.querySelector('#rollout-filters select[name="discarded"]');
  function showCounts(counts) {
    if (!counts) return;
    var parts = ["trained " + (counts.trained || 0)];
    var reasons = Object.keys(counts).filter(function (k) { return k !== "trained"; }).sort();
    var discarded = reasons.reduce(function (sum, k) { return sum + counts[k]; }, 0);
    parts.push("discarded " + discarded + (reasons.length ? " (" + reasons.map(function (k) { return reasonLabel(k) + " " + counts[k]; }).join(", ") + ")" : ""));
    countsEl.textContent = parts.join(" · ");
    reasons.forEach(function (k) {
      if (reasonSelect.querySelector('option[value="' + k + '"]')) return;
      reasonSelect.appendChild(el("option", { value: k }, "discarded: " + reasonLabel(k)));
    });
  }

  function query(cursor, url) {
    var params = new URLSearchParams(filters);
    if (cursor !== null && cursor !== undefined) params.set("cursor", cursor);
    return (url || panel.dataset.listUrl) + "?" + params.toString();
  }

  var body = document.getElementById("rollouts-body");
  var more = document.getElementById("rollouts-more");

  // A first page asked later supersedes one still on its way (its answer would be older); live rows
  // that arrive while a first page loads are put back on top of it.
  var loads = 0;
  var arrivedWhileLoading = null;
  function load(append) {
    var mine = append ? loads : ++loads;
    if (!append) arrivedWhileLoading = [];
    return getJSON(query(append ? nextCursor : null)).then(function (page) {
      if (mine !== loads) return;
      if (!append) {
        body.textContent = "";
        var arrived = arrivedWhileLoading;
        arrivedWhileLoading = null;
        page.rollouts.forEach(function (r) { body.appendChild(rowFor(r)); });
        addLiveRows(arrived);
      } else {
        page.rollouts.forEach(function (r) { body.appendChild(rowFor(r)); });
      }
      showCounts(page.counts);
      nextCursor = page.next_cursor;
      more.classList.toggle("hidden", nextCursor === null);
      if (!body.children.length) {
        var tr = el("tr", { "class": "empty" });
        tr.appendChild(el("td", { colspan: "8", "class": "muted" }, "No stored rollout matches."));
        body.appendChild(tr);
      }
    }).catch(function (error) {
      if (mine !== loads) return;
      if (!append && arrivedWhileLoading !== null) { var arrived = arrivedWhileLoading; arrivedWhileLoading = null; addLiveRows(arrived); }
      document.getElementById("rollouts-info").textContent = String(error);
    });
  }

  // Bursts close together cause one load.
  var loadTimer = null;
  function loadSoon() {
    if (loadTimer !== null) return;
    loadTimer = setTimeout(function () { loadTimer = null; load(false); }, 1000);
  }

  document.getElementById("rollout-filters").addEventListener("submit", function (event) {
    event.preventDefault();
    filters = {};
    new FormData(event.target).forEach(function (value, key) { if (value !== "") filters[key] = String(value); });
    load(false);
  });
  more.addEventListener("click", function () { load(true); });

  // The counts follow the stored rows while the run runs: a pushed batch asks for them again (the
  // counts alone, not a page of rows), at most every COUNTS_EVERY_MS (they are the database's, so
  // rows thinned out of the store leave them too, which counting pushed rows here would not see).
  var COUNTS_EVERY_MS = 3000;
  var countsTimer = null;
  function refreshCountsSoon() {
    if (countsTimer !== null) return;
    countsTimer = setTimeout(function () {
      getJSON(query(null, panel.dataset.countsUrl)).then(function (answer) { showCounts(answer.counts); })
        .catch(function () { /* the next batch asks again */ })
        .then(function () { countsTimer = null; });
    }, COUNTS_EVERY_MS);
  }

  function addLiveRows(rows) {
    if (arrivedWhileLoading !== null) { Array.prototype.push.apply(arrivedWhileLoading, rows); return; }
    var empty = body.querySelector("tr.empty");
    rows.forEach(function (r) {
      if (!matches(r) || body.querySelector('tr[data-id="' + r.id + '"]')) return;
      if (empty) { empty.remove(); empty = null; }
      body.insertBefore(rowFor(r), body.firstChild); // rows come oldest first: newest ends on top
    });
    while (body.children.length > MAX_ROWS) body.lastChild.remove();
    if (rows.length) refreshCountsSoon();
  }

  // ---------------------------------------------------------------- sample view

  var view = document.getElementById("sample-view");
  var tokensEl = document.getElementById("sample-tokens");
  var legend = document.getElementById("sample-legend");

  function logprobColour(lp) { // 0 (certain) white → very unlikely deep red
    var x = Math.max(0, Math.min(1, -lp / 6));
    return "rgba(220,38,38," + (0.08 + 0.8 * x).toFixed(2) + ")";
  }
  function ratioColour(r) { // < 1 blue, > 1 red, 1 white
    var x = Math.max(-1, Math.min(1, Math.log(r) / Math.log(2)));
    return x >= 0 ? "rgba(220,38,38," + (0.05 + 0.8 * x).toFixed(2) + ")" : "rgba(37,99,235," + (0.05 - 0.8 * x).toFixed(2) + ")";
  }

  function renderTokens() {
    tokensEl.textContent = "";
    legend.textContent = "";
    if (!current) return;
    if (current.kind === "eval") {
      current.samples.forEach(function (s, i) {
        var block = el("div", { "class": "eval-sample " + (s.correct ? "ok" : "bad") });
        block.appendChild(el("b", {}, "#" + (i + 1) + " " + (s.correct ? "✓" : "✗") + " extracted: " + (s.extracted === null ? "—" : s.extracted)));
        if (s.used_tool === true) {
          var badge = el("span", { "class": "tool-badge", "data-used-tool": "1" }, "called the tool");
          badge.style.marginLeft = "8px";
          block.appendChild(badge);
        }
        var text = el("pre", { "class": "mono tok-eval" }, s.text);
        text.style.background = versionColour(current.policy_versions.length ? current.policy_versions[0] : 0);
        block.appendChild(text);
        tokensEl.appendChild(block);
      });
      (current.policy_versions || []).forEach(function (v) { legendItem(v); });
      return;
    }
    var seen = [];
    var mask = current.completion_mask; // null: every token the policy's
    var anyTool = false;
    var previousPolicy = null; // the version of the last policy token drawn (switches skip tool output)

    // One token. A tool's output (mask 0) is context, not the policy's: no version, logprob or
    // ratio to show, so it is drawn apart and never coloured by them.
    function tokenSpan(i) {
      var piece = current.tokens[i];
      if (mask && !mask[i]) {
        anyTool = true;
        return el("span", { "class": "tok tok-tool", "data-tool": "1", title: "tool output: context only, not sampled by the policy (no version, logprob or ratio), not trained" }, piece);
      }
      var v = current.versions[i];
      var ratio = current.ratios ? current.ratios[i] : null;
      var span = el("span", { "class": "tok", "data-version": v, title: "v" + v + " · logprob " + current.logprobs[i].toFixed(3) + (ratio !== null && ratio !== undefined ? " · ratio " + ratio.toFixed(3) : "") }, piece);
      if (ratio !== null && ratio !== undefined) span.dataset.ratio = ratio.toFixed(4);
      if (colourBy === "version") span.style.background = versionColour(v);
      else if (colourBy === "logprob") span.style.background = logprobColour(current.logprobs[i]);
      else if (ratio !== null && ratio !== undefined) span.style.background = ratioColour(ratio);
      if (current.version_switches.indexOf(i) >= 0) {
        span.classList.add("tok-switch");  // not "switch": that is the form toggle's class (a flex block)
        span.title += " · weights updated here (v" + previousPolicy + " → v" + v + ")";
      }
      previousPolicy = v;
      if (seen.indexOf(v) < 0) seen.push(v);
      return span;
    }

    if (current.turns && current.turns.length) {
      // A multi-turn sample: each turn its own block, in order (a model turn's versions and an
      // update that landed before it; a tool turn's status and seconds).
      var covered = 0;
      current.turns.forEach(function (turn, t) {
        var block = el("div", { "class": "turn turn-" + turn.kind, "data-kind": turn.kind, "data-turn": t });
        var head = el("div", { "class": "turn-head" });
        if (turn.kind === "tool") {
          head.appendChild(el("b", {}, "Tool output"));
          head.appendChild(el("span", { "class": "tool-status tool-status-" + (turn.status || "unknown"), "data-status": turn.status || "" }, turn.status || "no status"));
          head.appendChild(el("span", { "class": "muted" }, (turn.seconds === null || turn.seconds === undefined ? "—" : Number(turn.seconds).toFixed(2) + " s") +
            " · " + (turn.end - turn.start) + " tokens · context only: not trained, no ratio"));
        } else {
          head.appendChild(el("b", {}, "Model turn"));
          var versions = turn.versions || [];
          head.appendChild(el("span", { "class": "muted turn-versions" }, versions.length ? "v" + versions.join(" → v") + (versions.length > 1 ? " (weights updated inside this turn)" : "") : "no tokens"));
          if (turn.updated_before) {
            head.appendChild(el("span", { "class": "turn-update", title: "the trainer's weights reached the servers between the previous model turn and this one" },
              "weights updated before this turn: v" + turn.updated_before.from + " → v" + turn.updated_before.to));
          }
        }
        block.appendChild(head);
        var body = el("div", { "class": "turn-tokens" });
        for (var i = turn.start; i < turn.end; i++) body.appendChild(tokenSpan(i));
        covered += turn.end - turn.start;
        block.appendChild(body);
        tokensEl.appendChild(block);
      });
      if (covered < current.tokens.length) { // tokens no turn names (a malformed record): still shown
        var rest = el("div", { "class": "turn" });
        rest.appendChild(el("div", { "class": "turn-head muted" }, "tokens outside the recorded turns"));
        var inTurn = new Array(current.tokens.length).fill(false);
        current.turns.forEach(function (turn) { for (var j = turn.start; j < turn.end; j++) inTurn[j] = true; });
        inTurn.forEach(function (inside, j) { if (!inside) rest.appendChild(tokenSpan(j)); });
        tokensEl.appendChild(rest);
      }
    } else {
      current.tokens.forEach(function (_, i) { tokensEl.appendChild(tokenSpan(i)); });
    }
    if (colourBy === "version") seen.forEach(legendItem);
    else legend.appendChild(el("span", { "class": "muted" }, colourBy === "logprob" ? "darker red = less likely under the sampling policy" : "blue: ratio < 1, red: ratio > 1 (trainer vs sampler)"));
    if (anyTool) legend.appendChild(el("span", { "class": "legend-item tok-tool", "data-tool": "1" }, "tool output (not the policy's)"));
  }

  function legendItem(v) {
    var item = el("span", { "class": "legend-item", "data-version": v }, "v" + v);
    item.style.background = versionColour(v);
    legend.appendChild(item);
  }

  function openSample(id) {
    getJSON(base + "rollouts/" + id + ".json").then(function (s) {
      current = s;
      current.kind = "rollout";
      document.getElementById("sample-title").textContent = "Step " + s.step + " · " + s.sample_id;
      document.getElementById("sample-meta").textContent = "reward " + s.reward + " · " + (s.correct ? "correct" : "wrong") + " · extracted " + (s.extracted || "—") +
        " · advantage " + s.advantage.toFixed(3) + " · " + s.length + " tokens · versions v" + s.min_version + "–v" + s.max_version +
        (s.version_switches.length ? " · switched at token " + s.version_switches.join(", ") : "") + " · max lag " + s.max_lag + " · " + s.finish_reason +
        (s.turns ? " · " + s.turns.length + " turns, " + s.tool_calls + " tool call" + (s.tool_calls === 1 ? "" : "s") : "") + (s.env ? " · env " + s.env : "") +
        (s.discarded ? " · discarded (" + reasonLabel(s.discarded) + "): not trained, " + (DISCARD_REASONS[s.discarded] || s.discarded) : "");
      document.getElementById("sample-prompt").textContent = s.prompt_text;
      var ratioInput = document.getElementById("colour-ratio");
      ratioInput.disabled = !s.ratios;
      // The trainer records its logprobs on every keep_every_n_steps-th step (monitoring.rollouts.train_logprobs);
      // they arrive a moment after the sample is stored, once that step is trained.
      ratioInput.parentNode.title = s.ratios ? "" : (s.ratios_missing || "no trainer logprobs for this sample");
      if (!s.ratios && colourBy === "ratio") { // fall back to versions rather than showing no colours
        colourBy = "version";
        document.querySelector('input[name="colour"][value="version"]').checked = true;
      }
      document.getElementById("sample-group").classList.remove("hidden");
      document.getElementById("sample-group-view").classList.add("hidden");
      renderTokens();
      view.classList.remove("hidden");
    });
  }

  function openEvalProblem(evalId, problemId) {
    getJSON(base + "evals/" + evalId + "/problem.json?problem_id=" + encodeURIComponent(problemId)).then(function (p) {
      current = p;
      current.kind = "eval";
      document.getElementById("sample-title").textContent = p.benchmark + " step " + p.step + " · " + p.problem_id;
      document.getElementById("sample-meta").textContent = "answer " + p.answer + " · mean " + p.mean.toFixed(2) + " · " + (p.pass ? "solved" : "not solved") +
        (p.used_tool === true ? " · used the tool" : p.used_tool === false ? " · no tool call" : "") + " · policy v" + (p.policy_versions || []).join(", v");
      // The problem as asked (evaluations stored before it was recorded have only its id).
      document.getElementById("sample-prompt").textContent = p.problem || "(the benchmark's problem " + p.problem_id + ")";
      document.getElementById("sample-group").classList.add("hidden");
      document.getElementById("sample-group-view").classList.add("hidden");
      renderTokens();
      view.classList.remove("hidden");
    });
  }

  function openGroup() {
    if (!current || current.kind !== "rollout") return;
    getJSON(base + "rollouts/" + current.id + "/group.json").then(function (g) {
      var box = document.getElementById("sample-group-view");
      box.textContent = "";
      box.appendChild(el("h4", {}, "Group " + g.group_id + " (" + g.samples.length + " stored)"));
      var table = el("table", { "class": "table compact" });
      var head = el("tr");
      ["sample", "reward", "advantage", "correct", "length", "response"].forEach(function (h) { head.appendChild(el("th", {}, h)); });
      table.appendChild(head);
      g.samples.forEach(function (s) {
        var tr = el("tr", { "class": "rollout-row" + (s.id === current.id ? " current" : "") + (s.discarded ? " discarded" : "") });
        [s.sample_id, Number(s.reward).toFixed(2), Number(s.advantage).toFixed(3), s.correct ? "✓" : "✗", s.length, s.response].forEach(function (v) { tr.appendChild(el("td", { "class": "mono" }, v)); });
        if (s.discarded) tr.lastChild.insertBefore(discardBadge(s.discarded), tr.lastChild.firstChild);
        tr.addEventListener("click", function () { openSample(s.id); });
        table.appendChild(tr);
      });
      box.appendChild(table);
      box.classList.remove("hidden");
    });
  }

  document.getElementById("sample-close").addEventListener("click", function () { view.classList.add("hidden"); });
  document.getElementById("sample-group").addEventListener("click", openGroup);
  view.addEventListener("click", function (event) { if (event.target === view) view.classList.add("hidden"); });
  document.addEventListener("keydown", function (event) { if (event.key === "Escape") view.classList.add("hidden"); });
  document.querySelectorAll('#sample-colour input[name="colour"]').forEach(function (input) {
    input.addEventListener("change", function () { colourBy = input.value; renderTokens(); });
  });
  document.querySelectorAll("tr.eval-problem").forEach(function (tr) {
    tr.addEventListener("click", function () { openEvalProblem(tr.dataset.evalId, tr.dataset.problemId); });
  });

  // ---------------------------------------------------------------- alerts

  var banner = document.getElementById("alert-banner");

  function addAlert(a) {
    if (alerts.some(function (b) { return b.id === a.id; })) return;
    alerts.push(a);
    var li = el("li", { "data-rule": a.rule }, (a.step !== null ? "step " + a.step + " · " : "") + a.title + ": " + a.message);
    document.getElementById("alert-list").appendChild(li);
    document.getElementById("alert-banner-count").textContent = alerts.length + (alerts.length === 1 ? " alert" : " alerts");
    banner.classList.remove("hidden");
    if (window.inflightRunPage) window.inflightRunPage.rerender();
  }

  // Vertical marks on every chart at the step (or time) each alert fired.
  window.inflightAlertMarks = function (axis, ctx) {
    return alerts.filter(function (a) { return a.step !== null || axis === "time"; }).map(function (a) {
      var x = axis === "time" ? (a.t - ctx.t0) / 60 : axis === "samples" ? a.step * ctx.samplesPerStep : a.step;
      return { type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1, line: { color: "#dc2626", width: 1.5, dash: "dot" } };
    });
  };

  getJSON(banner.dataset.url).then(function (data) { data.alerts.slice().reverse().forEach(addAlert); }).catch(function () {});

  document.addEventListener("inflight:push", function (event) {
    var message = event.detail;
    if (message.type === "rollouts.batch") {
      if (!watchingRows) return;
      // A burst larger than one push (the worker catching up): the rows it left out are in the list.
      if (message.more > 0) loadSoon(); else addLiveRows(message.rows);
    }
    else if (message.type === "watching") { if (message.rollouts && watchingRows) load(false); }
    else if (message.type === "alert.fired") addAlert(message.alert);
  });

  if (location.hash === "#rollouts") showTab("rollouts", true);
})();
