// mldoctor report: small, dependency-free enhancements. The page reads fine without them.
(function () {
  "use strict";
  var status = document.getElementById("rank-status");
  var grid = document.getElementById("rank-grid");
  var names = {};
  document.querySelectorAll(".legend button[data-state]").forEach(function (b) {
    names[b.getAttribute("data-cls")] = b.getAttribute("data-state");
  });

  function stateOf(cell) {
    var cls = (cell.className || "").split(" ")[0];
    return names[cls] || cls;
  }

  if (grid && status) {
    grid.addEventListener("mouseover", function (ev) {
      var t = ev.target;
      if (t && t.tagName === "I") {
        var culprit = t.classList.contains("c") ? " (culprit)" : "";
        status.textContent = "rank " + t.getAttribute("data-r") + ": " + stateOf(t) + culprit;
      }
    });
  }

  // Click a legend entry to highlight the ranks in that state; click again to clear.
  document.querySelectorAll(".legend button[data-cls]").forEach(function (b) {
    b.addEventListener("click", function () {
      if (!grid) { return; }
      var cls = b.getAttribute("data-cls");
      var on = !b.classList.contains("on");
      document.querySelectorAll(".legend button.on").forEach(function (x) { x.classList.remove("on"); });
      grid.querySelectorAll("i.hl").forEach(function (x) { x.classList.remove("hl"); });
      grid.classList.toggle("filter", on);
      if (on) {
        b.classList.add("on");
        grid.querySelectorAll("i." + cls).forEach(function (x) { x.classList.add("hl"); });
      }
    });
  });

  // Copy buttons next to the reproduce commands.
  document.querySelectorAll("button.copy[data-target]").forEach(function (b) {
    b.addEventListener("click", function () {
      var el = document.getElementById(b.getAttribute("data-target"));
      if (!el) { return; }
      var text = el.textContent;
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(text).then(function () { b.textContent = "copied"; },
                                                 function () { b.textContent = "select and copy"; });
      } else {
        b.textContent = "select and copy";
      }
    });
  });
})();
