// nexus-mcp console: the only script (no inline code: the CSP allows scripts from here only).
// The inbox asks which requests wait every few seconds and swaps in the new list when that
// changed; it never touches a form someone is typing in.
"use strict";
(function () {
  var list = document.getElementById("inbox-list");
  if (!list) { return; }
  var poll = list.getAttribute("data-poll");
  var source = list.getAttribute("data-list");
  function busy() {
    var active = document.activeElement;
    return active && list.contains(active) && active.tagName === "INPUT";
  }
  function check() {
    fetch(poll, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (body) {
        if (!body || body.state === list.getAttribute("data-state") || busy()) { return null; }
        return fetch(source, { credentials: "same-origin", cache: "no-store" })
          .then(function (r) { return r.ok ? r.text() : null; })
          .then(function (html) {
            if (html === null) { return; }
            // Server-rendered and escaped by the same templates as the page itself.
            var doc = new DOMParser().parseFromString(html, "text/html");
            list.replaceChildren.apply(list, Array.prototype.slice.call(doc.body.childNodes));
            list.setAttribute("data-state", body.state);
          });
      })
      .catch(function () { /* the next tick tries again */ });
  }
  window.setInterval(check, 2000);
})();
