// Values of the Jinja engine (text/jinja/template.h): what Python's jinja2 manipulates when it
// renders a chat template, reduced to JSON's types plus tuples, jinja2's Undefined, namespaces and
// callables, with Python's rules for truth, equality, str() and repr(), and transformers' tojson.
#ifndef LORADB_TEXT_JINJA_VALUE_H_
#define LORADB_TEXT_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb::text::jinja {

class Value;
struct List;
struct Dict;
struct Callable;
class Interpreter;

// Arguments of a call: positional, then keyword (name, value) in the order written.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

class Value {
 public:
  enum Type : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // Undefined
  static Value Undefined(std::string name);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  // A markupsafe.Markup string (what jinja2's safe and escape filters return): adding a plain
  // string to it HTML-escapes that string.
  static Value Markup(std::string s);
  static Value MakeList(std::vector<Value> items, bool tuple = false);
  // What jinja2's map / select / reject / selectattr / rejectattr / unique / items filters return:
  // a generator, which iterates like a list but is always true, has no len() and no JSON form.
  static Value Generator(std::vector<Value> items);
  static Value MakeDict();
  static Value MakeNamespace();
  static Value Function(std::string name,
                        std::function<absl::StatusOr<Value>(Interpreter&, Args&)> fn);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == kUndefined; }
  bool is_none() const { return type_ == kNone; }
  bool is_string() const { return type_ == kString; }
  bool is_markup() const { return type_ == kString && b_; }
  bool is_number() const { return type_ == kInt || type_ == kFloat || type_ == kBool; }
  bool is_list() const { return type_ == kList; }
  bool is_dict() const { return type_ == kDict; }
  bool is_callable() const { return type_ == kCallable; }
  bool is_namespace() const;
  bool is_tuple() const;
  bool is_generator() const;

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_float() const { return f_; }
  const std::string& str() const { return s_; }  // kString; kUndefined: the name that is missing
  const std::vector<Value>& items() const;       // kList
  std::vector<Value>& mutable_items();
  const Dict& dict() const;  // kDict
  Dict& mutable_dict();
  const Callable& callable() const;

  // Python's truth value (jinja2's Undefined is false).
  bool Truthy() const;
  // The number as a double (int, float or bool).
  double Number() const;
  // Python's type name, for error messages ("str", "int", "list", "dict", "NoneType", ...).
  const char* TypeName() const;

 private:
  Type type_ = kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<void> obj_;  // the List, Dict or Callable of a list, dict or callable
};

struct List {
  std::vector<Value> items;
  bool tuple = false;
  bool generator = false;
};

// An insertion-ordered map (Python dict), or a jinja2 namespace. Keys are strings; a key of
// another type (a number, a bool, None) is stored under DictKey(key) with the key itself in
// `key_values`.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  std::vector<std::pair<std::string, Value>> key_values;
  bool is_namespace = false;
  // The key as the template sees it: the string, or the value of a non-string key.
  Value KeyValue(const std::string& key) const;
  const Value* Find(absl::string_view key) const;
  // Sets `key`, keeping its position when it exists.
  void Set(std::string key, Value value);
};

struct Callable {
  std::string name;
  std::function<absl::StatusOr<Value>(Interpreter&, Args&)> fn;
};

// Python's == between two values (1 == 1.0 == True; lists and dicts compare element-wise;
// Undefined equals only Undefined).
bool Equal(const Value& a, const Value& b);

// The string a dict stores key `key` under (Python hashes 1, 1.0 and True alike), or nullopt for
// a key of a type Python cannot hash (list, dict).
std::optional<std::string> DictKey(const Value& key);

// Python's str() of `v` (jinja2 prints this; Undefined prints as nothing), appended to `out`.
void AppendStr(const Value& v, std::string* out);
std::string Str(const Value& v);
// Python's repr() (strings quoted as Python quotes them), appended to `out`.
void AppendRepr(const Value& v, std::string* out);
// Python's repr() of a float ("1.0", "0.1", "1e+20", "nan", "inf").
std::string FloatRepr(double f);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson filter calls
// it: `indent` < 0 means None; `item_sep` / `key_sep` empty mean json.dumps' defaults.
// InvalidArgument for a value JSON cannot hold (Undefined, a callable).
[[nodiscard]] absl::Status AppendJson(const Value& v, bool ensure_ascii, int indent,
                                      const std::string& indent_text, const std::string& item_sep,
                                      const std::string& key_sep, bool sort_keys, int depth,
                                      std::string* out);

// Parses JSON text into a value (objects keep their key order). InvalidArgument naming `what`
// when it is not valid JSON or nests deeper than 64 levels.
[[nodiscard]] absl::StatusOr<Value> ParseJson(absl::string_view json, absl::string_view what);

}  // namespace loradb::text::jinja

#endif  // LORADB_TEXT_JINJA_VALUE_H_
