#include "text/jinja/interpreter.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "storage/util/status_macros.h"
#include "text/utf8.h"

namespace loradb::text::jinja {
namespace {

constexpr absl::string_view kUnsafePrefix = "\x01unsafe:";

const char* const kFilters[] = {
    "abs",    "attr",   "capitalize", "count",      "d",        "default", "dictsort",
    "e",      "escape", "first",      "float",      "format",   "indent",  "int",
    "items",  "join",   "last",       "length",     "list",     "lower",   "map",
    "max",    "min",    "reject",     "rejectattr", "replace",  "reverse", "round",
    "safe",   "select", "selectattr", "sort",       "string",   "sum",     "title",
    "tojson", "trim",   "unique",     "upper",      "wordcount"};
const char* const kTests[] = {
    "defined", "undefined",   "none",    "boolean", "false",    "true",     "integer",
    "float",   "number",      "string",  "mapping", "iterable", "sequence", "callable",
    "sameas",  "eq",          "equalto", "ne",      "lt",       "lessthan", "le",
    "gt",      "greaterthan", "ge",      "in",      "odd",      "even",     "divisibleby",
    "lower",   "upper",       "escaped", "filter",  "test"};

std::vector<char32_t> CodePoints(const std::string& s) {
  std::vector<char32_t> out;
  size_t pos = 0;
  while (pos < s.size()) out.push_back(NextCodePoint(s, &pos));
  return out;
}
std::string FromCodePoints(const std::vector<char32_t>& cps, size_t from = 0,
                           size_t to = std::string::npos) {
  std::string out;
  to = std::min(to, cps.size());
  for (size_t i = from; i < to; ++i) AppendCodePoint(cps[i], &out);
  return out;
}
char32_t Upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<int32_t>(c)));
}
char32_t Lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<int32_t>(c)));
}
bool Cased(char32_t c) {
  const auto cat = utf8proc_category(static_cast<int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
std::string MapCase(const std::string& s, char32_t (*f)(char32_t)) {
  std::string out;
  size_t pos = 0;
  while (pos < s.size()) AppendCodePoint(f(NextCodePoint(s, &pos)), &out);
  return out;
}
// Python's str.title().
std::string PyTitle(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t c = NextCodePoint(s, &pos);
    AppendCodePoint(prev_cased ? Lower(c) : Upper(c), &out);
    prev_cased = Cased(c);
  }
  return out;
}
std::string PyCapitalize(const std::string& s) {
  std::vector<char32_t> cps = CodePoints(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? Upper(cps[i]) : Lower(cps[i]);
  return FromCodePoints(cps);
}
bool IsLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}
// Python's str.splitlines().
std::vector<std::string> SplitLines(const std::string& s) {
  std::vector<std::string> lines;
  std::string cur;
  size_t pos = 0;
  bool pending = false;
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t c = NextCodePoint(s, &pos);
    if (IsLineBreak(c)) {
      if (c == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
      lines.push_back(cur);
      cur.clear();
      pending = false;
    } else {
      cur.append(s, start, pos - start);
      pending = true;
    }
  }
  if (pending) lines.push_back(cur);
  return lines;
}
// Python's str.strip / lstrip / rstrip with `chars` (whitespace when null).
std::string PyStrip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::vector<char32_t> cps = CodePoints(s);
  std::vector<char32_t> set;
  if (chars != nullptr && chars->is_string()) set = CodePoints(chars->str());
  const bool ws = chars == nullptr || !chars->is_string();
  const auto strip = [&](char32_t c) {
    return ws ? IsPyWhitespace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return FromCodePoints(cps, b, e);
}
// Python's str.split / rsplit.
std::vector<std::string> PySplit(const std::string& s, const Value* sep, int64_t maxsplit,
                                 bool from_right) {
  std::vector<std::string> parts;
  if (sep == nullptr || sep->is_none()) {
    const std::vector<char32_t> cps = CodePoints(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPyWhitespace(cps[i])) ++i;
      if (i >= cps.size()) break;
      size_t j = i;
      while (j < cps.size() && !IsPyWhitespace(cps[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
      for (auto [b, e] : words) parts.push_back(FromCodePoints(cps, b, e));
      return parts;
    }
    if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k) {
        parts.push_back(FromCodePoints(cps, words[k].first, words[k].second));
      }
      size_t e = cps.size();
      while (e > words[maxsplit].first && IsPyWhitespace(cps[e - 1])) --e;
      parts.push_back(FromCodePoints(cps, words[maxsplit].first, e));
    } else {
      const size_t keep = words.size() - static_cast<size_t>(maxsplit);
      size_t b = 0;
      while (b < words[keep - 1].second && IsPyWhitespace(cps[b])) ++b;
      parts.push_back(FromCodePoints(cps, b, words[keep - 1].second));
      for (size_t k = keep; k < words.size(); ++k) {
        parts.push_back(FromCodePoints(cps, words[k].first, words[k].second));
      }
    }
    return parts;
  }
  const std::string& d = sep->str();
  if (!from_right) {
    size_t at = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      const size_t f = s.find(d, at);
      if (f == std::string::npos) break;
      parts.push_back(s.substr(at, f - at));
      at = f + d.size();
      ++n;
    }
    parts.push_back(s.substr(at));
    return parts;
  }
  size_t end = s.size();
  int64_t n = 0;
  std::vector<std::string> rev;
  while ((maxsplit < 0 || n < maxsplit) && end >= d.size()) {
    const size_t f = s.rfind(d, end - d.size());
    if (f == std::string::npos) break;
    rev.push_back(s.substr(f + d.size(), end - f - d.size()));
    end = f;
    ++n;
  }
  rev.push_back(s.substr(0, end));
  return std::vector<std::string>(rev.rbegin(), rev.rend());
}
std::string PyReplace(const std::string& s, const std::string& old, const std::string& repl,
                      int64_t count) {
  if (old.empty()) {
    // Python inserts `repl` between every character (and at both ends).
    std::string out;
    int64_t n = 0;
    size_t pos = 0;
    if (count != 0) {
      out += repl;
      ++n;
    }
    while (pos < s.size()) {
      const size_t start = pos;
      NextCodePoint(s, &pos);
      out.append(s, start, pos - start);
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
    }
    return out;
  }
  std::string out;
  size_t at = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(old, at);
    if (f == std::string::npos) break;
    out.append(s, at, f - at);
    out += repl;
    at = f + old.size();
    ++n;
  }
  out.append(s, at, std::string::npos);
  return out;
}
std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

const Value* Kw(const Args& args, const char* name) {
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}
// Argument `index` (positional) or `name` (keyword), or null.
const Value* Arg(const Args& args, size_t index, const char* name) {
  if (index < args.positional.size()) return &args.positional[index];
  return Kw(args, name);
}

}  // namespace

bool IsFilter(const std::string& name) {
  return std::find_if(std::begin(kFilters), std::end(kFilters),
                      [&](const char* f) { return name == f; }) != std::end(kFilters);
}
bool IsTest(const std::string& name) {
  return std::find_if(std::begin(kTests), std::end(kTests),
                      [&](const char* f) { return name == f; }) != std::end(kTests);
}
bool IsPyWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

Interpreter::Interpreter(const Limits& limits) : limits_(limits) {
  frames_.resize(2);
  auto& g = frames_[0];
  g["range"] = Value::Function("range", [](Interpreter& in, Args& a) -> absl::StatusOr<Value> {
    std::vector<int64_t> p;
    for (const Value& v : a.positional) {
      if (v.type() != Value::kInt && v.type() != Value::kBool) {
        return in.Error(in.line(),
                        absl::StrCat("range() takes integers, not '", v.TypeName(), "'"));
      }
      p.push_back(v.as_int());
    }
    if (p.empty() || p.size() > 3) return in.Error(in.line(), "range() takes 1 to 3 arguments");
    const int64_t start = p.size() == 1 ? 0 : p[0], stop = p.size() == 1 ? p[0] : p[1],
                  step = p.size() == 3 ? p[2] : 1;
    if (step == 0) return in.Error(in.line(), "range() arg 3 must not be zero");
    std::vector<Value> items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      LORADB_RETURN_IF_ERROR(in.CheckSize(items.size() * 8));
      if (static_cast<int64_t>(items.size()) >= in.limits_.max_loop_iterations) {
        return absl::ResourceExhaustedError(absl::StrCat("template line ", in.line(),
                                                         ": range() longer than the loop limit of ",
                                                         in.limits_.max_loop_iterations));
      }
      items.push_back(Value::Int(i));
    }
    return Value::MakeList(std::move(items));
  });
  g["dict"] = Value::Function("dict", [](Interpreter& in, Args& a) -> absl::StatusOr<Value> {
    Value d = Value::MakeDict();
    if (!a.positional.empty()) {
      if (a.positional.size() > 1 || !a.positional[0].is_dict()) {
        return in.Error(in.line(), "dict() takes a mapping and keyword arguments");
      }
      d.mutable_dict().entries = a.positional[0].dict().entries;
    }
    for (auto& [k, v] : a.keyword) d.mutable_dict().Set(k, v);
    return d;
  });
  g["namespace"] =
      Value::Function("namespace", [](Interpreter& in, Args& a) -> absl::StatusOr<Value> {
        Value ns = Value::MakeNamespace();
        for (const Value& p : a.positional) {
          if (!p.is_dict()) return in.Error(in.line(), "namespace() takes a mapping");
          for (const auto& [k, v] : p.dict().entries) ns.mutable_dict().Set(k, v);
        }
        for (auto& [k, v] : a.keyword) {
          if (!k.empty() && k[0] == '_') {
            return in.Error(
                in.line(), absl::StrCat("namespace attribute '", k, "' starts with an underscore"));
          }
          ns.mutable_dict().Set(k, v);
        }
        return ns;
      });
  g["raise_exception"] =
      Value::Function("raise_exception", [](Interpreter& in, Args& a) -> absl::StatusOr<Value> {
        const std::string message = a.positional.empty() ? "" : Str(a.positional[0]);
        return absl::InvalidArgumentError(
            absl::StrCat("chat template line ", in.line(), ": raise_exception: ", message));
      });
  g["strftime_now"] =
      Value::Function("strftime_now", [](Interpreter& in, Args& a) -> absl::StatusOr<Value> {
        if (a.positional.size() != 1 || !a.positional[0].is_string()) {
          return in.Error(in.line(), "strftime_now() takes one format string");
        }
        const std::time_t now = std::time(nullptr);
        std::tm tm;
        localtime_r(&now, &tm);
        char buf[512];
        const size_t n = std::strftime(buf, sizeof(buf), a.positional[0].str().c_str(), &tm);
        return Value::String(std::string(buf, n));
      });
}

void Interpreter::SetGlobal(const std::string& name, Value value) {
  frames_[0][name] = std::move(value);
}

absl::Status Interpreter::Error(int line, absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat("template line ", line, ": ", what));
}

absl::Status Interpreter::Step() {
  if (++steps_ > limits_.max_steps) {
    return absl::ResourceExhaustedError(absl::StrCat("template line ", line_, ": more than ",
                                                     limits_.max_steps, " evaluation steps"));
  }
  return absl::OkStatus();
}

absl::Status Interpreter::CheckSize(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("template line ", line_, ": a value of ",
                                                     bytes, " bytes is over the output limit of ",
                                                     limits_.max_output_bytes));
  }
  return absl::OkStatus();
}

absl::Status Interpreter::Emit(absl::string_view text) {
  produced_ += text.size();
  if (produced_ > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("template line ", line_,
                                                     ": output over the limit of ",
                                                     limits_.max_output_bytes, " bytes"));
  }
  out_->append(text.data(), text.size());
  return absl::OkStatus();
}

Value Interpreter::Lookup(const std::string& name) const {
  for (size_t i = frames_.size(); i-- > barrier_;) {
    if (auto it = frames_[i].find(name); it != frames_[i].end()) return it->second;
  }
  for (size_t i : {size_t{1}, size_t{0}}) {
    if (i >= barrier_ && i != 0) continue;
    if (auto it = frames_[i].find(name); it != frames_[i].end()) return it->second;
  }
  return Value::Undefined(name);
}

void Interpreter::Set(const std::string& name, Value v) { frames_.back()[name] = std::move(v); }

absl::StatusOr<std::string> Interpreter::Run(const Node& root) {
  std::string out;
  out_ = &out;
  LORADB_ASSIGN_OR_RETURN(Flow flow, ExecBody(root));
  (void)flow;
  return out;
}

absl::StatusOr<std::string> Interpreter::Capture(const Node& body) {
  std::string buffer;
  std::string* saved = out_;
  out_ = &buffer;
  absl::StatusOr<Flow> flow = ExecBody(body);
  out_ = saved;
  if (!flow.ok()) return flow.status();
  return buffer;
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecBody(const Node& body) {
  for (const auto& kid : body.kids) {
    LORADB_ASSIGN_OR_RETURN(Flow flow, Exec(*kid));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

absl::Status Interpreter::Assign(const std::vector<std::string>& names, const Value& v) {
  if (names.size() == 1) {
    Set(names[0], v);
    return absl::OkStatus();
  }
  if (!v.is_list()) {
    if (v.is_string()) {
      const std::vector<char32_t> cps = CodePoints(v.str());
      if (cps.size() == names.size()) {
        for (size_t i = 0; i < names.size(); ++i)
          Set(names[i], Value::String(FromCodePoints(cps, i, i + 1)));
        return absl::OkStatus();
      }
    }
    return Error(
        line_, absl::StrCat("cannot unpack a '", v.TypeName(), "' into ", names.size(), " names"));
  }
  if (v.items().size() != names.size()) {
    return Error(line_, absl::StrCat("cannot unpack ", v.items().size(), " values into ",
                                     names.size(), " names"));
  }
  for (size_t i = 0; i < names.size(); ++i) Set(names[i], v.items()[i]);
  return absl::OkStatus();
}

namespace {

// The items a for loop (or a filter) iterates over: list and tuple items, dict keys, string
// characters; Undefined iterates as empty.
absl::StatusOr<std::vector<Value>> Iterate(Interpreter& in, const Value& v) {
  switch (v.type()) {
    case Value::kList:
      return v.items();
    case Value::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, item] : v.dict().entries) keys.push_back(v.dict().KeyValue(k));
      return keys;
    }
    case Value::kString: {
      std::vector<Value> chars;
      size_t pos = 0;
      while (pos < v.str().size()) {
        const size_t start = pos;
        NextCodePoint(v.str(), &pos);
        chars.push_back(Value::String(v.str().substr(start, pos - start)));
      }
      return chars;
    }
    case Value::kUndefined:
      return std::vector<Value>();
    default:
      return in.Error(in.line(), absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

}  // namespace

absl::StatusOr<Interpreter::Flow> Interpreter::ExecFor(const Node& n) {
  LORADB_ASSIGN_OR_RETURN(Value seq, Eval(*n.kids[0]));
  LORADB_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*this, seq));
  const Node* filter = n.kids[2].get();
  if (filter != nullptr) {
    std::vector<Value> kept;
    for (Value& item : items) {
      frames_.emplace_back();
      absl::Status s = Assign(n.names, item);
      absl::StatusOr<Value> cond = s.ok() ? Eval(*filter) : absl::StatusOr<Value>(s);
      frames_.pop_back();
      if (!cond.ok()) return cond.status();
      if (cond->Truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const int64_t length = static_cast<int64_t>(items.size());
  // One loop object for the whole loop, advanced in place as jinja2's LoopContext is; one frame,
  // emptied before each iteration (each iteration starts from a fresh scope).
  Value loop = Value::MakeDict();
  auto index = std::make_shared<int64_t>(0);
  {
    Dict& d = loop.mutable_dict();
    for (const char* key : {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                            "depth", "depth0", "previtem", "nextitem"}) {
      d.entries.emplace_back(key, Value());
    }
    d.entries.emplace_back(
        "cycle",
        Value::Function("cycle", [index](Interpreter& in, Args& a) -> absl::StatusOr<Value> {
          if (a.positional.empty()) return in.Error(in.line(), "loop.cycle() needs arguments");
          return a.positional[static_cast<size_t>(*index) % a.positional.size()];
        }));
  }
  frames_.emplace_back();
  const size_t frame = frames_.size() - 1;
  absl::StatusOr<Flow> flow = Flow::kNormal;
  for (int64_t i = 0; i < length; ++i) {
    if (++iterations_ > limits_.max_loop_iterations) {
      flow = absl::ResourceExhaustedError(absl::StrCat("template line ", n.line, ": more than ",
                                                       limits_.max_loop_iterations,
                                                       " loop iterations"));
      break;
    }
    *index = i;
    auto& e = loop.mutable_dict().entries;
    e[0].second = Value::Int(i + 1);
    e[1].second = Value::Int(i);
    e[2].second = Value::Int(length - i);
    e[3].second = Value::Int(length - i - 1);
    e[4].second = Value::Bool(i == 0);
    e[5].second = Value::Bool(i == length - 1);
    e[6].second = Value::Int(length);
    e[7].second = Value::Int(1);
    e[8].second = Value::Int(0);
    e[9].second = i > 0 ? items[i - 1] : Value::Undefined("previtem");
    e[10].second = i + 1 < length ? items[i + 1] : Value::Undefined("nextitem");
    frames_[frame].clear();
    frames_[frame]["loop"] = loop;
    absl::Status assigned = Assign(n.names, items[i]);
    flow = assigned.ok() ? ExecBody(*n.kids[1]) : absl::StatusOr<Flow>(assigned);
    if (!flow.ok() || *flow == Flow::kBreak) break;
  }
  frames_.pop_back();
  if (!flow.ok()) return flow.status();
  if (length == 0 && n.flag) return ExecBody(*n.kids[3]);
  return Flow::kNormal;
}

absl::StatusOr<Interpreter::Flow> Interpreter::Exec(const Node& n) {
  line_ = n.line;
  LORADB_RETURN_IF_ERROR(Step());
  switch (n.kind) {
    case N::kText:
      LORADB_RETURN_IF_ERROR(Emit(n.name));
      return Flow::kNormal;
    case N::kPrint: {
      LORADB_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
      if (v.is_undefined() && absl::StartsWith(v.str(), kUnsafePrefix)) {
        return Error(n.line, v.str().substr(kUnsafePrefix.size()));
      }
      std::string text;
      AppendStr(v, &text);
      LORADB_RETURN_IF_ERROR(Emit(text));
      return Flow::kNormal;
    }
    case N::kBody:
      return ExecBody(n);
    case N::kIf: {
      size_t i = 0;
      for (; i + 1 < n.kids.size(); i += 2) {
        LORADB_ASSIGN_OR_RETURN(Value cond, Eval(*n.kids[i]));
        if (cond.Truthy()) return ExecBody(*n.kids[i + 1]);
      }
      if (i < n.kids.size()) return ExecBody(*n.kids[i]);
      return Flow::kNormal;
    }
    case N::kFor:
      return ExecFor(n);
    case N::kBreak:
      return Flow::kBreak;
    case N::kContinue:
      return Flow::kContinue;
    case N::kSet: {
      LORADB_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
      LORADB_RETURN_IF_ERROR(Assign(n.names, v));
      return Flow::kNormal;
    }
    case N::kSetAttr: {
      Value target = Lookup(n.name);
      if (!target.is_namespace()) {
        return Error(
            n.line, absl::StrCat("cannot assign attribute on non-namespace object '", n.name, "'"));
      }
      if (!n.names[0].empty() && n.names[0][0] == '_') {
        return Error(n.line, "namespace attributes cannot start with an underscore");
      }
      LORADB_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
      target.mutable_dict().Set(n.names[0], std::move(v));
      return Flow::kNormal;
    }
    case N::kSetBlock: {
      LORADB_ASSIGN_OR_RETURN(std::string text, Capture(*n.kids[0]));
      Value v = Value::String(std::move(text));
      for (size_t i = 1; i < n.kids.size(); ++i) {
        LORADB_ASSIGN_OR_RETURN(v, ApplyFilter(*n.kids[i], std::move(v)));
      }
      Set(n.name, std::move(v));
      return Flow::kNormal;
    }
    case N::kFilterBlock: {
      LORADB_ASSIGN_OR_RETURN(std::string text, Capture(*n.kids[0]));
      Value v = Value::String(std::move(text));
      for (size_t i = 1; i < n.kids.size(); ++i) {
        LORADB_ASSIGN_OR_RETURN(v, ApplyFilter(*n.kids[i], std::move(v)));
      }
      LORADB_RETURN_IF_ERROR(Emit(Str(v)));
      return Flow::kNormal;
    }
    case N::kMacro:
      Set(n.name, MakeMacro(n));
      return Flow::kNormal;
    case N::kCallBlock: {
      const Node& call = *n.kids[1];
      LORADB_ASSIGN_OR_RETURN(Value callee, Eval(*call.kids[0]));
      LORADB_ASSIGN_OR_RETURN(Args args, EvalArgs(call, 1));
      args.keyword.emplace_back("caller", MakeMacro(*n.kids[0]));
      LORADB_ASSIGN_OR_RETURN(Value result, CallValue(callee, args));
      LORADB_RETURN_IF_ERROR(Emit(Str(result)));
      return Flow::kNormal;
    }
    default: {
      LORADB_ASSIGN_OR_RETURN(Value v, Eval(n));
      (void)v;
      return Flow::kNormal;
    }
  }
}

absl::StatusOr<Value> MacroCall(Interpreter& in, const Node& macro, const Value& caller,
                                Args& args) {
  if (in.call_depth_ >= in.limits_.max_call_depth) {
    return absl::ResourceExhaustedError(absl::StrCat("template line ", in.line_,
                                                     ": macro calls nested deeper than ",
                                                     in.limits_.max_call_depth));
  }
  const size_t params = macro.names.size();
  if (args.positional.size() > params) {
    return in.Error(in.line_, absl::StrCat("macro '", macro.name, "' takes not more than ", params,
                                           " arguments"));
  }
  absl::flat_hash_map<std::string, Value> frame;
  for (size_t i = 0; i < params; ++i) {
    const Value* given = i < args.positional.size() ? &args.positional[i] : nullptr;
    if (given == nullptr) given = Kw(args, macro.names[i].c_str());
    if (given != nullptr) {
      frame[macro.names[i]] = *given;
    } else if (macro.kids[i + 1] != nullptr) {
      LORADB_ASSIGN_OR_RETURN(frame[macro.names[i]], in.Eval(*macro.kids[i + 1]));
    } else {
      frame[macro.names[i]] = Value::Undefined(macro.names[i]);
    }
  }
  for (const auto& [k, v] : args.keyword) {
    if (k == "caller") {
      frame["caller"] = v;
      continue;
    }
    if (std::find(macro.names.begin(), macro.names.end(), k) == macro.names.end()) {
      return in.Error(in.line_,
                      absl::StrCat("macro '", macro.name, "' takes no keyword argument '", k, "'"));
    }
  }
  if (!caller.is_undefined()) frame["caller"] = caller;
  const size_t saved_barrier = in.barrier_;
  in.frames_.push_back(std::move(frame));
  in.barrier_ = in.frames_.size() - 1;
  ++in.call_depth_;
  const int saved_line = in.line_;
  absl::StatusOr<std::string> text = in.Capture(*macro.kids[0]);
  --in.call_depth_;
  in.line_ = saved_line;
  in.frames_.pop_back();
  in.barrier_ = saved_barrier;
  if (!text.ok()) return text.status();
  return Value::String(*std::move(text));
}

Value Interpreter::MakeMacro(const Node& n) {
  const Node* macro = &n;
  return Value::Function(n.name, [macro](Interpreter& in, Args& a) -> absl::StatusOr<Value> {
    return MacroCall(in, *macro, Value(), a);
  });
}

absl::StatusOr<Args> Interpreter::EvalArgs(const Node& n, size_t first) {
  Args args;
  const size_t count = n.kids.size() - first;
  for (size_t i = 0; i < count; ++i) {
    LORADB_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[first + i]));
    if (i < n.positional) {
      args.positional.push_back(std::move(v));
    } else {
      args.keyword.emplace_back(n.names[i - n.positional], std::move(v));
    }
  }
  return args;
}

absl::StatusOr<Value> Interpreter::CallValue(const Value& fn, Args& args) {
  if (fn.is_callable()) return fn.callable().fn(*this, args);
  if (fn.is_undefined()) {
    if (absl::StartsWith(fn.str(), kUnsafePrefix)) {
      return Error(line_, fn.str().substr(kUnsafePrefix.size()));
    }
    return Error(line_, absl::StrCat("'", fn.str(), "' is undefined"));
  }
  return Error(line_, absl::StrCat("'", fn.TypeName(), "' object is not callable"));
}

namespace {

bool IsStrMethod(const std::string& n) {
  static const char* const kNames[] = {
      "strip",   "lstrip",  "rstrip",  "startswith", "endswith",   "split",   "rsplit",
      "replace", "upper",   "lower",   "title",      "capitalize", "format",  "find",
      "rfind",   "count",   "join",    "splitlines", "isdigit",    "isalpha", "isalnum",
      "isspace", "isupper", "islower", "index"};
  return std::find_if(std::begin(kNames), std::end(kNames),
                      [&](const char* k) { return n == k; }) != std::end(kNames);
}
bool IsDictMethod(const std::string& n) {
  return n == "items" || n == "keys" || n == "values" || n == "get";
}
bool IsListMethod(const std::string& n) { return n == "count" || n == "index"; }
bool IsMutator(const std::string& n) {
  static const char* const kNames[] = {"append",  "extend", "insert",  "pop",    "remove",
                                       "clear",   "sort",   "reverse", "update", "setdefault",
                                       "popitem", "add",    "discard"};
  return std::find_if(std::begin(kNames), std::end(kNames),
                      [&](const char* k) { return n == k; }) != std::end(kNames);
}

}  // namespace

absl::StatusOr<Value> Interpreter::EvalGetAttr(const Node& n) {
  LORADB_ASSIGN_OR_RETURN(Value obj, Eval(*n.kids[0]));
  const std::string& attr = n.name;
  if (obj.is_undefined()) {
    return Error(n.line, absl::StrCat("'", obj.str(), "' is undefined"));
  }
  if (obj.is_dict()) {
    if (!obj.is_namespace() && IsDictMethod(attr)) {
      Value self = obj;
      return Value::Function(
          attr, [self, attr](Interpreter& in, Args& a) { return in.CallMethod(self, attr, a); });
    }
    if (const Value* v = obj.dict().Find(attr)) return *v;
    if (!obj.is_namespace() && IsMutator(attr)) {
      return Value::Undefined(absl::StrCat(kUnsafePrefix, "access to attribute '", attr,
                                           "' of 'dict' object is unsafe."));
    }
    return Value::Undefined(attr);
  }
  if ((obj.is_string() && IsStrMethod(attr)) || (obj.is_list() && IsListMethod(attr))) {
    Value self = obj;
    return Value::Function(
        attr, [self, attr](Interpreter& in, Args& a) { return in.CallMethod(self, attr, a); });
  }
  if (obj.is_list() && IsMutator(attr)) {
    return Value::Undefined(absl::StrCat(kUnsafePrefix, "access to attribute '", attr, "' of '",
                                         obj.TypeName(), "' object is unsafe."));
  }
  return Value::Undefined(attr);
}

namespace {

// Python's index normalization: negative counts from the end; nullopt when out of range.
std::optional<size_t> Index(int64_t i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  if (i < 0 || static_cast<size_t>(i) >= size) return std::nullopt;
  return static_cast<size_t>(i);
}

absl::StatusOr<Value> GetItem(Interpreter& in, const Value& obj, const Value& key) {
  if (obj.is_undefined())
    return in.Error(in.line(), absl::StrCat("'", obj.str(), "' is undefined"));
  if (obj.is_dict()) {
    if (const std::optional<std::string> k = DictKey(key); k.has_value()) {
      if (const Value* v = obj.dict().Find(*k)) return *v;
    }
    return Value::Undefined(key.is_string() ? key.str() : Str(key));
  }
  if (obj.is_generator()) return Value::Undefined(Str(key));
  if (obj.is_list() || obj.is_string()) {
    if (key.type() != Value::kInt && key.type() != Value::kBool) {
      if (obj.is_string() && key.is_string()) return Value::Undefined(key.str());
      return Value::Undefined(Str(key));
    }
    if (obj.is_list()) {
      auto i = Index(key.as_int(), obj.items().size());
      if (!i.has_value()) return Value::Undefined(Str(key));
      return obj.items()[*i];
    }
    const std::vector<char32_t> cps = CodePoints(obj.str());
    auto i = Index(key.as_int(), cps.size());
    if (!i.has_value()) return Value::Undefined(Str(key));
    return Value::String(FromCodePoints(cps, *i, *i + 1));
  }
  return Value::Undefined(Str(key));
}

// Python's slice indices over `size` elements.
std::vector<size_t> SliceIndices(const Value* a, const Value* b, const Value* c, size_t size) {
  const int64_t n = static_cast<int64_t>(size);
  const int64_t step = c != nullptr && !c->is_none() ? c->as_int() : 1;
  const auto norm = [&](const Value* v, int64_t dflt, bool is_start) -> int64_t {
    if (v == nullptr || v->is_none()) return dflt;
    int64_t x = v->as_int();
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    (void)is_start;
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  std::vector<size_t> out;
  if (step > 0) {
    const int64_t start = norm(a, 0, true), stop = norm(b, n, false);
    for (int64_t i = start; i < stop; i += step) out.push_back(static_cast<size_t>(i));
  } else {
    const int64_t start = norm(a, n - 1, true), stop = norm(b, -1, false);
    for (int64_t i = start; i > stop; i += step) out.push_back(static_cast<size_t>(i));
  }
  return out;
}

// Python's comparison for sorting and < / > (numbers, strings, sequences).
absl::StatusOr<int> Compare(Interpreter& in, const Value& a, const Value& b, const char* op) {
  if (a.is_number() && b.is_number()) {
    const double x = a.Number(), y = b.Number();
    if (a.type() != Value::kFloat && b.type() != Value::kFloat) {
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    }
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str() ? -1 : a.str() > b.str() ? 1 : 0;
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    for (size_t i = 0; i < a.items().size() && i < b.items().size(); ++i) {
      if (Equal(a.items()[i], b.items()[i])) continue;
      return Compare(in, a.items()[i], b.items()[i], op);
    }
    return a.items().size() < b.items().size() ? -1 : a.items().size() > b.items().size() ? 1 : 0;
  }
  return in.Error(in.line(), absl::StrCat("'", op, "' not supported between instances of '",
                                          a.TypeName(), "' and '", b.TypeName(), "'"));
}

absl::StatusOr<bool> Contains(Interpreter& in, const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::kString:
      if (!item.is_string()) {
        return in.Error(in.line(), absl::StrCat("'in <string>' requires string as left operand, "
                                                "not ",
                                                item.TypeName()));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::kList:
      for (const Value& v : container.items()) {
        if (Equal(v, item)) return true;
      }
      return false;
    case Value::kDict: {
      const std::optional<std::string> k = DictKey(item);
      return k.has_value() && container.dict().Find(*k) != nullptr;
    }
    case Value::kUndefined:
      return false;
    default:
      return in.Error(
          in.line(), absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
  }
}

bool AddOverflows(int64_t a, int64_t b, int64_t* r) { return __builtin_add_overflow(a, b, r); }
bool SubOverflows(int64_t a, int64_t b, int64_t* r) { return __builtin_sub_overflow(a, b, r); }
bool MulOverflows(int64_t a, int64_t b, int64_t* r) { return __builtin_mul_overflow(a, b, r); }

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t PyMod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// Python's "%" string formatting for %s %r %d %i %f (%.Nf) %%.
absl::StatusOr<std::string> PercentFormat(Interpreter& in, const std::string& fmt,
                                          const Value& args) {
  std::vector<Value> values;
  if (args.is_tuple()) {
    values = args.items();
  } else {
    values.push_back(args);
  }
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) return in.Error(in.line(), "incomplete format");
    if (fmt[i] == '%') {
      out.push_back('%');
      continue;
    }
    int precision = -1;
    if (fmt[i] == '.') {
      precision = 0;
      while (++i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9')
        precision = precision * 10 + (fmt[i] - '0');
      if (i >= fmt.size()) return in.Error(in.line(), "incomplete format");
    }
    if (next >= values.size()) return in.Error(in.line(), "not enough arguments for format string");
    const Value& v = values[next++];
    switch (fmt[i]) {
      case 's':
        AppendStr(v, &out);
        break;
      case 'r':
        AppendRepr(v, &out);
        break;
      case 'd':
      case 'i':
        if (!v.is_number()) return in.Error(in.line(), "%d format: a number is required");
        absl::StrAppend(
            &out, v.type() == Value::kFloat ? static_cast<int64_t>(v.as_float()) : v.as_int());
        break;
      case 'f':
        if (!v.is_number()) return in.Error(in.line(), "%f format: a number is required");
        absl::StrAppend(&out, absl::StrFormat("%.*f", precision < 0 ? 6 : precision, v.Number()));
        break;
      default:
        return in.Error(
            in.line(), absl::StrCat("unsupported format character '", std::string(1, fmt[i]), "'"));
    }
  }
  if (next < values.size()) {
    return in.Error(in.line(), "not all arguments converted during string formatting");
  }
  return out;
}

}  // namespace

absl::StatusOr<Value> Interpreter::EvalBinary(const Node& n) {
  LORADB_ASSIGN_OR_RETURN(Value a, Eval(*n.kids[0]));
  LORADB_ASSIGN_OR_RETURN(Value b, Eval(*n.kids[1]));
  const std::string& op = n.name;
  const auto type_error = [&]() {
    return Error(n.line, absl::StrCat("unsupported operand type(s) for ", op, ": '",
                                      a.is_undefined() ? "Undefined" : a.TypeName(), "' and '",
                                      b.is_undefined() ? "Undefined" : b.TypeName(), "'",
                                      a.is_undefined() && !a.str().empty()
                                          ? absl::StrCat(" ('", a.str(), "' is undefined)")
                                      : b.is_undefined() && !b.str().empty()
                                          ? absl::StrCat(" ('", b.str(), "' is undefined)")
                                          : ""));
  };
  const bool ints = (a.type() == Value::kInt || a.type() == Value::kBool) &&
                    (b.type() == Value::kInt || b.type() == Value::kBool);
  const bool nums = a.is_number() && b.is_number();
  int64_t r = 0;
  if (op == "+") {
    if (ints) {
      if (AddOverflows(a.as_int(), b.as_int(), &r)) return Error(n.line, "integer overflow");
      return Value::Int(r);
    }
    if (nums) return Value::Float(a.Number() + b.Number());
    if (a.is_string() && b.is_string()) {
      LORADB_RETURN_IF_ERROR(CheckSize(a.str().size() + b.str().size()));
      if (a.is_markup() || b.is_markup()) {
        // markupsafe: the plain operand is HTML-escaped and the sum is Markup.
        return Value::Markup((a.is_markup() ? a.str() : HtmlEscape(a.str())) +
                             (b.is_markup() ? b.str() : HtmlEscape(b.str())));
      }
      return Value::String(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::MakeList(std::move(items), a.is_tuple());
    }
    return type_error();
  }
  if (op == "-") {
    if (ints) {
      if (SubOverflows(a.as_int(), b.as_int(), &r)) return Error(n.line, "integer overflow");
      return Value::Int(r);
    }
    if (nums) return Value::Float(a.Number() - b.Number());
    return type_error();
  }
  if (op == "*") {
    if (ints) {
      if (MulOverflows(a.as_int(), b.as_int(), &r)) return Error(n.line, "integer overflow");
      return Value::Int(r);
    }
    if (nums) return Value::Float(a.Number() * b.Number());
    const Value* seq = a.is_string() || a.is_list() ? &a : &b;
    const Value* count = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_list()) &&
        (count->type() == Value::kInt || count->type() == Value::kBool)) {
      const int64_t times = std::max<int64_t>(0, count->as_int());
      const size_t unit = seq->is_string() ? seq->str().size() : seq->items().size() * 16;
      if (times > 0 && unit > 0) {
        LORADB_RETURN_IF_ERROR(CheckSize(unit > limits_.max_output_bytes / times
                                             ? limits_.max_output_bytes + 1
                                             : unit * static_cast<size_t>(times)));
      }
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < times; ++i) out += seq->str();
        return seq->is_markup() ? Value::Markup(std::move(out)) : Value::String(std::move(out));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < times; ++i)
        items.insert(items.end(), seq->items().begin(), seq->items().end());
      return Value::MakeList(std::move(items), seq->is_tuple());
    }
    return type_error();
  }
  if (op == "/") {
    if (!nums) return type_error();
    if (b.Number() == 0) return Error(n.line, "division by zero");
    return Value::Float(a.Number() / b.Number());
  }
  if (op == "//") {
    if (!nums) return type_error();
    if (b.Number() == 0) return Error(n.line, "integer division or modulo by zero");
    if (ints) return Value::Int(FloorDiv(a.as_int(), b.as_int()));
    return Value::Float(std::floor(a.Number() / b.Number()));
  }
  if (op == "%") {
    if (a.is_string()) {
      LORADB_ASSIGN_OR_RETURN(std::string s, PercentFormat(*this, a.str(), b));
      return Value::String(std::move(s));
    }
    if (!nums) return type_error();
    if (b.Number() == 0) return Error(n.line, "integer division or modulo by zero");
    if (ints) return Value::Int(PyMod(a.as_int(), b.as_int()));
    double m = std::fmod(a.Number(), b.Number());
    if (m != 0 && ((m < 0) != (b.Number() < 0))) m += b.Number();
    return Value::Float(m);
  }
  if (op == "**") {
    if (!nums) return type_error();
    if (ints && b.as_int() >= 0) {
      int64_t result = 1;
      for (int64_t i = 0; i < b.as_int(); ++i) {
        if (MulOverflows(result, a.as_int(), &result)) return Error(n.line, "integer overflow");
        if (result == 0 || result == 1) break;
      }
      return Value::Int(result);
    }
    return Value::Float(std::pow(a.Number(), b.Number()));
  }
  return Error(n.line, absl::StrCat("unknown operator ", op));
}

absl::StatusOr<Value> Interpreter::EvalCompare(const Node& n) {
  LORADB_ASSIGN_OR_RETURN(Value left, Eval(*n.kids[0]));
  for (size_t i = 0; i < n.names.size(); ++i) {
    LORADB_ASSIGN_OR_RETURN(Value right, Eval(*n.kids[i + 1]));
    const std::string& op = n.names[i];
    bool ok;
    if (op == "==") {
      ok = Equal(left, right);
    } else if (op == "!=") {
      ok = !Equal(left, right);
    } else if (op == "in" || op == "notin") {
      LORADB_ASSIGN_OR_RETURN(bool in, Contains(*this, right, left));
      ok = op == "in" ? in : !in;
    } else {
      LORADB_ASSIGN_OR_RETURN(int c, Compare(*this, left, right, op.c_str()));
      ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!ok) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

absl::StatusOr<Value> Interpreter::EvalCall(const Node& n) {
  LORADB_ASSIGN_OR_RETURN(Value callee, Eval(*n.kids[0]));
  LORADB_ASSIGN_OR_RETURN(Args args, EvalArgs(n, 1));
  line_ = n.line;
  return CallValue(callee, args);
}

absl::StatusOr<Value> Interpreter::Eval(const Node& n) {
  LORADB_RETURN_IF_ERROR(Step());
  switch (n.kind) {
    case N::kLiteral:
      return n.literal;
    case N::kName:
      return Lookup(n.name);
    case N::kList:
    case N::kTuple: {
      std::vector<Value> items;
      for (const auto& k : n.kids) {
        LORADB_ASSIGN_OR_RETURN(Value v, Eval(*k));
        items.push_back(std::move(v));
      }
      return Value::MakeList(std::move(items), n.kind == N::kTuple);
    }
    case N::kDict: {
      Value d = Value::MakeDict();
      for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
        LORADB_ASSIGN_OR_RETURN(Value k, Eval(*n.kids[i]));
        LORADB_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[i + 1]));
        const std::optional<std::string> key = DictKey(k);
        if (!key.has_value())
          return Error(n.line, absl::StrCat("unhashable type: '", k.TypeName(), "'"));
        if (!k.is_string()) d.mutable_dict().key_values.emplace_back(*key, k);
        d.mutable_dict().Set(*key, std::move(v));
      }
      return d;
    }
    case N::kGetAttr:
      return EvalGetAttr(n);
    case N::kGetItem: {
      LORADB_ASSIGN_OR_RETURN(Value obj, Eval(*n.kids[0]));
      LORADB_ASSIGN_OR_RETURN(Value key, Eval(*n.kids[1]));
      line_ = n.line;
      return GetItem(*this, obj, key);
    }
    case N::kSlice: {
      LORADB_ASSIGN_OR_RETURN(Value obj, Eval(*n.kids[0]));
      Value parts[3];
      for (int i = 0; i < 3; ++i) {
        if (n.kids[i + 1] != nullptr) {
          LORADB_ASSIGN_OR_RETURN(parts[i], Eval(*n.kids[i + 1]));
          if (!parts[i].is_none() && parts[i].type() != Value::kInt &&
              parts[i].type() != Value::kBool) {
            return Error(n.line, "slice indices must be integers or None");
          }
        } else {
          parts[i] = Value::None();
        }
      }
      if (parts[2].type() == Value::kInt && parts[2].as_int() == 0) {
        return Error(n.line, "slice step cannot be zero");
      }
      if (obj.is_undefined()) return Error(n.line, absl::StrCat("'", obj.str(), "' is undefined"));
      if (obj.is_list() && !obj.is_generator()) {
        std::vector<Value> items;
        for (size_t i : SliceIndices(&parts[0], &parts[1], &parts[2], obj.items().size())) {
          items.push_back(obj.items()[i]);
        }
        return Value::MakeList(std::move(items), obj.is_tuple());
      }
      if (obj.is_string()) {
        const std::vector<char32_t> cps = CodePoints(obj.str());
        std::string out;
        for (size_t i : SliceIndices(&parts[0], &parts[1], &parts[2], cps.size())) {
          AppendCodePoint(cps[i], &out);
        }
        return Value::String(std::move(out));
      }
      return Error(n.line, absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
    }
    case N::kCall:
      return EvalCall(n);
    case N::kFilter: {
      LORADB_ASSIGN_OR_RETURN(Value operand, Eval(*n.kids[0]));
      return ApplyFilter(n, std::move(operand));
    }
    case N::kTest: {
      LORADB_ASSIGN_OR_RETURN(Value operand, Eval(*n.kids[0]));
      LORADB_ASSIGN_OR_RETURN(Args args, EvalArgs(n, 1));
      line_ = n.line;
      LORADB_ASSIGN_OR_RETURN(bool r, ApplyTest(n.name, operand, args));
      return Value::Bool(r != n.flag);
    }
    case N::kNeg:
    case N::kPos: {
      LORADB_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
      if (!v.is_number()) {
        return Error(n.line, absl::StrCat("bad operand type for unary ",
                                          n.kind == N::kNeg ? "-" : "+", ": '", v.TypeName(), "'"));
      }
      if (n.kind == N::kPos) return v.type() == Value::kBool ? Value::Int(v.as_int()) : v;
      if (v.type() == Value::kFloat) return Value::Float(-v.as_float());
      if (v.as_int() == INT64_MIN) return Error(n.line, "integer overflow");
      return Value::Int(-v.as_int());
    }
    case N::kNot: {
      LORADB_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
      return Value::Bool(!v.Truthy());
    }
    case N::kAnd: {
      LORADB_ASSIGN_OR_RETURN(Value a, Eval(*n.kids[0]));
      if (!a.Truthy()) return a;
      return Eval(*n.kids[1]);
    }
    case N::kOr: {
      LORADB_ASSIGN_OR_RETURN(Value a, Eval(*n.kids[0]));
      if (a.Truthy()) return a;
      return Eval(*n.kids[1]);
    }
    case N::kBinary:
      return EvalBinary(n);
    case N::kCompare:
      return EvalCompare(n);
    case N::kCond: {
      LORADB_ASSIGN_OR_RETURN(Value cond, Eval(*n.kids[0]));
      if (cond.Truthy()) return Eval(*n.kids[1]);
      if (n.kids[2] == nullptr) return Value::Undefined("");
      return Eval(*n.kids[2]);
    }
    case N::kConcat: {
      std::string out;
      for (const auto& k : n.kids) {
        LORADB_ASSIGN_OR_RETURN(Value v, Eval(*k));
        AppendStr(v, &out);
        LORADB_RETURN_IF_ERROR(CheckSize(out.size()));
      }
      return Value::String(std::move(out));
    }
    default:
      return Error(n.line, "a statement where an expression was expected");
  }
}

// ---------------------------------------------------------------------------------------------
// Filters, tests and methods.
// ---------------------------------------------------------------------------------------------
namespace {

size_t Len(const Value& v) {
  switch (v.type()) {
    case Value::kString:
      return CodePoints(v.str()).size();
    case Value::kList:
      return v.items().size();
    case Value::kDict:
      return v.dict().entries.size();
    default:
      return 0;
  }
}

// Attribute path "a.b" of `v`, as jinja2's attribute getter reads it (dict items; digits index
// lists).
Value Attribute(const Value& v, const std::string& path) {
  Value cur = v;
  size_t at = 0;
  while (true) {
    const size_t dot = path.find('.', at);
    const std::string part =
        path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    if (cur.is_dict()) {
      const Value* f = cur.dict().Find(part);
      cur = f != nullptr ? *f : Value::Undefined(part);
    } else if (cur.is_list() && !part.empty() &&
               std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      const size_t i = std::stoul(part);
      cur = i < cur.items().size() ? cur.items()[i] : Value::Undefined(part);
    } else {
      cur = Value::Undefined(part);
    }
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  return cur;
}

Value Folded(const Value& v, bool case_sensitive) {
  if (case_sensitive || !v.is_string()) return v;
  return Value::String(MapCase(v.str(), Lower));
}

}  // namespace

absl::StatusOr<Value> Interpreter::ApplyFilter(const Node& n, Value operand) {
  LORADB_ASSIGN_OR_RETURN(Args args, EvalArgs(n, 1));
  line_ = n.line;
  return ApplyFilterByName(n.name, std::move(operand), args);
}

absl::StatusOr<Value> Interpreter::ApplyFilterByName(const std::string& name, Value v, Args& args) {
  const auto need_string = [&]() -> absl::StatusOr<std::string> { return Str(v); };
  if (name == "default" || name == "d") {
    const Value* dflt = Arg(args, 0, "default_value");
    const Value* boolean = Arg(args, 1, "boolean");
    const bool use = v.is_undefined() || (boolean != nullptr && boolean->Truthy() && !v.Truthy());
    if (use) return dflt != nullptr ? *dflt : Value::String("");
    return v;
  }
  if (name == "length" || name == "count") {
    if (v.is_generator()) return Error(line_, "object of type 'generator' has no len()");
    return Value::Int(static_cast<int64_t>(Len(v)));
  }
  if (name == "string") return Value::String(Str(v));
  if (name == "safe") return Value::Markup(Str(v));
  if (name == "escape" || name == "e") {
    return v.is_markup() ? v : Value::Markup(HtmlEscape(Str(v)));
  }
  if (name == "trim") {
    const Value* chars = Arg(args, 0, "chars");
    return Value::String(PyStrip(Str(v), chars, true, true));
  }
  if (name == "upper") return Value::String(MapCase(Str(v), Upper));
  if (name == "lower") return Value::String(MapCase(Str(v), Lower));
  if (name == "capitalize") return Value::String(PyCapitalize(Str(v)));
  if (name == "title") {
    // jinja2 splits before runs of "-", whitespace and opening brackets, capitalizing each part.
    const std::vector<char32_t> cps = CodePoints(Str(v));
    std::string out;
    bool start = true;
    for (char32_t c : cps) {
      const bool delim =
          c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPyWhitespace(c);
      if (delim) {
        AppendCodePoint(c, &out);
        start = true;
      } else {
        AppendCodePoint(start ? Upper(c) : Lower(c), &out);
        start = false;
      }
    }
    return Value::String(out);
  }
  if (name == "replace") {
    const Value* old = Arg(args, 0, "old");
    const Value* repl = Arg(args, 1, "new");
    const Value* count = Arg(args, 2, "count");
    if (old == nullptr || repl == nullptr) return Error(line_, "replace() needs old and new");
    std::string out = PyReplace(Str(v), Str(*old), Str(*repl),
                                count != nullptr && !count->is_none() ? count->as_int() : -1);
    LORADB_RETURN_IF_ERROR(CheckSize(out.size()));
    return Value::String(std::move(out));
  }
  if (name == "indent") {
    const Value* width = Arg(args, 0, "width");
    const Value* first = Arg(args, 1, "first");
    const Value* blank = Arg(args, 2, "blank");
    const std::string indention =
        width == nullptr ? "    "
        : width->is_string()
            ? width->str()
            : std::string(static_cast<size_t>(std::clamp<int64_t>(width->as_int(), 0, 1 << 16)),
                          ' ');
    const std::vector<std::string> lines = SplitLines(Str(v) + "\n");
    std::string rv;
    if (blank != nullptr && blank->Truthy()) {
      rv = absl::StrJoin(lines, "\n" + indention);
    } else {
      rv = lines.empty() ? "" : lines[0];
      for (size_t i = 1; i < lines.size(); ++i) {
        rv += "\n";
        if (!lines[i].empty()) rv += indention;
        rv += lines[i];
      }
    }
    if (first != nullptr && first->Truthy()) rv = indention + rv;
    LORADB_RETURN_IF_ERROR(CheckSize(rv.size()));
    return Value::String(std::move(rv));
  }
  if (name == "tojson") {
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
    const Value* ensure_ascii = Arg(args, 0, "ensure_ascii");
    const Value* indent = Arg(args, 1, "indent");
    const Value* separators = Arg(args, 2, "separators");
    const Value* sort_keys = Arg(args, 3, "sort_keys");
    int indent_n = -1;
    std::string indent_text;
    if (indent != nullptr && !indent->is_none()) {
      if (indent->is_string()) {
        indent_text = indent->str();
        indent_n = 0;
      } else {
        indent_n = static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 64));
        indent_text = std::string(static_cast<size_t>(indent_n), ' ');
      }
    }
    std::string item_sep, key_sep;
    if (separators != nullptr && !separators->is_none()) {
      if (!separators->is_list() || separators->items().size() != 2 ||
          !separators->items()[0].is_string() || !separators->items()[1].is_string()) {
        return Error(line_, "tojson: separators must be a pair of strings");
      }
      item_sep = separators->items()[0].str();
      key_sep = separators->items()[1].str();
      if (item_sep.empty()) item_sep = "\x01";  // an explicit empty separator
    }
    std::string out;
    absl::Status s = AppendJson(v, ensure_ascii != nullptr && ensure_ascii->Truthy(), indent_n,
                                indent_text, item_sep == "\x01" ? "" : item_sep, key_sep,
                                sort_keys != nullptr && sort_keys->Truthy(), 0, &out);
    if (!s.ok()) return Error(line_, s.message());
    LORADB_RETURN_IF_ERROR(CheckSize(out.size()));
    return Value::String(std::move(out));
  }
  if (name == "int") {
    const Value* dflt = Arg(args, 0, "default");
    const Value fallback = dflt != nullptr ? *dflt : Value::Int(0);
    if (v.type() == Value::kInt || v.type() == Value::kBool) return Value::Int(v.as_int());
    if (v.type() == Value::kFloat) {
      if (!std::isfinite(v.as_float())) return fallback;
      return Value::Int(static_cast<int64_t>(v.as_float()));
    }
    if (v.is_string()) {
      int64_t i = 0;
      const std::string t = PyStrip(v.str(), nullptr, true, true);
      if (absl::SimpleAtoi(t, &i)) return Value::Int(i);
      double d = 0;
      if (absl::SimpleAtod(t, &d) && std::isfinite(d)) return Value::Int(static_cast<int64_t>(d));
    }
    return fallback;
  }
  if (name == "float") {
    const Value* dflt = Arg(args, 0, "default");
    if (v.is_number()) return Value::Float(v.Number());
    double d = 0;
    if (v.is_string() && absl::SimpleAtod(PyStrip(v.str(), nullptr, true, true), &d)) {
      return Value::Float(d);
    }
    return dflt != nullptr ? *dflt : Value::Float(0);
  }
  if (name == "abs") {
    if (v.type() == Value::kFloat) return Value::Float(std::fabs(v.as_float()));
    if (v.is_number()) return Value::Int(v.as_int() < 0 ? -v.as_int() : v.as_int());
    return Error(line_, absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
  }
  if (name == "round") {
    const Value* precision = Arg(args, 0, "precision");
    const Value* method = Arg(args, 1, "method");
    if (!v.is_number()) return Error(line_, "round: a number is required");
    const int p = precision != nullptr ? static_cast<int>(precision->as_int()) : 0;
    const double scale = std::pow(10.0, p);
    const std::string m = method != nullptr ? Str(*method) : "common";
    double x = v.Number() * scale;
    if (m == "ceil") {
      x = std::ceil(x);
    } else if (m == "floor") {
      x = std::floor(x);
    } else {
      x = std::round(x);
    }
    return Value::Float(x / scale);
  }
  if (name == "first" || name == "last") {
    LORADB_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*this, v));
    if (name == "last" && v.is_generator())
      return Error(line_, "'generator' object is not reversible");
    if (items.empty()) return Value::Undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    LORADB_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*this, v));
    return Value::MakeList(std::move(items));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<char32_t> cps = CodePoints(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value::String(FromCodePoints(cps));
    }
    if (v.is_generator()) return Error(line_, "'generator' object is not reversible");
    LORADB_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*this, v));
    std::reverse(items.begin(), items.end());
    return Value::Generator(std::move(items));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::Generator({});
    if (!v.is_dict()) return Error(line_, "items: a mapping is required");
    std::vector<Value> items;
    for (const auto& [k, item] : v.dict().entries) {
      items.push_back(Value::MakeList({v.dict().KeyValue(k), item}, true));
    }
    return Value::Generator(std::move(items));
  }
  if (name == "dictsort") {
    if (!v.is_dict()) return Error(line_, "dictsort: a mapping is required");
    const Value* cs = Arg(args, 0, "case_sensitive");
    const Value* by = Arg(args, 1, "by");
    const Value* rev = Arg(args, 2, "reverse");
    const bool by_value = by != nullptr && Str(*by) == "value";
    std::vector<Value> items;
    for (const auto& [k, item] : v.dict().entries) {
      items.push_back(Value::MakeList({v.dict().KeyValue(k), item}, true));
    }
    absl::Status error;
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      auto c = Compare(*this, Folded(a.items()[by_value], cs != nullptr && cs->Truthy()),
                       Folded(b.items()[by_value], cs != nullptr && cs->Truthy()), "<");
      if (!c.ok()) error = c.status();
      return c.ok() && *c < 0;
    });
    LORADB_RETURN_IF_ERROR(error);
    if (rev != nullptr && rev->Truthy()) std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (name == "join") {
    const Value* sep = Arg(args, 0, "d");
    const Value* attr = Arg(args, 1, "attribute");
    LORADB_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*this, v));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0 && sep != nullptr) AppendStr(*sep, &out);
      AppendStr(attr != nullptr ? Attribute(items[i], Str(*attr)) : items[i], &out);
      LORADB_RETURN_IF_ERROR(CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  if (name == "sum") {
    const Value* attr = Arg(args, 0, "attribute");
    const Value* start = Arg(args, 1, "start");
    LORADB_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*this, v));
    bool is_float = start != nullptr && start->type() == Value::kFloat;
    int64_t isum = start != nullptr ? start->as_int() : 0;
    double fsum = start != nullptr ? start->Number() : 0;
    for (const Value& item : items) {
      const Value x = attr != nullptr ? Attribute(item, Str(*attr)) : item;
      if (!x.is_number()) return Error(line_, "sum: the items must be numbers");
      if (x.type() == Value::kFloat) is_float = true;
      isum += x.as_int();
      fsum += x.Number();
    }
    return is_float ? Value::Float(fsum) : Value::Int(isum);
  }
  if (name == "min" || name == "max") {
    const Value* cs = Arg(args, 0, "case_sensitive");
    const Value* attr = Arg(args, 1, "attribute");
    LORADB_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*this, v));
    if (items.empty()) return Value::Undefined(name);
    size_t best = 0;
    for (size_t i = 1; i < items.size(); ++i) {
      const auto key = [&](const Value& x) {
        return Folded(attr != nullptr ? Attribute(x, Str(*attr)) : x,
                      cs != nullptr && cs->Truthy());
      };
      LORADB_ASSIGN_OR_RETURN(int c, Compare(*this, key(items[i]), key(items[best]), "<"));
      if (name == "min" ? c < 0 : c > 0) best = i;
    }
    return items[best];
  }
  if (name == "sort") {
    const Value* rev = Arg(args, 0, "reverse");
    const Value* cs = Arg(args, 1, "case_sensitive");
    const Value* attr = Arg(args, 2, "attribute");
    LORADB_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*this, v));
    absl::Status error;
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      const auto key = [&](const Value& x) {
        return Folded(attr != nullptr ? Attribute(x, Str(*attr)) : x,
                      cs != nullptr && cs->Truthy());
      };
      auto c = Compare(*this, key(a), key(b), "<");
      if (!c.ok()) error = c.status();
      return c.ok() && (rev != nullptr && rev->Truthy() ? *c > 0 : *c < 0);
    });
    LORADB_RETURN_IF_ERROR(error);
    return Value::MakeList(std::move(items));
  }
  if (name == "unique") {
    const Value* cs = Arg(args, 0, "case_sensitive");
    const Value* attr = Arg(args, 1, "attribute");
    LORADB_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*this, v));
    std::vector<Value> out, seen;
    for (const Value& item : items) {
      const Value key = Folded(attr != nullptr ? Attribute(item, Str(*attr)) : item,
                               cs != nullptr && cs->Truthy());
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::Generator(std::move(out));
  }
  if (name == "map") {
    // jinja2 maps nothing over a false value (None included).
    std::vector<Value> items;
    if (v.Truthy()) {
      LORADB_ASSIGN_OR_RETURN(items, Iterate(*this, v));
    }
    std::vector<Value> out;
    if (const Value* attr = Kw(args, "attribute")) {
      const Value* dflt = Kw(args, "default");
      for (const Value& item : items) {
        Value x = Attribute(item, Str(*attr));
        out.push_back(x.is_undefined() && dflt != nullptr ? *dflt : x);
      }
      return Value::Generator(std::move(out));
    }
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return Error(line_, "map: expected a filter name or attribute=");
    }
    const std::string filter = args.positional[0].str();
    if (!IsFilter(filter)) return Error(line_, absl::StrCat("no filter named '", filter, "'"));
    Args rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    for (const Value& item : items) {
      Args copy = rest;
      LORADB_ASSIGN_OR_RETURN(Value x, ApplyFilterByName(filter, item, copy));
      out.push_back(std::move(x));
    }
    return Value::Generator(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    std::vector<Value> items;
    if (v.Truthy()) {
      LORADB_ASSIGN_OR_RETURN(items, Iterate(*this, v));
    }
    size_t at = 0;
    std::string attr;
    if (by_attr) {
      if (args.positional.empty()) return Error(line_, absl::StrCat(name, ": missing attribute"));
      attr = Str(args.positional[at++]);
    }
    std::string test;
    if (at < args.positional.size()) test = Str(args.positional[at++]);
    if (!test.empty() && !IsTest(test))
      return Error(line_, absl::StrCat("no test named '", test, "'"));
    Args rest;
    rest.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(at),
                           args.positional.end());
    std::vector<Value> out;
    for (const Value& item : items) {
      const Value x = by_attr ? Attribute(item, attr) : item;
      bool r;
      if (test.empty()) {
        r = x.Truthy();
      } else {
        Args copy = rest;
        LORADB_ASSIGN_OR_RETURN(r, ApplyTest(test, x, copy));
      }
      if (r == keep_if) out.push_back(item);
    }
    return Value::Generator(std::move(out));
  }
  if (name == "attr") {
    const Value* attr = Arg(args, 0, "name");
    if (attr == nullptr) return Error(line_, "attr: missing name");
    if (v.is_dict()) {
      const Value* f = v.dict().Find(Str(*attr));
      return f != nullptr ? *f : Value::Undefined(Str(*attr));
    }
    return Value::Undefined(Str(*attr));
  }
  if (name == "format") {
    Value rest = Value::MakeList(args.positional, true);
    LORADB_ASSIGN_OR_RETURN(std::string s, PercentFormat(*this, Str(v), rest));
    return Value::String(std::move(s));
  }
  if (name == "wordcount") {
    return Value::Int(static_cast<int64_t>(PySplit(Str(v), nullptr, -1, false).size()));
  }
  (void)need_string;
  return Error(line_, absl::StrCat("no filter named '", name, "'"));
}

absl::StatusOr<bool> Interpreter::ApplyTest(const std::string& name, const Value& v, Args& args) {
  if (!IsTest(name)) return Error(line_, absl::StrCat("no test named '", name, "'"));
  const Value* other = Arg(args, 0, "other");
  const auto need_other = [&]() -> absl::Status {
    if (other == nullptr) return Error(line_, absl::StrCat("test '", name, "' needs an argument"));
    return absl::OkStatus();
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.type() == Value::kBool;
  if (name == "true") return v.type() == Value::kBool && v.as_bool();
  if (name == "false") return v.type() == Value::kBool && !v.as_bool();
  if (name == "integer") return v.type() == Value::kInt;
  if (name == "float") return v.type() == Value::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.is_namespace();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "lower")
    return v.is_string() && MapCase(v.str(), Lower) == v.str() &&
           MapCase(v.str(), Upper) != v.str();
  if (name == "upper")
    return v.is_string() && MapCase(v.str(), Upper) == v.str() &&
           MapCase(v.str(), Lower) != v.str();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.type() != Value::kInt && v.type() != Value::kBool) {
      return Error(line_, absl::StrCat("test '", name, "' needs an integer"));
    }
    if (name == "odd") return PyMod(v.as_int(), 2) == 1;
    if (name == "even") return PyMod(v.as_int(), 2) == 0;
    LORADB_RETURN_IF_ERROR(need_other());
    if (!other->is_number() || other->as_int() == 0)
      return Error(line_, "divisibleby: bad divisor");
    return PyMod(v.as_int(), other->as_int()) == 0;
  }
  if (name == "filter") return v.is_string() && IsFilter(v.str());
  if (name == "test") return v.is_string() && IsTest(v.str());
  LORADB_RETURN_IF_ERROR(need_other());
  if (name == "sameas") {
    if (v.type() != other->type()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.type() == Value::kBool) return v.as_bool() == other->as_bool();
    if (v.is_list()) return &v.items() == &other->items();
    if (v.is_dict()) return &v.dict() == &other->dict();
    return Equal(v, *other);
  }
  if (name == "eq" || name == "equalto") return Equal(v, *other);
  if (name == "ne") return !Equal(v, *other);
  if (name == "in") return Contains(*this, *other, v);
  const char* op = name == "lt" || name == "lessthan"      ? "<"
                   : name == "le"                          ? "<="
                   : name == "gt" || name == "greaterthan" ? ">"
                                                           : ">=";
  LORADB_ASSIGN_OR_RETURN(int c, Compare(*this, v, *other, op));
  if (op[0] == '<') return op[1] == '=' ? c <= 0 : c < 0;
  return op[1] == '=' ? c >= 0 : c > 0;
}

absl::StatusOr<Value> Interpreter::CallMethod(const Value& self, const std::string& name,
                                              Args& args) {
  const Value* a0 = args.positional.size() > 0 ? &args.positional[0] : nullptr;
  const Value* a1 = args.positional.size() > 1 ? &args.positional[1] : nullptr;
  if (self.is_dict()) {
    if (name == "items") {
      std::vector<Value> items;
      for (const auto& [k, v] : self.dict().entries) {
        items.push_back(Value::MakeList({self.dict().KeyValue(k), v}, true));
      }
      return Value::MakeList(std::move(items));
    }
    if (name == "keys" || name == "values") {
      std::vector<Value> items;
      for (const auto& [k, v] : self.dict().entries) {
        items.push_back(name == "keys" ? self.dict().KeyValue(k) : v);
      }
      return Value::MakeList(std::move(items));
    }
    if (name == "get") {
      if (a0 == nullptr) return Error(line_, "get() needs a key");
      if (const std::optional<std::string> k = DictKey(*a0); k.has_value()) {
        if (const Value* f = self.dict().Find(*k)) return *f;
      }
      return a1 != nullptr ? *a1 : Value::None();
    }
  }
  if (self.is_list()) {
    if (name == "count") {
      int64_t c = 0;
      for (const Value& v : self.items()) c += a0 != nullptr && Equal(v, *a0);
      return Value::Int(c);
    }
    if (name == "index") {
      for (size_t i = 0; i < self.items().size(); ++i) {
        if (a0 != nullptr && Equal(self.items()[i], *a0))
          return Value::Int(static_cast<int64_t>(i));
      }
      return Error(line_, "list.index(x): x not in list");
    }
  }
  if (!self.is_string()) return Error(line_, absl::StrCat("no method '", name, "'"));
  const std::string& s = self.str();
  const auto str_arg = [&](const Value* v, const char* what) -> absl::StatusOr<std::string> {
    if (v == nullptr || !v->is_string()) {
      return Error(line_, absl::StrCat(name, "() argument ", what, " must be str"));
    }
    return v->str();
  };
  if (name == "strip") return Value::String(PyStrip(s, a0, true, true));
  if (name == "lstrip") return Value::String(PyStrip(s, a0, true, false));
  if (name == "rstrip") return Value::String(PyStrip(s, a0, false, true));
  if (name == "upper") return Value::String(MapCase(s, Upper));
  if (name == "lower") return Value::String(MapCase(s, Lower));
  if (name == "title") return Value::String(PyTitle(s));
  if (name == "capitalize") return Value::String(PyCapitalize(s));
  if (name == "startswith" || name == "endswith") {
    std::vector<std::string> options;
    if (a0 != nullptr && a0->is_list()) {
      for (const Value& v : a0->items()) {
        LORADB_ASSIGN_OR_RETURN(std::string o, str_arg(&v, "1"));
        options.push_back(o);
      }
    } else {
      LORADB_ASSIGN_OR_RETURN(std::string o, str_arg(a0, "1"));
      options.push_back(o);
    }
    for (const std::string& o : options) {
      if (name == "startswith" ? absl::StartsWith(s, o) : absl::EndsWith(s, o))
        return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "split" || name == "rsplit") {
    const Value* sep = a0 != nullptr ? a0 : Kw(args, "sep");
    const Value* maxsplit = a1 != nullptr ? a1 : Kw(args, "maxsplit");
    if (sep != nullptr && !sep->is_none()) {
      LORADB_ASSIGN_OR_RETURN(std::string d, str_arg(sep, "sep"));
      if (d.empty()) return Error(line_, "empty separator");
    }
    std::vector<Value> parts;
    for (std::string& p :
         PySplit(s, sep, maxsplit != nullptr ? maxsplit->as_int() : -1, name == "rsplit")) {
      parts.push_back(Value::String(std::move(p)));
    }
    return Value::MakeList(std::move(parts));
  }
  if (name == "splitlines") {
    std::vector<Value> parts;
    for (std::string& p : SplitLines(s)) parts.push_back(Value::String(std::move(p)));
    return Value::MakeList(std::move(parts));
  }
  if (name == "replace") {
    LORADB_ASSIGN_OR_RETURN(std::string old, str_arg(a0, "1"));
    LORADB_ASSIGN_OR_RETURN(std::string repl, str_arg(a1, "2"));
    const Value* count = args.positional.size() > 2 ? &args.positional[2] : Kw(args, "count");
    std::string out = PyReplace(s, old, repl, count != nullptr ? count->as_int() : -1);
    LORADB_RETURN_IF_ERROR(CheckSize(out.size()));
    return Value::String(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    LORADB_ASSIGN_OR_RETURN(std::string sub, str_arg(a0, "1"));
    if (name == "count") {
      if (sub.empty()) return Value::Int(static_cast<int64_t>(Len(self) + 1));
      int64_t c = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++c;
      return Value::Int(c);
    }
    const size_t at = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos) {
      if (name == "index") return Error(line_, "substring not found");
      return Value::Int(-1);
    }
    return Value::Int(static_cast<int64_t>(CodePoints(s.substr(0, at)).size()));
  }
  if (name == "join") {
    if (a0 == nullptr) return Error(line_, "join() needs an iterable");
    LORADB_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*this, *a0));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return Error(line_, absl::StrCat("sequence item ", i, ": expected str instance, ",
                                         items[i].TypeName(), " found"));
      }
      if (i > 0) out += s;
      out += items[i].str();
      LORADB_RETURN_IF_ERROR(CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  if (name == "format") {
    // str.format with "{}", "{N}" and "{name}" fields (no format specs).
    std::string out;
    size_t auto_index = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '{') {
        out.push_back('{');
        ++i;
      } else if (s[i] == '}' && i + 1 < s.size() && s[i + 1] == '}') {
        out.push_back('}');
        ++i;
      } else if (s[i] == '{') {
        const size_t close = s.find('}', i);
        if (close == std::string::npos) return Error(line_, "format: unmatched '{'");
        const std::string field = s.substr(i + 1, close - i - 1);
        const Value* v = nullptr;
        size_t index = 0;
        if (field.empty()) {
          index = auto_index++;
          v = index < args.positional.size() ? &args.positional[index] : nullptr;
        } else if (absl::SimpleAtoi(field, &index)) {
          v = index < args.positional.size() ? &args.positional[index] : nullptr;
        } else {
          v = Kw(args, field.c_str());
        }
        if (v == nullptr)
          return Error(line_, absl::StrCat("format: no value for field '", field, "'"));
        AppendStr(*v, &out);
        i = close;
      } else {
        out.push_back(s[i]);
      }
      LORADB_RETURN_IF_ERROR(CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  const std::vector<char32_t> cps = CodePoints(s);
  const auto all = [&](auto pred) {
    return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
  };
  const auto cat = [](char32_t c) { return utf8proc_category(static_cast<int32_t>(c)); };
  if (name == "isspace") return Value::Bool(all([](char32_t c) { return IsPyWhitespace(c); }));
  if (name == "isdigit")
    return Value::Bool(all([&](char32_t c) { return cat(c) == UTF8PROC_CATEGORY_ND; }));
  if (name == "isalpha") {
    return Value::Bool(all([&](char32_t c) {
      const auto k = cat(c);
      return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
    }));
  }
  if (name == "isalnum") {
    return Value::Bool(all([&](char32_t c) {
      const auto k = cat(c);
      return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
             (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
    }));
  }
  if (name == "isupper" || name == "islower") {
    bool cased = false;
    for (char32_t c : cps) {
      if (!Cased(c)) continue;
      cased = true;
      if (name == "isupper" ? Upper(c) != c || Lower(c) == c : Lower(c) != c || Upper(c) == c) {
        return Value::Bool(false);
      }
    }
    return Value::Bool(cased);
  }
  return Error(line_, absl::StrCat("'str' object has no method '", name, "'"));
}

}  // namespace loradb::text::jinja
