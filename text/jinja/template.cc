#include "text/jinja/template.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/util/status_macros.h"
#include "text/jinja/ast.h"
#include "text/jinja/interpreter.h"
#include "text/utf8.h"

namespace loradb::text::jinja {

// ---------------------------------------------------------------------------------------------
// Lexer: the template's text, tags and the tokens inside tags, with jinja2's whitespace control
// (trim_blocks, lstrip_blocks, "-" and "+").
// ---------------------------------------------------------------------------------------------
namespace {

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEnd
};

struct Token {
  Tok kind;
  std::string text;
  int line;
};

absl::Status SyntaxError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("template line ", line, ": ", what));
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      // The next tag start.
      size_t tag = pos;
      while (true) {
        tag = src_.find('{', tag);
        if (tag == std::string::npos || tag + 1 >= src_.size()) {
          tag = std::string::npos;
          break;
        }
        const char c = src_[tag + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++tag;
      }
      if (tag == std::string::npos) {
        Emit(Tok::kText, src_.substr(pos), pos);
        break;
      }
      std::string text = src_.substr(pos, tag - pos);
      const char kind = src_[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      if (sign == '-') {
        text = RStrip(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: whitespace alone on the line before a block or comment tag goes.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        const bool line_start = l_pos > 0 || pos == 0 || src_[pos - 1] == '\n';
        if (line_start && l_pos < text.size() && AllSpace(text, l_pos)) text.resize(l_pos);
      }
      if (!text.empty()) Emit(Tok::kText, text, pos);
      if (kind == '#') {
        size_t end = src_.find("#}", after);
        if (end == std::string::npos) return SyntaxError(LineAt(tag), "unterminated comment");
        const bool strip = end > after && src_[end - 1] == '-';
        const bool keep = end > after && src_[end - 1] == '+';
        pos = SkipAfterTag(end + 2, strip, !keep);
        continue;
      }
      if (kind == '%' && IsRaw(after)) {
        LORADB_ASSIGN_OR_RETURN(pos, Raw(tag, after));
        continue;
      }
      Emit(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", tag);
      LORADB_ASSIGN_OR_RETURN(pos, Inside(after, kind == '{'));
    }
    tokens_.push_back({Tok::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  static bool IsSpaceByte(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  }
  // Python's str.isspace() for the characters at and after `from` (all of them).
  static bool AllSpace(const std::string& s, size_t from) {
    size_t pos = from;
    while (pos < s.size()) {
      const char32_t cp = NextCodePoint(s, &pos);
      if (!IsPyWhitespace(cp)) return false;
    }
    return true;
  }
  static std::string RStrip(const std::string& s) {
    size_t end = s.size();
    while (end > 0) {
      size_t b = end - 1;
      while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80) --b;
      size_t p = b;
      if (!IsPyWhitespace(NextCodePoint(s, &p))) break;
      end = b;
    }
    return s.substr(0, end);
  }
  // Position after a block/comment end at `pos`: all whitespace skipped for "-", one newline for
  // trim_blocks.
  size_t SkipAfterTag(size_t pos, bool strip, bool trim) {
    if (strip) {
      while (pos < src_.size()) {
        size_t p = pos;
        if (!IsPyWhitespace(NextCodePoint(src_, &p))) break;
        pos = p;
      }
    } else if (trim && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }
  bool IsRaw(size_t after) const {
    size_t p = after;
    while (p < src_.size() && IsSpaceByte(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && IsSpaceByte(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }
  absl::StatusOr<size_t> Raw(size_t tag, size_t after) {
    size_t p = src_.find("%}", after);
    const bool strip_open = src_[p - 1] == '-';
    size_t body = SkipAfterTag(p + 2, strip_open, false);
    // Find {% endraw %} (with optional - / +).
    size_t search = body;
    while (true) {
      size_t open = src_.find("{%", search);
      if (open == std::string::npos) return SyntaxError(LineAt(tag), "missing endraw");
      size_t q = open + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < src_.size() && IsSpaceByte(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") == 0) {
        q += 6;
        while (q < src_.size() && IsSpaceByte(src_[q])) ++q;
        bool strip_close = false;
        if (q < src_.size() && src_[q] == '-') {
          strip_close = true;
          ++q;
        } else if (q < src_.size() && src_[q] == '+') {
          ++q;
        }
        if (src_.compare(q, 2, "%}") != 0) return SyntaxError(LineAt(open), "bad endraw tag");
        std::string text = src_.substr(body, open - body);
        if (sign == '-') text = RStrip(text);
        if (!text.empty()) Emit(Tok::kText, text, body);
        return SkipAfterTag(q + 2, strip_close, src_[q - 1] != '+');
      }
      search = open + 2;
    }
  }

  // Tokens inside a tag starting at `pos`, through its end marker; returns the position after.
  absl::StatusOr<size_t> Inside(size_t pos, bool variable) {
    int depth = 0;
    while (true) {
      while (pos < src_.size() && IsSpaceByte(src_[pos])) {
        if (src_[pos] == '\n') ++line_;
        ++pos;
      }
      if (pos >= src_.size()) return SyntaxError(line_, "unexpected end of template inside a tag");
      // End markers, only outside brackets.
      if (depth == 0) {
        const char* end = variable ? "}}" : "%}";
        for (const char* prefix : {"-", "+", ""}) {
          const std::string marker = std::string(prefix) + end;
          if (src_.compare(pos, marker.size(), marker) == 0) {
            Emit(variable ? Tok::kVarEnd : Tok::kBlockEnd, "", pos);
            const size_t after = pos + marker.size();
            if (variable) return SkipAfterTag(after, prefix[0] == '-', false);
            return SkipAfterTag(after, prefix[0] == '-', prefix[0] != '+');
          }
        }
      }
      const char c = src_[pos];
      if (absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src_.size() &&
               (absl::ascii_isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) {
          ++e;
        }
        Emit(Tok::kName, src_.substr(pos, e - pos), pos);
        pos = e;
        continue;
      }
      if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos;
        bool is_float = false;
        while (e < src_.size() &&
               (absl::ascii_isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) {
          ++e;
        }
        if (e + 1 < src_.size() && src_[e] == '.' &&
            absl::ascii_isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && absl::ascii_isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t f = e + 1;
          if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
          if (f < src_.size() && absl::ascii_isdigit(static_cast<unsigned char>(src_[f]))) {
            is_float = true;
            e = f;
            while (e < src_.size() && absl::ascii_isdigit(static_cast<unsigned char>(src_[e]))) {
              ++e;
            }
          }
        }
        std::string text = src_.substr(pos, e - pos);
        text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
        Emit(is_float ? Tok::kFloat : Tok::kInt, text, pos);
        pos = e;
        continue;
      }
      if (c == '"' || c == '\'') {
        LORADB_ASSIGN_OR_RETURN(pos, String(pos));
        continue;
      }
      static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                   "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                   "{",  "}",  ",",  ".",  ":",  "|",  "="};
      bool matched = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (src_.compare(pos, n, op) == 0) {
          if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
          if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && n == 1) --depth;
          Emit(Tok::kOp, op, pos);
          pos += n;
          matched = true;
          break;
        }
      }
      if (!matched) {
        return SyntaxError(line_, absl::StrCat("unexpected character '", std::string(1, c), "'"));
      }
    }
  }

  // A Python string literal at `pos` (escapes as Python reads them).
  absl::StatusOr<size_t> String(size_t pos) {
    const char quote = src_[pos];
    std::string out;
    size_t p = pos + 1;
    while (true) {
      if (p >= src_.size()) return SyntaxError(line_, "unterminated string");
      const char c = src_[p];
      if (c == quote) break;
      if (c == '\\' && p + 1 < src_.size()) {
        const char e = src_[p + 1];
        p += 2;
        switch (e) {
          case 'n':
            out.push_back('\n');
            break;
          case 't':
            out.push_back('\t');
            break;
          case 'r':
            out.push_back('\r');
            break;
          case '0':
            out.push_back('\0');
            break;
          case 'a':
            out.push_back('\a');
            break;
          case 'b':
            out.push_back('\b');
            break;
          case 'f':
            out.push_back('\f');
            break;
          case 'v':
            out.push_back('\v');
            break;
          case '\\':
            out.push_back('\\');
            break;
          case '\'':
            out.push_back('\'');
            break;
          case '"':
            out.push_back('"');
            break;
          case '\n':
            break;
          case 'x':
          case 'u':
          case 'U': {
            const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            if (p + n > src_.size() ||
                !absl::SimpleHexAtoi(absl::string_view(src_).substr(p, n), &cp) || cp > 0x10FFFF ||
                (cp >= 0xD800 && cp < 0xE000)) {
              return SyntaxError(line_, "bad escape in a string literal");
            }
            AppendCodePoint(cp, &out);
            p += n;
            break;
          }
          default:
            out.push_back('\\');
            out.push_back(e);
        }
        continue;
      }
      if (c == '\n') ++line_;
      out.push_back(c);
      ++p;
    }
    Emit(Tok::kString, out, pos);
    return p + 1;
  }

  // The line of byte `pos`, counting newlines from the last position asked (positions come in
  // increasing order, so lexing stays linear in the template's size).
  int LineAt(size_t pos) {
    if (pos < line_cache_pos_) {
      line_cache_pos_ = 0;
      line_cache_ = 1;
    }
    line_cache_ +=
        static_cast<int>(std::count(src_.begin() + line_cache_pos_, src_.begin() + pos, '\n'));
    line_cache_pos_ = pos;
    return line_cache_;
  }
  void Emit(Tok kind, std::string text, size_t pos) {
    line_ = LineAt(pos);
    tokens_.push_back({kind, std::move(text), line_});
  }

  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
  size_t line_cache_pos_ = 0;
  int line_cache_ = 1;
};

}  // namespace

namespace {

using NodePtr = std::unique_ptr<Node>;

NodePtr Make(N kind, int line, std::string name = "") {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->line = line;
  n->name = std::move(name);
  return n;
}

}  // namespace

class Parser {
 public:
  Parser(std::vector<Token> tokens, const Limits& limits)
      : t_(std::move(tokens)), limits_(limits) {}

  absl::StatusOr<NodePtr> ParseTemplate() {
    LORADB_ASSIGN_OR_RETURN(NodePtr body, ParseBody({}));
    if (Peek().kind != Tok::kEnd) {
      return SyntaxError(Peek().line, absl::StrCat("unexpected '", Peek().text, "'"));
    }
    // As jinja2: an unknown filter or test is an error when the template is compiled, unless it
    // sits in an if statement or a conditional expression (then only when it is evaluated).
    for (const Unknown& u : unknown_) {
      if (!u.soft) return SyntaxError(u.line, u.what);
    }
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(pos_ + ahead, t_.size() - 1)]; }
  const Token& Next() {
    const Token& tok = t_[std::min(pos_, t_.size() - 1)];
    if (pos_ < t_.size() - 1) ++pos_;
    return tok;
  }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kName && Peek(ahead).text == name;
  }
  absl::Status Expect(const char* op) {
    if (!IsOp(op)) {
      return SyntaxError(Peek().line, absl::StrCat("expected '", op, "', got '", Describe(), "'"));
    }
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Peek().kind != Tok::kBlockEnd) {
      return SyntaxError(
          Peek().line,
          absl::StrCat("expected the end of the statement ('%}'), got '", Describe(), "'"));
    }
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != Tok::kName) {
      return SyntaxError(Peek().line, absl::StrCat("expected a name, got '", Describe(), "'"));
    }
    return Next().text;
  }
  std::string Describe() const {
    switch (Peek().kind) {
      case Tok::kEnd:
        return "end of template";
      case Tok::kBlockEnd:
        return "%}";
      case Tok::kVarEnd:
        return "}}";
      case Tok::kText:
        return "text";
      default:
        return Peek().text;
    }
  }
  absl::Status Enter() {
    if (++depth_ > limits_.max_nesting) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "template line ", Peek().line, ": nesting deeper than ", limits_.max_nesting));
    }
    return absl::OkStatus();
  }

  // Statements until a block whose keyword is in `stop` (left unconsumed, after its '{%').
  absl::StatusOr<NodePtr> ParseBody(const std::vector<std::string>& stop) {
    LORADB_RETURN_IF_ERROR(Enter());
    NodePtr body = Make(N::kBody, Peek().line);
    while (true) {
      const Token& tok = Peek();
      if (tok.kind == Tok::kEnd) {
        if (!stop.empty()) {
          return SyntaxError(tok.line, absl::StrCat("missing {% ", stop.back(), " %}"));
        }
        break;
      }
      if (tok.kind == Tok::kText) {
        body->kids.push_back(Make(N::kText, tok.line, tok.text));
        Next();
        continue;
      }
      if (tok.kind == Tok::kVarBegin) {
        Next();
        LORADB_ASSIGN_OR_RETURN(NodePtr e, ParseExpression());
        if (Peek().kind != Tok::kVarEnd) {
          return SyntaxError(Peek().line, absl::StrCat("expected '}}', got '", Describe(), "'"));
        }
        Next();
        NodePtr print = Make(N::kPrint, e->line);
        print->kids.push_back(std::move(e));
        body->kids.push_back(std::move(print));
        continue;
      }
      if (tok.kind != Tok::kBlockBegin) {
        return SyntaxError(tok.line, absl::StrCat("unexpected '", Describe(), "'"));
      }
      if (Peek(1).kind == Tok::kName &&
          std::find(stop.begin(), stop.end(), Peek(1).text) != stop.end()) {
        Next();
        break;
      }
      Next();
      LORADB_ASSIGN_OR_RETURN(NodePtr stmt, ParseStatement());
      if (stmt != nullptr) body->kids.push_back(std::move(stmt));
    }
    --depth_;
    return body;
  }

  absl::StatusOr<NodePtr> ParseStatement() {
    const int line = Peek().line;
    LORADB_ASSIGN_OR_RETURN(std::string keyword, ExpectName());
    if (keyword == "if") return ParseIf(line);
    if (keyword == "for") return ParseFor(line);
    if (keyword == "set") return ParseSet(line);
    if (keyword == "macro") return ParseMacro(line);
    if (keyword == "call") return ParseCallBlock(line);
    if (keyword == "filter") return ParseFilterBlock(line);
    if (keyword == "break" || keyword == "continue") {
      if (loops_ == 0) return SyntaxError(line, absl::StrCat("'", keyword, "' outside a loop"));
      LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
      return Make(keyword == "break" ? N::kBreak : N::kContinue, line);
    }
    if (keyword == "generation") {
      // transformers' AssistantTracker: the body renders as it is.
      LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
      LORADB_ASSIGN_OR_RETURN(NodePtr body, ParseBody({"endgeneration"}));
      Next();
      LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
      return body;
    }
    return SyntaxError(line, absl::StrCat("the statement '", keyword,
                                          "' is not supported by loradb's template engine"));
  }

  absl::StatusOr<NodePtr> ParseIf(int line) {
    return Soft([&] { return ParseIfSoft(line); });
  }
  absl::StatusOr<NodePtr> ParseIfSoft(int line) {
    NodePtr node = Make(N::kIf, line);
    while (true) {
      LORADB_ASSIGN_OR_RETURN(NodePtr cond, ParseExpression());
      LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
      LORADB_ASSIGN_OR_RETURN(NodePtr body, ParseBody({"elif", "else", "endif"}));
      node->kids.push_back(std::move(cond));
      node->kids.push_back(std::move(body));
      const std::string keyword = Next().text;
      if (keyword == "elif") continue;
      if (keyword == "else") {
        LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
        LORADB_ASSIGN_OR_RETURN(NodePtr other, ParseBody({"endif"}));
        Next();
        node->kids.push_back(std::move(other));
      }
      LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
  }

  absl::StatusOr<std::vector<std::string>> ParseTargets() {
    std::vector<std::string> names;
    const bool paren = IsOp("(");
    if (paren) Next();
    do {
      LORADB_ASSIGN_OR_RETURN(std::string n, ExpectName());
      names.push_back(std::move(n));
    } while (IsOp(",") && (Next(), true));
    if (paren) LORADB_RETURN_IF_ERROR(Expect(")"));
    return names;
  }

  // kids: [iter, body, filter-or-null-literal, else-or-absent]
  absl::StatusOr<NodePtr> ParseFor(int line) {
    NodePtr node = Make(N::kFor, line);
    LORADB_ASSIGN_OR_RETURN(node->names, ParseTargets());
    if (!IsName("in")) return SyntaxError(Peek().line, "expected 'in' in a for statement");
    Next();
    LORADB_ASSIGN_OR_RETURN(NodePtr iter, ParseExpression(/*with_condexpr=*/false));
    NodePtr filter;
    if (IsName("if")) {
      Next();
      LORADB_ASSIGN_OR_RETURN(filter, ParseExpression());
    }
    if (IsName("recursive")) {
      return SyntaxError(Peek().line,
                         "recursive loops are not supported by loradb's template "
                         "engine");
    }
    LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
    ++loops_;
    LORADB_ASSIGN_OR_RETURN(NodePtr body, Hard([&] { return ParseBody({"else", "endfor"}); }));
    --loops_;
    node->kids.push_back(std::move(iter));
    node->kids.push_back(std::move(body));
    node->kids.push_back(filter != nullptr ? std::move(filter) : nullptr);
    if (Next().text == "else") {
      LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
      LORADB_ASSIGN_OR_RETURN(NodePtr other, ParseBody({"endfor"}));
      Next();
      node->kids.push_back(std::move(other));
      node->flag = true;
    }
    LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
    return node;
  }

  absl::StatusOr<NodePtr> ParseSet(int line) {
    LORADB_ASSIGN_OR_RETURN(std::string first, ExpectName());
    if (IsOp(".")) {
      Next();
      NodePtr node = Make(N::kSetAttr, line, first);
      LORADB_ASSIGN_OR_RETURN(std::string attr, ExpectName());
      node->names.push_back(attr);
      LORADB_RETURN_IF_ERROR(Expect("="));
      LORADB_ASSIGN_OR_RETURN(NodePtr value, ParseTupleOrExpression());
      node->kids.push_back(std::move(value));
      LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    std::vector<std::string> names{first};
    while (IsOp(",")) {
      Next();
      LORADB_ASSIGN_OR_RETURN(std::string n, ExpectName());
      names.push_back(n);
    }
    if (IsOp("=")) {
      Next();
      NodePtr node = Make(N::kSet, line);
      node->names = std::move(names);
      LORADB_ASSIGN_OR_RETURN(NodePtr value, ParseTupleOrExpression());
      node->kids.push_back(std::move(value));
      LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
      return node;
    }
    if (names.size() != 1) return SyntaxError(line, "a block set assigns one name");
    // {% set x | filters %}...{% endset %}: kids[0] body, then the filters applied in order.
    NodePtr node = Make(N::kSetBlock, line, first);
    std::vector<NodePtr> filters;
    while (IsOp("|")) {
      Next();
      LORADB_ASSIGN_OR_RETURN(NodePtr f, ParseFilterCall(nullptr));
      filters.push_back(std::move(f));
    }
    LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
    LORADB_ASSIGN_OR_RETURN(NodePtr body, ParseBody({"endset"}));
    Next();
    LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
    node->kids.push_back(std::move(body));
    for (auto& f : filters) node->kids.push_back(std::move(f));
    return node;
  }

  // Parameters `(a, b=default, ...)` into names / kids (defaults; null for none).
  absl::Status ParseParams(Node* node) {
    LORADB_RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      LORADB_ASSIGN_OR_RETURN(std::string name, ExpectName());
      node->names.push_back(name);
      if (IsOp("=")) {
        Next();
        LORADB_ASSIGN_OR_RETURN(NodePtr d, ParseExpression());
        node->kids.push_back(std::move(d));
      } else {
        node->kids.push_back(nullptr);
      }
      if (!IsOp(",")) break;
      Next();
    }
    return Expect(")");
  }

  // kids: [body, default...]
  absl::StatusOr<NodePtr> ParseMacro(int line) {
    LORADB_ASSIGN_OR_RETURN(std::string name, ExpectName());
    NodePtr node = Make(N::kMacro, line, name);
    node->kids.push_back(nullptr);
    LORADB_RETURN_IF_ERROR(ParseParams(node.get()));
    LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
    const int saved_loops = loops_;
    loops_ = 0;
    LORADB_ASSIGN_OR_RETURN(NodePtr body, Hard([&] { return ParseBody({"endmacro"}); }));
    loops_ = saved_loops;
    Next();
    if (Peek().kind == Tok::kName) Next();  // {% endmacro name %}
    LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
    node->kids[0] = std::move(body);
    return node;
  }

  // A call block is a macro named "caller" (kids: [body, defaults...], names: its parameters)
  // plus the call expression: kids of the kCallBlock are [caller macro, call].
  absl::StatusOr<NodePtr> ParseCallBlock(int line) {
    NodePtr caller = Make(N::kMacro, line, "caller");
    caller->kids.push_back(nullptr);
    if (IsOp("(")) LORADB_RETURN_IF_ERROR(ParseParams(caller.get()));
    LORADB_ASSIGN_OR_RETURN(NodePtr call, ParseExpression());
    if (call->kind != N::kCall) return SyntaxError(line, "expected a call after 'call'");
    LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
    LORADB_ASSIGN_OR_RETURN(NodePtr body, Hard([&] { return ParseBody({"endcall"}); }));
    Next();
    LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
    caller->kids[0] = std::move(body);
    NodePtr node = Make(N::kCallBlock, line);
    node->kids.push_back(std::move(caller));
    node->kids.push_back(std::move(call));
    return node;
  }

  // kids: [body, filters...]
  absl::StatusOr<NodePtr> ParseFilterBlock(int line) {
    NodePtr node = Make(N::kFilterBlock, line);
    node->kids.push_back(nullptr);
    do {
      LORADB_ASSIGN_OR_RETURN(NodePtr f, ParseFilterCall(nullptr));
      node->kids.push_back(std::move(f));
    } while (IsOp("|") && (Next(), true));
    LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
    LORADB_ASSIGN_OR_RETURN(NodePtr body, Hard([&] { return ParseBody({"endfilter"}); }));
    Next();
    LORADB_RETURN_IF_ERROR(ExpectBlockEnd());
    node->kids[0] = std::move(body);
    return node;
  }

  // ----- expressions -----
  absl::StatusOr<NodePtr> ParseTupleOrExpression() {
    const int line = Peek().line;
    LORADB_ASSIGN_OR_RETURN(NodePtr first, ParseExpression());
    if (!IsOp(",")) return first;
    NodePtr tuple = Make(N::kTuple, line);
    tuple->kids.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (Peek().kind == Tok::kBlockEnd || Peek().kind == Tok::kVarEnd) break;
      LORADB_ASSIGN_OR_RETURN(NodePtr e, ParseExpression());
      tuple->kids.push_back(std::move(e));
    }
    return tuple;
  }

  absl::StatusOr<NodePtr> ParseExpression(bool with_condexpr = true) {
    LORADB_RETURN_IF_ERROR(Enter());
    absl::StatusOr<NodePtr> e = with_condexpr ? ParseCondExpr() : ParseOr();
    --depth_;
    return e;
  }

  absl::StatusOr<NodePtr> ParseCondExpr() {
    const size_t mark = unknown_.size();
    LORADB_ASSIGN_OR_RETURN(NodePtr expr, ParseOr());
    while (IsName("if")) {
      for (size_t i = mark; i < unknown_.size(); ++i) unknown_[i].soft = true;
      const int line = Next().line;
      LORADB_ASSIGN_OR_RETURN(NodePtr cond, Soft([&] { return ParseOr(); }));
      NodePtr node = Make(N::kCond, line);
      NodePtr other;
      if (IsName("else")) {
        Next();
        LORADB_ASSIGN_OR_RETURN(other, Soft([&] { return ParseCondExpr(); }));
      }
      node->kids.push_back(std::move(cond));
      node->kids.push_back(std::move(expr));
      node->kids.push_back(std::move(other));
      expr = std::move(node);
    }
    return expr;
  }

  absl::StatusOr<NodePtr> ParseOr() {
    LORADB_ASSIGN_OR_RETURN(NodePtr left, ParseAnd());
    while (IsName("or")) {
      NodePtr node = Make(N::kOr, Next().line);
      LORADB_ASSIGN_OR_RETURN(NodePtr right, ParseAnd());
      node->kids.push_back(std::move(left));
      node->kids.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }

  absl::StatusOr<NodePtr> ParseAnd() {
    LORADB_ASSIGN_OR_RETURN(NodePtr left, ParseNot());
    while (IsName("and")) {
      NodePtr node = Make(N::kAnd, Next().line);
      LORADB_ASSIGN_OR_RETURN(NodePtr right, ParseNot());
      node->kids.push_back(std::move(left));
      node->kids.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }

  absl::StatusOr<NodePtr> ParseNot() {
    if (IsName("not")) {
      NodePtr node = Make(N::kNot, Next().line);
      LORADB_RETURN_IF_ERROR(Enter());
      LORADB_ASSIGN_OR_RETURN(NodePtr operand, ParseNot());
      --depth_;
      node->kids.push_back(std::move(operand));
      return node;
    }
    return ParseCompare();
  }

  absl::StatusOr<NodePtr> ParseCompare() {
    const int line = Peek().line;
    LORADB_ASSIGN_OR_RETURN(NodePtr first, ParseMath1());
    NodePtr node;
    while (true) {
      std::string op;
      if (Peek().kind == Tok::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
           Peek().text == "<=" || Peek().text == ">" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      if (node == nullptr) {
        node = Make(N::kCompare, line);
        node->kids.push_back(std::move(first));
      }
      LORADB_ASSIGN_OR_RETURN(NodePtr operand, ParseMath1());
      node->names.push_back(op);
      node->kids.push_back(std::move(operand));
    }
    return node != nullptr ? std::move(node) : std::move(first);
  }

  absl::StatusOr<NodePtr> Binary(NodePtr left, std::string op, NodePtr right, int line) {
    NodePtr node = Make(N::kBinary, line, std::move(op));
    node->kids.push_back(std::move(left));
    node->kids.push_back(std::move(right));
    return node;
  }

  absl::StatusOr<NodePtr> ParseMath1() {
    LORADB_ASSIGN_OR_RETURN(NodePtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const Token& op = Next();
      LORADB_ASSIGN_OR_RETURN(NodePtr right, ParseConcat());
      LORADB_ASSIGN_OR_RETURN(left, Binary(std::move(left), op.text, std::move(right), op.line));
    }
    return left;
  }

  absl::StatusOr<NodePtr> ParseConcat() {
    const int line = Peek().line;
    LORADB_ASSIGN_OR_RETURN(NodePtr first, ParseMath2());
    if (!IsOp("~")) return first;
    NodePtr node = Make(N::kConcat, line);
    node->kids.push_back(std::move(first));
    while (IsOp("~")) {
      Next();
      LORADB_ASSIGN_OR_RETURN(NodePtr e, ParseMath2());
      node->kids.push_back(std::move(e));
    }
    return node;
  }

  absl::StatusOr<NodePtr> ParseMath2() {
    LORADB_ASSIGN_OR_RETURN(NodePtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& op = Next();
      LORADB_ASSIGN_OR_RETURN(NodePtr right, ParsePow());
      LORADB_ASSIGN_OR_RETURN(left, Binary(std::move(left), op.text, std::move(right), op.line));
    }
    return left;
  }

  absl::StatusOr<NodePtr> ParsePow() {
    LORADB_ASSIGN_OR_RETURN(NodePtr left, ParseUnary(true));
    while (IsOp("**")) {
      const Token& op = Next();
      LORADB_ASSIGN_OR_RETURN(NodePtr right, ParseUnary(true));
      LORADB_ASSIGN_OR_RETURN(left, Binary(std::move(left), op.text, std::move(right), op.line));
    }
    return left;
  }

  absl::StatusOr<NodePtr> ParseUnary(bool with_filter) {
    LORADB_RETURN_IF_ERROR(Enter());
    NodePtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token& op = Next();
      node = Make(op.text == "-" ? N::kNeg : N::kPos, op.line);
      LORADB_ASSIGN_OR_RETURN(NodePtr operand, ParseUnary(false));
      node->kids.push_back(std::move(operand));
    } else {
      LORADB_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    LORADB_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      LORADB_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    --depth_;
    return node;
  }

  absl::StatusOr<NodePtr> ParsePrimary() {
    const Token& tok = Peek();
    switch (tok.kind) {
      case Tok::kName: {
        Next();
        NodePtr lit = Make(N::kLiteral, tok.line);
        if (tok.text == "true" || tok.text == "True") {
          lit->literal = Value::Bool(true);
        } else if (tok.text == "false" || tok.text == "False") {
          lit->literal = Value::Bool(false);
        } else if (tok.text == "none" || tok.text == "None") {
          lit->literal = Value::None();
        } else {
          return Make(N::kName, tok.line, tok.text);
        }
        return lit;
      }
      case Tok::kString: {
        std::string s;
        const int line = tok.line;
        while (Peek().kind == Tok::kString) s += Next().text;
        NodePtr lit = Make(N::kLiteral, line);
        lit->literal = Value::String(std::move(s));
        return lit;
      }
      case Tok::kInt: {
        Next();
        int64_t v = 0;
        NodePtr lit = Make(N::kLiteral, tok.line);
        if (!absl::SimpleAtoi(tok.text, &v)) {
          return SyntaxError(tok.line, absl::StrCat("integer literal ", tok.text, " is too large"));
        }
        lit->literal = Value::Int(v);
        return lit;
      }
      case Tok::kFloat: {
        Next();
        double v = 0;
        (void)absl::SimpleAtod(tok.text, &v);
        NodePtr lit = Make(N::kLiteral, tok.line);
        lit->literal = Value::Float(v);
        return lit;
      }
      case Tok::kOp:
        if (tok.text == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return Make(N::kTuple, tok.line);
          }
          LORADB_ASSIGN_OR_RETURN(NodePtr first, ParseExpression());
          if (IsOp(")")) {
            Next();
            return first;
          }
          NodePtr tuple = Make(N::kTuple, tok.line);
          tuple->kids.push_back(std::move(first));
          while (IsOp(",")) {
            Next();
            if (IsOp(")")) break;
            LORADB_ASSIGN_OR_RETURN(NodePtr e, ParseExpression());
            tuple->kids.push_back(std::move(e));
          }
          LORADB_RETURN_IF_ERROR(Expect(")"));
          return tuple;
        }
        if (tok.text == "[") {
          Next();
          NodePtr list = Make(N::kList, tok.line);
          while (!IsOp("]")) {
            LORADB_ASSIGN_OR_RETURN(NodePtr e, ParseExpression());
            list->kids.push_back(std::move(e));
            if (!IsOp(",")) break;
            Next();
          }
          LORADB_RETURN_IF_ERROR(Expect("]"));
          return list;
        }
        if (tok.text == "{") {
          Next();
          NodePtr dict = Make(N::kDict, tok.line);
          while (!IsOp("}")) {
            LORADB_ASSIGN_OR_RETURN(NodePtr k, ParseExpression());
            LORADB_RETURN_IF_ERROR(Expect(":"));
            LORADB_ASSIGN_OR_RETURN(NodePtr v, ParseExpression());
            dict->kids.push_back(std::move(k));
            dict->kids.push_back(std::move(v));
            if (!IsOp(",")) break;
            Next();
          }
          LORADB_RETURN_IF_ERROR(Expect("}"));
          return dict;
        }
        break;
      default:
        break;
    }
    return SyntaxError(tok.line, absl::StrCat("unexpected '", Describe(), "'"));
  }

  // Call arguments after '(' into node (positional then keyword, names for the keyword ones).
  absl::Status ParseArgs(Node* node) {
    LORADB_RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      if (IsOp("*") || IsOp("**")) {
        return SyntaxError(Peek().line, "*args and **kwargs in calls are not supported");
      }
      if (Peek().kind == Tok::kName && IsOp("=", 1)) {
        node->names.push_back(Next().text);
        Next();
        LORADB_ASSIGN_OR_RETURN(NodePtr v, ParseExpression());
        node->kids.push_back(std::move(v));
      } else {
        if (!node->names.empty()) {
          return SyntaxError(Peek().line, "a positional argument after a keyword argument");
        }
        LORADB_ASSIGN_OR_RETURN(NodePtr v, ParseExpression());
        node->kids.push_back(std::move(v));
        ++node->positional;
      }
      if (!IsOp(",")) break;
      Next();
    }
    return Expect(")");
  }

  absl::StatusOr<NodePtr> ParsePostfix(NodePtr node) {
    while (true) {
      if (IsOp(".")) {
        const int line = Next().line;
        if (Peek().kind == Tok::kInt) {
          NodePtr item = Make(N::kGetItem, line);
          NodePtr key = Make(N::kLiteral, line);
          key->literal = Value::Int(std::stoll(Next().text));
          item->kids.push_back(std::move(node));
          item->kids.push_back(std::move(key));
          node = std::move(item);
          continue;
        }
        LORADB_ASSIGN_OR_RETURN(std::string attr, ExpectName());
        NodePtr get = Make(N::kGetAttr, line, attr);
        get->kids.push_back(std::move(node));
        node = std::move(get);
      } else if (IsOp("[")) {
        const int line = Next().line;
        NodePtr parts[3];
        bool slice = false;
        int part = 0;
        while (!IsOp("]")) {
          if (IsOp(":")) {
            Next();
            slice = true;
            if (++part > 2) return SyntaxError(line, "a slice has at most three parts");
            continue;
          }
          LORADB_ASSIGN_OR_RETURN(parts[part], ParseExpression());
          if (!IsOp(":") && !IsOp("]")) {
            return SyntaxError(Peek().line, "expected ':' or ']' in a subscript");
          }
        }
        Next();
        if (slice) {
          NodePtr s = Make(N::kSlice, line);
          s->kids.push_back(std::move(node));
          for (auto& p : parts) s->kids.push_back(std::move(p));
          node = std::move(s);
        } else {
          if (parts[0] == nullptr) return SyntaxError(line, "an empty subscript");
          NodePtr item = Make(N::kGetItem, line);
          item->kids.push_back(std::move(node));
          item->kids.push_back(std::move(parts[0]));
          node = std::move(item);
        }
      } else if (IsOp("(")) {
        NodePtr call = Make(N::kCall, Peek().line);
        call->kids.push_back(std::move(node));
        LORADB_RETURN_IF_ERROR(ParseArgs(call.get()));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  // `name(args)` of a filter; kids[0] is the operand (null for filter blocks / set blocks).
  absl::StatusOr<NodePtr> ParseFilterCall(NodePtr operand) {
    const int line = Peek().line;
    LORADB_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(".")) {
      Next();
      LORADB_ASSIGN_OR_RETURN(std::string part, ExpectName());
      name += "." + part;
    }
    if (!IsFilter(name)) {
      NoteUnknown(line, absl::StrCat("no filter named '", name,
                                     "' (not supported by loradb's template engine)"));
    }
    NodePtr node = Make(N::kFilter, line, name);
    node->kids.push_back(std::move(operand));
    if (IsOp("(")) LORADB_RETURN_IF_ERROR(ParseArgs(node.get()));
    return node;
  }

  absl::StatusOr<NodePtr> ParseFilterExpr(NodePtr node) {
    while (true) {
      if (IsOp("|")) {
        Next();
        LORADB_ASSIGN_OR_RETURN(node, ParseFilterCall(std::move(node)));
      } else if (IsName("is")) {
        const int line = Next().line;
        bool negated = false;
        if (IsName("not")) {
          Next();
          negated = true;
        }
        LORADB_ASSIGN_OR_RETURN(std::string name, ExpectName());
        if (!IsTest(name)) {
          NoteUnknown(line, absl::StrCat("no test named '", name,
                                         "' (not supported by loradb's template engine)"));
        }
        NodePtr test = Make(N::kTest, line, name);
        test->flag = negated;
        test->kids.push_back(std::move(node));
        if (IsOp("(")) {
          LORADB_RETURN_IF_ERROR(ParseArgs(test.get()));
        } else if ((Peek().kind == Tok::kName && !IsName("else") && !IsName("or") &&
                    !IsName("and") && !IsName("if") && !IsName("is") && !IsName("in") &&
                    !IsName("not")) ||
                   Peek().kind == Tok::kString || Peek().kind == Tok::kInt ||
                   Peek().kind == Tok::kFloat || IsOp("[") || IsOp("{") || IsOp("-")) {
          LORADB_ASSIGN_OR_RETURN(NodePtr arg, ParseUnary(false));
          test->kids.push_back(std::move(arg));
          test->positional = 1;
        }
        node = std::move(test);
      } else if (IsOp("(")) {
        NodePtr call = Make(N::kCall, Peek().line);
        call->kids.push_back(std::move(node));
        LORADB_RETURN_IF_ERROR(ParseArgs(call.get()));
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  struct Unknown {
    int line;
    std::string what;
    bool soft;
  };
  void NoteUnknown(int line, std::string what) {
    unknown_.push_back({line, std::move(what), soft_ > 0});
  }
  // Parses with unknown filters and tests allowed (an if statement's or a conditional
  // expression's scope, within the same frame).
  absl::StatusOr<NodePtr> Soft(const std::function<absl::StatusOr<NodePtr>()>& f) {
    ++soft_;
    absl::StatusOr<NodePtr> r = f();
    --soft_;
    return r;
  }
  // Parses a new frame's body (loop, macro, call, filter block): not soft.
  absl::StatusOr<NodePtr> Hard(const std::function<absl::StatusOr<NodePtr>()>& f) {
    const int saved = soft_;
    soft_ = 0;
    absl::StatusOr<NodePtr> r = f();
    soft_ = saved;
    return r;
  }

  std::vector<Unknown> unknown_;
  int soft_ = 0;
  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loops_ = 0;
  const Limits& limits_;
};

Template::Template() = default;
Template::~Template() = default;

absl::StatusOr<std::shared_ptr<const Template>> Template::Parse(absl::string_view source,
                                                                Limits limits) {
  if (source.size() > limits.max_template_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "template of ", source.size(), " bytes is over the limit of ", limits.max_template_bytes));
  }
  if (absl::Status s = ValidateUtf8(source); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("template: ", s.message()));
  }
  // As jinja2 reads a template: newlines normalized to "\n", one trailing newline dropped.
  std::string text;
  text.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      text.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      text.push_back(source[i]);
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  Lexer lexer(std::move(text));
  LORADB_ASSIGN_OR_RETURN(std::vector<Token> tokens, lexer.Run());
  Parser parser(std::move(tokens), limits);
  std::shared_ptr<Template> t(new Template());
  t->limits_ = limits;
  LORADB_ASSIGN_OR_RETURN(t->root_, parser.ParseTemplate());
  return std::shared_ptr<const Template>(std::move(t));
}

absl::StatusOr<std::string> Template::Render(
    const std::vector<std::pair<std::string, Value>>& vars) const {
  Interpreter interp(limits_);
  for (const auto& [name, value] : vars) interp.SetGlobal(name, value);
  return interp.Run(*root_);
}

}  // namespace loradb::text::jinja
