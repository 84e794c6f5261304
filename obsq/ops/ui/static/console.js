// obsq console: refresh the live part of the page every few seconds (without reloading it),
// and ask before destructive actions. Loaded as a file: the CSP allows no inline script.
(() => {
  "use strict";
  const live = document.getElementById("live");
  const status = document.getElementById("live-status");
  const every = live ? Number(live.dataset.refresh) || 0 : 0;
  let shown = null;
  let busy = false;

  function interacting() {
    const focused = document.activeElement;
    if (focused && live.contains(focused) && focused.matches("input, select, textarea, button")) {
      return true;
    }
    const selection = window.getSelection();
    return Boolean(selection && !selection.isCollapsed && live.contains(selection.anchorNode));
  }

  function say(text, stale) {
    if (!status) return;
    status.textContent = text;
    status.classList.toggle("stale", stale);
  }

  async function refresh() {
    if (busy || document.hidden || interacting()) return;
    busy = true;
    try {
      const response = await fetch(window.location.href, {
        headers: { "X-Obsq-Fragment": "1" }, credentials: "same-origin", cache: "no-store",
      });
      if (!response.ok) {
        say(`stale (${response.status})`, true);
        return;
      }
      const html = await response.text();
      if (html !== shown && !interacting()) {
        live.innerHTML = html;  // rendered and escaped by the server
        shown = html;
      }
      say(`live · ${new Date().toLocaleTimeString()}`, false);
    } catch (error) {
      say("offline", true);
    } finally {
      busy = false;
    }
  }

  if (every > 0) window.setInterval(refresh, every);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  document.addEventListener("submit", (event) => {
    const question = event.target.dataset && event.target.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();
