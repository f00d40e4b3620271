// FlowForge console: the only script. Everything works without it; it adds these.
// 1. An execution page follows its execution until it is over: a long poll
//    (GET …/changes?since=<version>) answers when the execution changes, then the page's
//    fragment is fetched and swapped in, never while you are typing in it. When the
//    server's waits are all taken it answers at once with Retry-After: ask again then.
// 2. The executions list says how many of its executions changed since it was loaded.
// 3. A bulk action's next batch is submitted for you.
// 4. The definition editor's draft is checked as you type: the server renders the
//    answer (problems with their paths, or the DAG and the diff) and it is swapped in.
(function () {
  "use strict";
  var asking = { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } };
  var live = document.getElementById("live");
  if (live && live.dataset.changes) {
    var dirty = false;
    live.addEventListener("input", function () { dirty = true; });
    var busy = function () {
      var active = document.activeElement;
      return dirty || (active && live.contains(active) && active.tagName !== "BUTTON");
    };
    var watch;
    var later = function (seconds) { window.setTimeout(watch, seconds * 1000); };
    // Signed out, no longer allowed, deleted, refused: a reload says why; stop asking.
    var gone = function (status) { return status >= 400 && status < 500; };
    var refresh = function () {
      if (busy()) { window.setTimeout(refresh, 2000); return; }
      fetch(live.dataset.src, asking).then(function (response) {
        if (gone(response.status)) { live.dataset.live = "0"; return null; }
        if (!response.ok) { throw new Error(String(response.status)); }
        var more = response.headers.get("X-Live") === "1";
        var version = response.headers.get("X-Version");
        return response.text().then(function (html) {
          live.innerHTML = html;
          if (version) { live.dataset.version = version; }
          live.dataset.live = more ? "1" : "0";
          if (more) { later(0); }
        });
      }).catch(function () { window.setTimeout(refresh, 5000); });
    };
    watch = function () {
      var url = live.dataset.changes + "?since=" + encodeURIComponent(live.dataset.version);
      fetch(url, asking).then(function (response) {
        if (gone(response.status)) { live.dataset.live = "0"; return null; }
        if (!response.ok) { throw new Error(String(response.status)); }
        var retry = parseInt(response.headers.get("Retry-After") || "0", 10) || 0;
        return response.json().then(function (body) {
          if (body.changed) { refresh(); } else if (body.live) { later(retry); }
          else { live.dataset.live = "0"; }
        });
      }).catch(function () { later(5); });
    };
    if (live.dataset.live === "1") { later(0); }
  }
  var changed = document.getElementById("changed");
  if (changed && changed.dataset.src) {
    var every = (parseInt(changed.dataset.every, 10) || 30) * 1000;
    var count = function () {
      fetch(changed.dataset.src, asking).then(function (response) {
        // A refusal (signed out, a filter too costly to count) ends the counting.
        if (response.status >= 400 && response.status < 500) { return null; }
        if (!response.ok) { throw new Error(String(response.status)); }
        return response.json();
      }).then(function (body) {
        if (body && body.changed > 0) {
          document.getElementById("changed-n").textContent =
            body.changed + (body.capped ? "+" : "");
          changed.hidden = false;
        }
        if (body && !body.capped) { window.setTimeout(count, every); }
      }).catch(function () { window.setTimeout(count, 2 * every); });
    };
    window.setTimeout(count, every);
  }
  var editor = document.getElementById("editor");
  var draft = document.getElementById("draft");
  if (editor && draft && editor.dataset.check) {
    var timer = null;
    var sent = 0;
    var check = function () {
      var mine = ++sent;
      fetch(editor.dataset.check, {
        method: "POST", credentials: "same-origin", body: new FormData(editor),
        headers: { "X-Requested-With": "fetch" }
      }).then(function (response) {
        return response.ok ? response.text() : null;
      }).then(function (html) {
        if (html !== null && mine === sent) { document.getElementById("checked").innerHTML = html; }
      }).catch(function () { /* the Check button still works */ });
    };
    draft.addEventListener("input", function () {
      if (timer) { window.clearTimeout(timer); }
      timer = window.setTimeout(check, 300);
    });
  }
  var next = document.querySelector("form[data-autosubmit]");
  if (next) { window.setTimeout(function () { next.submit(); }, 300); }
})();
