// text/jinja/template.h and text/chat_template.h: jinja2's semantics on hand-written cases
// (whitespace control, scoping, loops, macros, filters, tests, methods, Python's str() and
// tojson), and every error path: syntax errors with their line, unsupported constructs refused
// by name, runtime errors, raise_exception, the sandbox's refusal of mutating methods, and the
// limits that stop a hostile template. Agreement with transformers on real templates is
// tests/python/chat_template_oracle.py.
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"
#include "text/jinja/template.h"

namespace loradb::text {
namespace {

using jinja::Limits;
using jinja::Template;
using jinja::Value;
using ::loradb::testing::TempDir;

absl::StatusOr<std::string> Render(const std::string& source, const std::string& messages = "[]",
                                   Limits limits = {}) {
  auto t = Template::Parse(source, limits);
  if (!t.ok()) return t.status();
  auto m = jinja::ParseJson(messages, "messages");
  if (!m.ok()) return m.status();
  return (*t)->Render({{"messages", *m}, {"bos_token", Value::String("<s>")}});
}

std::string Ok(const std::string& source, const std::string& messages = "[]") {
  auto r = Render(source, messages);
  EXPECT_TRUE(r.ok()) << source << ": " << r.status();
  return r.ok() ? *r : "<error>";
}

TEST(ChatTemplateTest, WhitespaceControl) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(Ok("{% if true %}\n  a\n  {% endif %}\nb"), "  a\nb");
  EXPECT_EQ(Ok("x  {%- if true -%}  y  {%- endif %}"), "xy");
  EXPECT_EQ(Ok("a\n  {{ 'v' }}\n"), "a\n  v");  // variable tags keep indentation; one final \n goes
  EXPECT_EQ(Ok("a {#- c -#} b"), "ab");
  EXPECT_EQ(Ok("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
  EXPECT_EQ(Ok("  {%+ if true %}k{% endif %}"), "  k");
  EXPECT_EQ(Ok("l1\r\nl2"), "l1\nl2");
}

TEST(ChatTemplateTest, PythonValues) {
  EXPECT_EQ(Ok("{{ none }} {{ true }} {{ 1.0 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }}"),
            "None True 1.0 1e+20 0.30000000000000004 2.5");
  EXPECT_EQ(Ok("{{ [1, 'a', {'k': \"it's\"}] }} {{ (1,) }} {{ 'x\\n' | string }}"),
            "[1, 'a', {'k': \"it's\"}] (1,) x\n");
  EXPECT_EQ(Ok("{{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 'ab' * 3 }} {{ 'a' ~ 1 ~ none }}"),
            "-4 2 1024 ababab a1None");
  EXPECT_EQ(Ok("{{ {'b': [1, 2.5, none, true], 'a': 'é\"'} | tojson }}"),
            R"({"b": [1, 2.5, null, true], "a": "é\""})");
  EXPECT_EQ(Ok("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(Ok("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=(',', ':')) }}"),
            R"({"a":2,"b":1})");
}

TEST(ChatTemplateTest, ScopesLoopsAndNamespaces) {
  EXPECT_EQ(Ok("{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }},"
               "{% endfor %}{{ x }}"),
            "12,12,12,1");
  EXPECT_EQ(Ok("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
               "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(Ok("{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{{ loop.index }}{{ loop.revindex0 }}"
               "{% if loop.last %}!{% endif %}{% endfor %}"),
            "311720!");
  EXPECT_EQ(Ok("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Ok("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}"),
            "2/2 4/2 ");
  EXPECT_EQ(Ok("{% for i in range(9) %}{% if i == 1 %}{% continue %}{% endif %}"
               "{% if i > 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "023");
  EXPECT_EQ(Ok("{% macro m(a, b='d') %}{{ a }}{{ b }}{% if caller is defined %}{{ caller() }}"
               "{% endif %}{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}{% call m(4) %}c{% endcall %}"),
            "1d234dc");
  EXPECT_EQ(Ok("{% set t %}in{{ 1 }}{% endset %}{{ t }}{% filter upper %}up{% endfilter %}"),
            "in1UP");
}

TEST(ChatTemplateTest, FiltersTestsAndMethods) {
  const std::string m = R"([{"role": "system", "content": " S "}, {"role": "user", "content": "u"},
                            {"role": "assistant", "content": "<think>r</think>\n\na"}])";
  EXPECT_EQ(Ok("{{ messages | selectattr('role', 'equalto', 'user') | list | length }}", m), "1");
  EXPECT_EQ(Ok("{{ messages | map(attribute='role') | join(',') }}", m), "system,user,assistant");
  EXPECT_EQ(Ok("{{ messages[0].content | trim }}|{{ messages[-1]['content'].split('</think>')[-1]"
               ".lstrip('\\n') }}",
               m),
            "S|a");
  EXPECT_EQ(Ok("{{ messages[1:] | length }} {{ messages[::-1][0].role }}", m), "2 assistant");
  EXPECT_EQ(Ok("{{ 'x' is string }} {{ messages[0] is mapping }} {{ nope is defined }} "
               "{{ none is none }} {{ 3 is divisibleby 3 }} {{ 'a' in 'cat' }} {{ 2 not in [1] }}",
               m),
            "True True False True True True True");
  EXPECT_EQ(
      Ok("{{ 'Hello World'.lower().replace('o', '0') }} {{ 'a b'.title() }} "
         "{{ 'ab'.startswith(('x', 'a')) }} {{ '{} {}'.format(1, 'z') }} {{ '%s-%d' % ('a', 2) }}"),
      "hell0 w0rld A B True 1 z a-2");
  EXPECT_EQ(Ok("{{ {'a': 1}.get('b', 'dflt') }} {% for k, v in {'x': 1}.items() %}{{ k }}{{ v }}"
               "{% endfor %} {{ undefined_name | default('d') }} {{ [3, 1, 2] | sort | first }}"),
            "dflt x1 d 1");
  // A generator (map, select, ...) is true even when empty, as in jinja2.
  EXPECT_EQ(Ok("{{ 'yes' if [] | select else 'no' }}"), "yes");
}

TEST(ChatTemplateTest, ErrorsAreStatusesWithLines) {
  struct Case {
    const char* source;
    absl::StatusCode code;
    const char* expect;
  };
  static const std::string kDeep = std::string(300, '(') + "1" + std::string(300, ')');
  const std::vector<Case> cases = {
      {"{% if x %}", absl::StatusCode::kInvalidArgument, "endif"},
      {"a\n{{ 1 + }}", absl::StatusCode::kInvalidArgument, "line 2"},
      {"{% include 'x' %}", absl::StatusCode::kInvalidArgument, "'include' is not supported"},
      {"{{ x | frobnicate }}", absl::StatusCode::kInvalidArgument, "frobnicate"},
      {"{% for x in y recursive %}{% endfor %}", absl::StatusCode::kInvalidArgument, "recursive"},
      {"{% break %}", absl::StatusCode::kInvalidArgument, "outside a loop"},
      {"{{ 'abc", absl::StatusCode::kInvalidArgument, "unterminated"},
      {"{{ raise_exception('bad roles') }}", absl::StatusCode::kInvalidArgument, "bad roles"},
      {"{{ 1 + 'a' }}", absl::StatusCode::kInvalidArgument, "unsupported operand"},
      {"{{ nope.attr }}", absl::StatusCode::kInvalidArgument, "'nope' is undefined"},
      {"{{ nope() }}", absl::StatusCode::kInvalidArgument, "'nope' is undefined"},
      {"{{ [1].append(2) }}", absl::StatusCode::kInvalidArgument, "unsafe"},
      {"{{ {}.update({}) }}", absl::StatusCode::kInvalidArgument, "unsafe"},
      {"{% set x = 1 %}{% set x.a = 2 %}", absl::StatusCode::kInvalidArgument, "namespace"},
      {"{{ 1 // 0 }}", absl::StatusCode::kInvalidArgument, "zero"},
      {"{{ nope | tojson }}", absl::StatusCode::kInvalidArgument, "not JSON serializable"},
      {"{% if false %}{{ x | frobnicate }}{% endif %}{{ 1 | frobnicate if true }}",
       absl::StatusCode::kInvalidArgument, "frobnicate"},
      {"{% for i in range(100000000) %}{% endfor %}", absl::StatusCode::kResourceExhausted,
       "limit"},
      {"{% for i in range(400) %}{% for j in range(400) %}{% endfor %}{% endfor %}",
       absl::StatusCode::kResourceExhausted, "loop iterations"},
      {"{{ 'x' * 100000000 }}", absl::StatusCode::kResourceExhausted, "limit"},
      {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", absl::StatusCode::kResourceExhausted,
       "nested"},
      {"{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
       "{% endfor %}",
       absl::StatusCode::kResourceExhausted, "limit"},
      {kDeep.c_str(), absl::StatusCode::kResourceExhausted, "nesting"},
  };
  Limits limits;
  limits.max_loop_iterations = 100000;
  for (const Case& c : cases) {
    const std::string source = std::string(c.source).find('(') == 0
                                   ? "{{ " + std::string(c.source) + " }}"
                                   : std::string(c.source);
    auto r = Render(source, "[]", limits);
    ASSERT_FALSE(r.ok()) << c.source << " rendered " << *r;
    EXPECT_EQ(r.status().code(), c.code) << c.source << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.expect), absl::string_view::npos)
        << c.source << ": " << r.status();
  }
  // An unknown filter in a branch not taken renders, as in jinja2.
  EXPECT_EQ(Ok("{% if false %}{{ x | frobnicate }}{% endif %}ok"), "ok");
  Limits small;
  small.max_template_bytes = 10;
  EXPECT_EQ(Template::Parse("0123456789ab", small).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Template::Parse("\xC3(", {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, LoadsModelDirectories) {
  TempDir dir;
  {
    std::ofstream(dir.file("tokenizer_config.json"))
        << R"({"bos_token": {"content": "<B>", "__type": "AddedToken"}, "eos_token": "<E>",
               "chat_template": [{"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"},
                                 {"name": "tool_use", "template": "T{{ tools | length }}"}]})";
  }
  auto chat = ChatTemplate::Load(dir.path());
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ((*chat)->names(), (std::vector<std::string>{"default", "tool_use"}));
  EXPECT_EQ((*chat)->special_tokens().size(), 2u);
  ChatTemplate::Request r;
  r.messages_json = R"([{"role": "user", "content": "hi", "name": null}])";
  EXPECT_EQ(*(*chat)->Render(r), "<B>hi<E>");
  r.tools_json = R"([{"type": "function"}])";
  EXPECT_EQ(*(*chat)->Render(r), "T1");
  r.template_name = "nope";
  EXPECT_EQ((*chat)->Render(r).status().code(), absl::StatusCode::kInvalidArgument);
  // chat_template.jinja wins over tokenizer_config.json's template.
  { std::ofstream(dir.file("chat_template.jinja")) << "J{{ messages | length }}\n"; }
  auto jinja = ChatTemplate::Load(dir.path());
  ASSERT_TRUE(jinja.ok()) << jinja.status();
  ChatTemplate::Request plain;
  plain.messages_json = "[{\"role\": \"user\", \"content\": \"x\"}]";
  EXPECT_EQ(*(*jinja)->Render(plain), "J1");
  // Bad requests.
  for (const char* bad : {"{", "{}", "[1]"}) {
    plain.messages_json = bad;
    EXPECT_EQ((*jinja)->Render(plain).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  plain.messages_json = "[]";
  plain.extra_json = R"({"messages": []})";
  EXPECT_EQ((*jinja)->Render(plain).status().code(), absl::StatusCode::kInvalidArgument);
  TempDir empty;
  EXPECT_EQ(ChatTemplate::Load(empty.path()).status().code(), absl::StatusCode::kNotFound);
}

TEST(ChatTemplateTest, RendersConcurrently) {
  // One parsed template serves several threads at once (each render has its own scopes and
  // namespaces); every thread gets the serial result.
  auto chat = ChatTemplate::Load(testing::TestData("chat_templates/qwen3.jinja"));
  ASSERT_TRUE(chat.ok()) << chat.status();
  ChatTemplate::Request r;
  r.messages_json = R"([{"role": "user", "content": "q"}, {"role": "assistant",
                        "content": "<think>t</think>a"}, {"role": "user", "content": "q2"}])";
  r.add_generation_prompt = true;
  const std::string expected = *(*chat)->Render(r);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto got = (*chat)->Render(r);
        if (!got.ok() || *got != expected) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(ChatTemplateTest, ReasoningIsAliasedAndNullsDropped) {
  auto chat = ChatTemplate::FromSource("{% for m in messages %}{{ m | tojson }}{% endfor %}", {});
  ASSERT_TRUE(chat.ok());
  ChatTemplate::Request r;
  r.messages_json = R"([{"role": "assistant", "content": "a", "reasoning": "r", "x": null}])";
  EXPECT_EQ(*(*chat)->Render(r),
            R"({"thinking": "r", "role": "assistant", "content": "a", "reasoning": "r", )"
            R"("reasoning_content": "r"})");
}

}  // namespace
}  // namespace loradb::text
