// The console's login page: POST /api/login sets the session cookie, then on to the console.
"use strict";
document.getElementById("login-form").addEventListener("submit", async ev => {
  ev.preventDefault();
  const err = document.getElementById("error");
  err.hidden = true;
  const body = {user: document.getElementById("user").value, password: document.getElementById("password").value};
  try {
    const r = await fetch("/api/login", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    const data = await r.json();
    if (!r.ok) throw new Error(data.error || `${r.status} ${r.statusText}`);
    location.replace("/");
  } catch (e) {
    err.textContent = e.message;
    err.hidden = false;
    document.getElementById("password").value = "";
  }
});
