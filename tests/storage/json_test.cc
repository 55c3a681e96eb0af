// storage/util/json.h: the depth limit every JSON input passes before it is parsed.
#include "storage/util/json.h"

#include <gtest/gtest.h>

#include <string>

namespace loradb {
namespace {

std::string Nested(int depth, char open = '[', char close = ']') {
  return std::string(depth, open) + std::string(depth, close);
}

TEST(JsonTest, DepthLimitIsExact) {
  EXPECT_TRUE(CheckJsonDepth(Nested(kMaxJsonDepth), "x").ok());
  EXPECT_TRUE(ParseJson(Nested(kMaxJsonDepth), "x").ok());
  absl::Status s = CheckJsonDepth(Nested(kMaxJsonDepth + 1), "the body");
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message(), "the body nests arrays and objects deeper than 128 levels");
  auto parsed = ParseJson(Nested(kMaxJsonDepth + 1), "the body");
  EXPECT_EQ(parsed.status(), s);
  // Objects count the same as arrays, and mixed.
  std::string objects;
  for (int i = 0; i < 200; ++i) objects += R"({"a":[)";
  EXPECT_TRUE(absl::IsInvalidArgument(CheckJsonDepth(objects, "x")));
  EXPECT_TRUE(CheckJsonDepth(Nested(3), "x", 3).ok());
  EXPECT_FALSE(CheckJsonDepth(Nested(4), "x", 3).ok());
}

TEST(JsonTest, BracketsInsideStringsDoNotCount) {
  const std::string in_string =
      "[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\\\\\", \"]]]\"]";
  EXPECT_TRUE(CheckJsonDepth(in_string, "x", 1).ok());
  auto j = ParseJson(in_string, "x", 1);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)[1], "]]]");
  // After an escaped backslash the quote closes the string: the brackets after it count.
  EXPECT_FALSE(CheckJsonDepth(R"(["\\", [[]]])", "x", 2).ok());
}

TEST(JsonTest, DeepInputIsRefusedWithoutRecursion) {
  // 10^6 levels: a recursive parser or dump() would overflow the stack here.
  const std::string deep = Nested(1000000);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseJson(deep, "x").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseJson<nlohmann::ordered_json>(deep, "x").status()));
}

TEST(JsonTest, SyntaxErrorsNameTheInputAndByte) {
  auto r = ParseJson(R"({"a": tru})", "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("config.json is not valid JSON (syntax error at byte"),
            absl::string_view::npos)
      << r.status();
  EXPECT_FALSE(ParseJson("", "x").ok());
  EXPECT_FALSE(ParseJson("{} {}", "x").ok());
  EXPECT_FALSE(ParseJson("\"\xff\"", "x").ok());  // not UTF-8
  auto ok = ParseJson<nlohmann::ordered_json>(R"({"b": 1, "a": [true, null]})", "x");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->begin().key(), "b");
}

}  // namespace
}  // namespace loradb
