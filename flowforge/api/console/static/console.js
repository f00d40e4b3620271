// FlowForge console: the only script. Everything works without it; it adds two things.
// 1. A live execution page refreshes its fragment every 2 s while the execution moves
//    (the server says whether to go on in X-Live), never while you are typing in it.
// 2. A bulk action's next batch is submitted for you.
// 3. The definition editor's draft is checked as you type: the server renders the
//    answer (problems with their paths, or the DAG and the diff) and it is swapped in.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (live && live.dataset.live === "1") {
    var dirty = false;
    live.addEventListener("input", function () { dirty = true; });
    var poll = function () {
      var active = document.activeElement;
      if (dirty || (active && live.contains(active) && active.tagName !== "BUTTON")) {
        window.setTimeout(poll, 2000);
        return;
      }
      fetch(live.dataset.src, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
        .then(function (response) {
          if (response.status === 401) { live.dataset.live = "0"; return null; }
          if (!response.ok) { throw new Error(String(response.status)); }
          var more = response.headers.get("X-Live") === "1";
          return response.text().then(function (html) {
            live.innerHTML = html;
            live.dataset.live = more ? "1" : "0";
            if (more) { window.setTimeout(poll, 2000); }
          });
        })
        .catch(function () { window.setTimeout(poll, 5000); });
    };
    window.setTimeout(poll, 2000);
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
