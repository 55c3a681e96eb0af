#include "api/http/status_page.h"

namespace loradb::http {

const std::string& StatusPageHtml() {
  static const std::string* page = new std::string(R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>loradb status</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fafafa; }
  h1 { font-size: 1.4em; margin: 0 0 .3em; }
  h2 { font-size: 1.1em; margin: 1.2em 0 .4em; }
  table { border-collapse: collapse; background: #fff; min-width: 30em; }
  th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; }
  th { background: #eee; }
  .ok { color: #070; } .bad { color: #a00; } .muted { color: #777; }
  #updated { font-size: .9em; }
</style>
</head>
<body>
<h1>loradb</h1>
<div>health: <span id="health" class="muted">...</span> <span id="updated" class="muted"></span></div>
<h2>Policies</h2>
<div id="policies" class="muted">loading...</div>
<h2>Tiers</h2>
<div id="tiers" class="muted">loading...</div>
<h2>Cache</h2>
<div id="cache" class="muted">loading...</div>
<h2>HTTP</h2>
<div id="http" class="muted">loading...</div>
<script>
"use strict";
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function table(cols, rows) {
  const t = el("table"), head = el("tr");
  cols.forEach(c => head.appendChild(el("th", c)));
  t.appendChild(head);
  rows.forEach(r => { const tr = el("tr"); r.forEach(v => tr.appendChild(el("td", v))); t.appendChild(tr); });
  return t;
}
function show(id, node) { const d = document.getElementById(id); d.className = ""; d.replaceChildren(node); }
function fail(id, err) {
  const d = document.getElementById(id);
  d.className = err.unavailable ? "muted" : "bad";
  d.textContent = String(err.message);
}
async function getJson(path) {
  const r = await fetch(path, { headers: { "Accept": "application/json" } });
  const body = await r.json().catch(() => ({}));
  if (r.status === 404 && body.error && body.error.message.startsWith("no route")) {
    const e = new Error("not available: this server has no " + path + " endpoint");
    e.unavailable = true;
    throw e;
  }
  if (!r.ok) throw new Error((body.error && body.error.message) || ("HTTP " + r.status));
  return body;
}
function pct(h, m) { const t = h + m; return t ? (100 * h / t).toFixed(1) + "%" : "-"; }
async function refresh() {
  try {
    const h = await getJson("/healthz");
    const e = document.getElementById("health"); e.textContent = h.status; e.className = "ok";
  } catch (err) { fail("health", err); }
  try {
    const p = await getJson("/v1/policies?limit=100");
    show("policies", p.policies.length === 0 ? el("span", "no policies", "muted") :
      table(["name", "base", "revisions", "aliases", "archived"],
            p.policies.map(x => [x.name, x.base, x.revision_count, Object.entries(x.aliases || {}).map(a => a[0] + "=" + a[1]).join(" "), x.archived ? "yes" : "no"])));
  } catch (err) { fail("policies", err); }
  try {
    const r = await getJson("/v1/residency");
    show("tiers", table(["tier", "entries", "bytes", "budget", "fragmentation"],
      r.tiers.map(t => [t.tier, t.entries, t.bytes, t.budget_bytes === undefined ? "-" : t.budget_bytes, t.fragmentation === undefined ? "-" : t.fragmentation])));
  } catch (err) { fail("tiers", err); }
  try {
    const s = await getJson("/v1/stats");
    show("cache", table(["tier", "hits", "misses", "hit rate", "loads", "joined", "rejected", "evictions"],
      s.tiers.map(t => [t.tier, t.hits, t.misses, pct(t.hits, t.misses), t.loads, t.joined_waiters, t.rejections, t.evictions])));
  } catch (err) { fail("cache", err); }
  try {
    const r = await fetch("/metrics");
    const text = await r.text();
    const rows = [];
    text.split("\n").forEach(line => {
      const m = line.match(/^loradb_http_requests_total\{route="([^"]*)",method="([^"]*)",code="(\d+)"\} (\d+)/);
      if (m) rows.push([m[2], m[1], m[3], m[4]]);
    });
    show("http", table(["method", "route", "status", "requests"], rows));
  } catch (err) { fail("http", err); }
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}
refresh();
setInterval(refresh, 5000);
</script>
</body>
</html>
)HTML");
  return *page;
}

}  // namespace loradb::http
