// The console's only script (no third-party code): confirmations, "select all", auto-refresh.
document.addEventListener("DOMContentLoaded", () => {
  // A form (or a submit button) with data-confirm asks before it is sent.
  document.addEventListener("submit", (event) => {
    const button = event.submitter;
    const text = (button && button.dataset.confirm) || event.target.dataset.confirm;
    if (text && !window.confirm(text)) event.preventDefault();
  });
  const all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", () => {
      document.querySelectorAll("input.pick").forEach((box) => { box.checked = all.checked; });
    });
  }
  const refresh = document.getElementById("autorefresh");
  if (refresh) {
    refresh.checked = sessionStorage.getItem("fluxpg-autorefresh") === "1";
    let timer = null;
    const arm = () => {
      if (timer) clearTimeout(timer);
      timer = refresh.checked ? setTimeout(() => window.location.reload(), 5000) : null;
    };
    refresh.addEventListener("change", () => {
      sessionStorage.setItem("fluxpg-autorefresh", refresh.checked ? "1" : "0");
      arm();
    });
    arm();
  }
});
