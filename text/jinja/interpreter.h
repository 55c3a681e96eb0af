// Evaluates a parsed template (text/jinja/ast.h) the way jinja2 does: scopes, loops, macros,
// filters, tests and the methods of str / list / dict that the sandbox allows. One Interpreter
// renders once; it is not shared between threads. Internal to text/jinja/.
#ifndef LORADB_TEXT_JINJA_INTERPRETER_H_
#define LORADB_TEXT_JINJA_INTERPRETER_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "text/jinja/ast.h"
#include "text/jinja/template.h"
#include "text/jinja/value.h"

namespace loradb::text::jinja {

// Whether the engine knows the filter / test `name` (the parser refuses the others).
bool IsFilter(const std::string& name);
bool IsTest(const std::string& name);
// Python's str.isspace() for one code point.
bool IsPyWhitespace(char32_t cp);

class Interpreter {
 public:
  explicit Interpreter(const Limits& limits);
  void SetGlobal(const std::string& name, Value value);
  [[nodiscard]] absl::StatusOr<std::string> Run(const Node& root);

  // A runtime error at `line`.
  absl::Status Error(int line, absl::string_view what) const;
  int line() const { return line_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  absl::StatusOr<Flow> Exec(const Node& n);
  absl::StatusOr<Flow> ExecBody(const Node& body);
  absl::StatusOr<Flow> ExecFor(const Node& n);
  absl::StatusOr<std::string> Capture(const Node& body);
  absl::Status Emit(absl::string_view text);

  absl::StatusOr<Value> Eval(const Node& n);
  absl::StatusOr<Value> EvalBinary(const Node& n);
  absl::StatusOr<Value> EvalCompare(const Node& n);
  absl::StatusOr<Value> EvalGetAttr(const Node& n);
  absl::StatusOr<Value> EvalCall(const Node& n);
  absl::StatusOr<Args> EvalArgs(const Node& n, size_t first);
  absl::StatusOr<Value> ApplyFilter(const Node& n, Value operand);
  absl::StatusOr<Value> ApplyFilterByName(const std::string& name, Value operand, Args& args);
  absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, Args& args);
  absl::StatusOr<Value> CallMethod(const Value& self, const std::string& name, Args& args);
  absl::StatusOr<Value> CallValue(const Value& fn, Args& args);
  Value MakeMacro(const Node& n);
  absl::Status Assign(const std::vector<std::string>& names, const Value& v);
  absl::Status Step();
  absl::Status CheckSize(size_t bytes) const;

  Value Lookup(const std::string& name) const;
  void Set(const std::string& name, Value v);

  const Limits& limits_;
  // frames_[0]: globals and render variables; [1]: the template's top level; then one frame per
  // loop iteration / macro call. Lookups search down to `barrier_`, then frames 1 and 0.
  std::vector<absl::flat_hash_map<std::string, Value>> frames_;
  size_t barrier_ = 1;
  std::string* out_ = nullptr;
  size_t produced_ = 0;
  int64_t iterations_ = 0;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int line_ = 0;

  friend absl::StatusOr<Value> MacroCall(Interpreter& in, const Node& macro, const Value& caller,
                                         Args& args);
};

}  // namespace loradb::text::jinja

#endif  // LORADB_TEXT_JINJA_INTERPRETER_H_
