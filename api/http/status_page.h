// The read-only status page served at `/`: plain HTML + JS (no build step) that polls the JSON
// API and shows policies, tiers and cache hit rates.
#ifndef LORADB_API_HTTP_STATUS_PAGE_H_
#define LORADB_API_HTTP_STATUS_PAGE_H_

#include <string>

namespace loradb::http {

// The page's HTML (self-contained: inline CSS and JS, same-origin fetches only).
const std::string& StatusPageHtml();

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_STATUS_PAGE_H_
