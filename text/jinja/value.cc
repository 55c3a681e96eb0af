#include "text/jinja/value.h"

#include <simdjson.h>
#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "storage/util/status_macros.h"
#include "text/utf8.h"

namespace loradb::text::jinja {

Value Value::Undefined(std::string name) {
  Value v;
  v.s_ = std::move(name);
  return v;
}
Value Value::None() {
  Value v;
  v.type_ = kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.type_ = kBool;
  v.b_ = b;
  v.i_ = b ? 1 : 0;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.type_ = kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.type_ = kFloat;
  v.f_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.type_ = kString;
  v.s_ = std::move(s);
  return v;
}
Value Value::Markup(std::string s) {
  Value v = String(std::move(s));
  v.b_ = true;
  return v;
}
Value Value::MakeList(std::vector<Value> items, bool tuple) {
  Value v;
  v.type_ = kList;
  auto list = std::make_shared<List>();
  list->items = std::move(items);
  list->tuple = tuple;
  v.obj_ = std::move(list);
  return v;
}
Value Value::Generator(std::vector<Value> items) {
  Value v = MakeList(std::move(items));
  static_cast<List*>(v.obj_.get())->generator = true;
  return v;
}
Value Value::MakeDict() {
  Value v;
  v.type_ = kDict;
  v.obj_ = std::make_shared<Dict>();
  return v;
}
Value Value::MakeNamespace() {
  Value v = MakeDict();
  static_cast<Dict*>(v.obj_.get())->is_namespace = true;
  return v;
}
Value Value::Function(std::string name,
                      std::function<absl::StatusOr<Value>(Interpreter&, Args&)> fn) {
  Value v;
  v.type_ = kCallable;
  auto callable = std::make_shared<Callable>();
  callable->name = std::move(name);
  callable->fn = std::move(fn);
  v.obj_ = std::move(callable);
  return v;
}

bool Value::is_namespace() const { return type_ == kDict && dict().is_namespace; }
bool Value::is_tuple() const {
  return type_ == kList && static_cast<const List*>(obj_.get())->tuple;
}
bool Value::is_generator() const {
  return type_ == kList && static_cast<const List*>(obj_.get())->generator;
}
const std::vector<Value>& Value::items() const {
  return static_cast<const List*>(obj_.get())->items;
}
std::vector<Value>& Value::mutable_items() { return static_cast<List*>(obj_.get())->items; }
const Dict& Value::dict() const { return *static_cast<const Dict*>(obj_.get()); }
Dict& Value::mutable_dict() { return *static_cast<Dict*>(obj_.get()); }
const Callable& Value::callable() const { return *static_cast<const Callable*>(obj_.get()); }

bool Value::Truthy() const {
  switch (type_) {
    case kUndefined:
    case kNone:
      return false;
    case kBool:
      return b_;
    case kInt:
      return i_ != 0;
    case kFloat:
      return f_ != 0;
    case kString:
      return !s_.empty();
    case kList:
      return is_generator() || !items().empty();
    case kDict:
      return dict().is_namespace || !dict().entries.empty();
    case kCallable:
      return true;
  }
  return false;
}

double Value::Number() const {
  if (type_ == kFloat) return f_;
  return static_cast<double>(i_);
}

const char* Value::TypeName() const {
  switch (type_) {
    case kUndefined:
      return "Undefined";
    case kNone:
      return "NoneType";
    case kBool:
      return "bool";
    case kInt:
      return "int";
    case kFloat:
      return "float";
    case kString:
      return "str";
    case kList:
      return is_generator() ? "generator" : is_tuple() ? "tuple" : "list";
    case kDict:
      return dict().is_namespace ? "Namespace" : "dict";
    case kCallable:
      return "function";
  }
  return "?";
}

const Value* Dict::Find(absl::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value Dict::KeyValue(const std::string& key) const {
  if (!key.empty() && key[0] == '\x01') {
    for (const auto& [k, v] : key_values) {
      if (k == key) return v;
    }
  }
  return Value::String(key);
}

std::optional<std::string> DictKey(const Value& key) {
  switch (key.type()) {
    case Value::kString:
      return key.str();
    case Value::kNone:
      return std::string("\x01None");
    case Value::kBool:
    case Value::kInt:
      return absl::StrCat("\x01n", key.as_int());
    case Value::kFloat:
      if (std::floor(key.as_float()) == key.as_float() && std::fabs(key.as_float()) < 9e18) {
        return absl::StrCat("\x01n", static_cast<int64_t>(key.as_float()));
      }
      return absl::StrCat("\x01f", FloatRepr(key.as_float()));
    default:
      return std::nullopt;
  }
}

void Dict::Set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type() == Value::kFloat || b.type() == Value::kFloat) return a.Number() == b.Number();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::kUndefined:
    case Value::kNone:
      return true;
    case Value::kString:
      return a.str() == b.str();
    case Value::kList: {
      if (a.is_generator() || b.is_generator()) return &a.items() == &b.items();
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!Equal(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case Value::kDict: {
      if (&a.dict() == &b.dict()) return true;
      if (a.is_namespace() || b.is_namespace()) return false;
      if (a.dict().entries.size() != b.dict().entries.size()) return false;
      for (const auto& [k, v] : a.dict().entries) {
        const Value* other = b.dict().Find(k);
        if (other == nullptr || !Equal(v, *other)) return false;
      }
      return true;
    }
    case Value::kCallable:
      return &a.callable() == &b.callable();
    default:
      return false;
  }
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);  // -d.ddde+XX
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exp = std::atoi(sci.c_str() + e + 1);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  absl::StrAppend(&out, exp < 0 ? "e-" : "e+", absl::StrFormat("%02d", std::abs(exp)));
  return out;
}

namespace {

// Python's str.isprintable() for one code point.
bool IsPrintable(char32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

void AppendStringRepr(const std::string& s, std::string* out) {
  const char quote =
      (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  out->push_back(quote);
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t cp = NextCodePoint(s, &pos);
    if (cp == '\\' || cp == static_cast<char32_t>(quote)) {
      out->push_back('\\');
      out->push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out->append("\\n");
    } else if (cp == '\r') {
      out->append("\\r");
    } else if (cp == '\t') {
      out->append("\\t");
    } else if (!IsPrintable(cp)) {
      if (cp < 0x100) {
        absl::StrAppend(out, absl::StrFormat("\\x%02x", static_cast<uint32_t>(cp)));
      } else if (cp < 0x10000) {
        absl::StrAppend(out, absl::StrFormat("\\u%04x", static_cast<uint32_t>(cp)));
      } else {
        absl::StrAppend(out, absl::StrFormat("\\U%08x", static_cast<uint32_t>(cp)));
      }
    } else {
      out->append(s, start, pos - start);
    }
  }
  out->push_back(quote);
}

void AppendContainer(const Value& v, std::string* out) {
  if (v.is_generator()) {
    out->append("<generator object>");
    return;
  }
  if (v.is_list()) {
    out->push_back(v.is_tuple() ? '(' : '[');
    for (size_t i = 0; i < v.items().size(); ++i) {
      if (i > 0) out->append(", ");
      AppendRepr(v.items()[i], out);
    }
    if (v.is_tuple() && v.items().size() == 1) out->push_back(',');
    out->push_back(v.is_tuple() ? ')' : ']');
    return;
  }
  if (v.is_namespace()) out->append("<Namespace ");
  out->push_back('{');
  bool first = true;
  for (const auto& [k, item] : v.dict().entries) {
    if (!first) out->append(", ");
    first = false;
    AppendRepr(v.dict().KeyValue(k), out);
    out->append(": ");
    AppendRepr(item, out);
  }
  out->push_back('}');
  if (v.is_namespace()) out->push_back('>');
}

}  // namespace

void AppendStr(const Value& v, std::string* out) {
  switch (v.type()) {
    case Value::kUndefined:
      return;
    case Value::kNone:
      out->append("None");
      return;
    case Value::kBool:
      out->append(v.as_bool() ? "True" : "False");
      return;
    case Value::kInt:
      absl::StrAppend(out, v.as_int());
      return;
    case Value::kFloat:
      out->append(FloatRepr(v.as_float()));
      return;
    case Value::kString:
      out->append(v.str());
      return;
    case Value::kList:
    case Value::kDict:
      AppendContainer(v, out);
      return;
    case Value::kCallable:
      absl::StrAppend(out, "<function ", v.callable().name, ">");
      return;
  }
}

std::string Str(const Value& v) {
  std::string out;
  AppendStr(v, &out);
  return out;
}

void AppendRepr(const Value& v, std::string* out) {
  if (v.is_string()) {
    AppendStringRepr(v.str(), out);
  } else if (v.is_undefined()) {
    out->append("Undefined");
  } else {
    AppendStr(v, out);
  }
}

namespace {

void AppendJsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    const char32_t cp = NextCodePoint(s, &pos);
    switch (cp) {
      case '"':
        out->append("\\\"");
        continue;
      case '\\':
        out->append("\\\\");
        continue;
      case '\n':
        out->append("\\n");
        continue;
      case '\r':
        out->append("\\r");
        continue;
      case '\t':
        out->append("\\t");
        continue;
      case '\b':
        out->append("\\b");
        continue;
      case '\f':
        out->append("\\f");
        continue;
      default:
        break;
    }
    if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
      if (cp >= 0x10000) {
        const uint32_t v = static_cast<uint32_t>(cp) - 0x10000;
        absl::StrAppend(
            out, absl::StrFormat("\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)));
      } else {
        absl::StrAppend(out, absl::StrFormat("\\u%04x", static_cast<uint32_t>(cp)));
      }
      continue;
    }
    out->append(s, start, pos - start);
  }
  out->push_back('"');
}

}  // namespace

absl::Status AppendJson(const Value& v, bool ensure_ascii, int indent,
                        const std::string& indent_text, const std::string& item_sep,
                        const std::string& key_sep, bool sort_keys, int depth, std::string* out) {
  if (depth > 256) return absl::InvalidArgumentError("tojson: the value nests too deeply");
  switch (v.type()) {
    case Value::kUndefined:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: Object of type Undefined is not JSON serializable (",
                       v.str().empty() ? "a missing value" : absl::StrCat("'", v.str(), "'"), ")"));
    case Value::kCallable:
      return absl::InvalidArgumentError("tojson: a function is not JSON serializable");
    case Value::kNone:
      out->append("null");
      return absl::OkStatus();
    case Value::kBool:
      out->append(v.as_bool() ? "true" : "false");
      return absl::OkStatus();
    case Value::kInt:
      absl::StrAppend(out, v.as_int());
      return absl::OkStatus();
    case Value::kFloat: {
      const double f = v.as_float();
      if (std::isnan(f)) {
        out->append("NaN");
      } else if (std::isinf(f)) {
        out->append(f > 0 ? "Infinity" : "-Infinity");
      } else {
        out->append(FloatRepr(f));
      }
      return absl::OkStatus();
    }
    case Value::kString:
      AppendJsonString(v.str(), ensure_ascii, out);
      return absl::OkStatus();
    default:
      break;
  }
  const bool pretty = indent >= 0;
  const std::string isep = !item_sep.empty() ? item_sep : (pretty ? "," : ", ");
  const std::string ksep = !key_sep.empty() ? key_sep : ": ";
  const auto newline = [&](int level) {
    out->push_back('\n');
    for (int i = 0; i < level; ++i) out->append(indent_text);
  };
  if (v.is_generator()) {
    return absl::InvalidArgumentError("tojson: Object of type generator is not JSON serializable");
  }
  if (v.is_list()) {
    if (v.items().empty()) {
      out->append("[]");
      return absl::OkStatus();
    }
    out->push_back('[');
    for (size_t i = 0; i < v.items().size(); ++i) {
      if (i > 0) out->append(isep);
      if (pretty) newline(depth + 1);
      LORADB_RETURN_IF_ERROR(AppendJson(v.items()[i], ensure_ascii, indent, indent_text, item_sep,
                                        key_sep, sort_keys, depth + 1, out));
    }
    if (pretty) newline(depth);
    out->push_back(']');
    return absl::OkStatus();
  }
  std::vector<const std::pair<std::string, Value>*> entries;
  for (const auto& e : v.dict().entries) entries.push_back(&e);
  if (entries.empty()) {
    out->append("{}");
    return absl::OkStatus();
  }
  if (sort_keys) {
    std::stable_sort(entries.begin(), entries.end(),
                     [](const auto* a, const auto* b) { return a->first < b->first; });
  }
  out->push_back('{');
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i > 0) out->append(isep);
    if (pretty) newline(depth + 1);
    const Value key = v.dict().KeyValue(entries[i]->first);
    std::string key_text;
    if (key.is_string()) {
      key_text = key.str();
    } else if (key.is_none()) {
      key_text = "null";
    } else if (key.type() == Value::kBool) {
      key_text = key.as_bool() ? "true" : "false";
    } else {
      AppendStr(key, &key_text);
    }
    AppendJsonString(key_text, ensure_ascii, out);
    out->append(ksep);
    LORADB_RETURN_IF_ERROR(AppendJson(entries[i]->second, ensure_ascii, indent, indent_text,
                                      item_sep, key_sep, sort_keys, depth + 1, out));
  }
  if (pretty) newline(depth);
  out->push_back('}');
  return absl::OkStatus();
}

namespace {

absl::StatusOr<Value> FromDom(simdjson::dom::element e, int depth, absl::string_view what) {
  if (depth > 64) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": JSON nests deeper than 64 levels"));
  }
  switch (e.type()) {
    case simdjson::dom::element_type::ARRAY: {
      std::vector<Value> items;
      simdjson::dom::array array;
      if (e.get_array().get(array)) return absl::InternalError("JSON array expected");
      for (simdjson::dom::element item : array) {
        LORADB_ASSIGN_OR_RETURN(Value v, FromDom(item, depth + 1, what));
        items.push_back(std::move(v));
      }
      return Value::MakeList(std::move(items));
    }
    case simdjson::dom::element_type::OBJECT: {
      Value d = Value::MakeDict();
      simdjson::dom::object object;
      if (e.get_object().get(object)) return absl::InternalError("JSON object expected");
      for (auto field : object) {
        LORADB_ASSIGN_OR_RETURN(Value v, FromDom(field.value, depth + 1, what));
        d.mutable_dict().Set(std::string(field.key), std::move(v));
      }
      return d;
    }
    case simdjson::dom::element_type::INT64:
      return Value::Int(e.get_int64().value_unsafe());
    case simdjson::dom::element_type::UINT64:
      return Value::Float(static_cast<double>(e.get_uint64().value_unsafe()));
    case simdjson::dom::element_type::DOUBLE:
      return Value::Float(e.get_double().value_unsafe());
    case simdjson::dom::element_type::STRING:
      return Value::String(std::string(e.get_string().value_unsafe()));
    case simdjson::dom::element_type::BOOL:
      return Value::Bool(e.get_bool().value_unsafe());
    case simdjson::dom::element_type::NULL_VALUE:
      return Value::None();
  }
  return Value::None();
}

}  // namespace

absl::StatusOr<Value> ParseJson(absl::string_view json, absl::string_view what) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(json.data(), json.size()).get(root)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not valid JSON (", simdjson::error_message(err), ")"));
  }
  return FromDom(root, 0, what);
}

}  // namespace loradb::text::jinja
