// Progressive enhancement only; every page works without it.
// A page answering a form post (a secret shown once, a refusal) replaces its history entry with
// a plain GET of its address, so that reloading it never posts the form again.
(function () {
  var target = document.body && document.body.getAttribute("data-replace-url");
  if (target && window.history && window.history.replaceState) {
    window.history.replaceState(null, "", target);
  }
  // Select a one-time secret on focus, ready to copy.
  var secret = document.querySelector(".secret-value");
  if (secret) {
    secret.addEventListener("focus", function () { secret.select(); });
  }
})();
