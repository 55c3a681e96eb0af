// A Jinja template engine for chat templates: parses a template once and renders it as Python's
// jinja2 does in the environment transformers' apply_chat_template uses (ImmutableSandboxed-
// Environment with trim_blocks and lstrip_blocks, the loopcontrols extension, the
// `{% generation %}` block; globals raise_exception, strftime_now, namespace, dict, range; the
// tojson filter with json.dumps' options). What it does not implement (include, extends, import,
// recursive loops, filters and tests it does not know) is refused at parse time with the name and
// line, and every error is a Status: nothing throws.
//
// Supported: text with {{ }}, {% %}, {# #}, whitespace control (- and +), raw; statements if /
// elif / else, for (unpacking, `if` filter, else, loop.index/index0/revindex/revindex0/first/last/
// length/previtem/nextitem/depth/cycle), break, continue, set (names, tuples, namespace attributes,
// block set with filters), macro with defaults, call blocks with caller(), filter blocks,
// generation; expressions with Python's literals, lists, tuples, dicts, attribute and item access,
// slices, negative indices, arithmetic, ~, comparisons, in / not in, and / or / not, conditional
// expressions, filters and `is` tests, and the str / list / dict methods templates call.
#ifndef LORADB_TEXT_JINJA_TEMPLATE_H_
#define LORADB_TEXT_JINJA_TEMPLATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/value.h"

namespace loradb::text::jinja {

// Bounds that keep a hostile template or input from hanging or exhausting memory. Exceeding one
// is ResourceExhausted naming it.
struct Limits {
  size_t max_template_bytes = 1 << 20;
  size_t max_output_bytes = 4 << 20;      // all text produced, captured blocks included
  int64_t max_loop_iterations = 1 << 20;  // summed over every loop of a render
  int64_t max_steps = 20'000'000;         // statements and expressions evaluated
  int max_call_depth = 64;                // nested macro calls
  int max_nesting = 128;                  // nesting of statements and expressions
};

struct Node;

class Template {
 public:
  // Parses `source`. InvalidArgument "line N: ..." for a syntax error or a construct the engine
  // does not implement; ResourceExhausted for a template over the size or nesting limit.
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<const Template>> Parse(
      absl::string_view source, Limits limits = {});

  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  // Renders with the variables `vars` (plus the globals). Thread-safe: a render shares nothing
  // mutable with another. Errors: InvalidArgument "line N: ..." for a runtime error (a type
  // error, an undefined value used as jinja2 refuses it, a sandbox-forbidden method, an unknown
  // filter or test reached in an if), InvalidArgument "... raise_exception: <message>" for the
  // template's own raise_exception, ResourceExhausted past a limit.
  [[nodiscard]] absl::StatusOr<std::string> Render(
      const std::vector<std::pair<std::string, Value>>& vars) const;

 private:
  Template();
  std::unique_ptr<Node> root_;
  Limits limits_;
  friend class Parser;
};

}  // namespace loradb::text::jinja

#endif  // LORADB_TEXT_JINJA_TEMPLATE_H_
