// The syntax tree of a parsed template (text/jinja/template.h), shared by the parser and the
// interpreter. Internal to text/jinja/.
#ifndef LORADB_TEXT_JINJA_AST_H_
#define LORADB_TEXT_JINJA_AST_H_

#include <memory>
#include <string>
#include <vector>

#include "text/jinja/value.h"

namespace loradb::text::jinja {

enum class N {
  // expressions
  kLiteral,
  kName,
  kList,
  kTuple,
  kDict,
  kGetAttr,
  kGetItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNeg,
  kPos,
  kNot,
  kAnd,
  kOr,
  kBinary,
  kCompare,
  kCond,
  kConcat,
  // statements
  kBody,
  kText,
  kPrint,
  kIf,
  kFor,
  kSet,
  kSetAttr,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kBreak,
  kContinue
};

struct Node {
  N kind;
  int line = 0;
  std::string name;                         // names, operators, attribute, filter / test
  Value literal;                            // kLiteral
  std::vector<std::unique_ptr<Node>> kids;  // operands, bodies, arguments
  std::vector<std::string> names;           // keyword argument names (parallel to the tail
                                            // of kids), targets, macro parameters
  size_t positional = 0;                    // kCall / kFilter / kTest: positional arg count
  bool flag = false;                        // kTest: negated; kFor: has else
};

}  // namespace loradb::text::jinja

#endif  // LORADB_TEXT_JINJA_AST_H_
