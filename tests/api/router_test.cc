#include "api/http/router.h"

#include <gtest/gtest.h>

namespace loradb::http {
namespace {

Handler Echo() {
  return [](const Call& c) -> absl::StatusOr<Reply> {
    nlohmann::json params = nlohmann::json::object();
    for (const auto& [k, v] : c.params) params[k] = v;
    return Reply::Json({{"route", c.route}, {"params", params}});
  };
}

Router MakeTestRouter() {
  Router r;
  EXPECT_TRUE(r.Add(MakeRoute("GET", "/v1/policies", Echo(), {})).ok());
  EXPECT_TRUE(r.Add(MakeRoute("GET", "/v1/policies/{policy}", Echo(), {})).ok());
  EXPECT_TRUE(r.Add(MakeRoute("PUT", "/v1/policies/{policy}/aliases/{alias}", Echo(), {})).ok());
  EXPECT_TRUE(r.Add(MakeRoute("GET", "/v1/revisions/{id}", Echo(), {}, {"id"})).ok());
  return r;
}

TEST(RouterTest, MatchesLiteralAndParameterSegments) {
  Router r = MakeTestRouter();
  absl::StatusOr<Match> m = r.Resolve("GET", "/v1/policies/acme%2Fsupport?limit=3");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->route->pattern, "/v1/policies/{policy}");
  EXPECT_EQ(m->params.at("policy"), "acme/support");
  m = r.Resolve("PUT", "/v1/policies/p/aliases/serving");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->params.at("alias"), "serving");
  m = r.Resolve("HEAD", "/v1/policies");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->route->pattern, "/v1/policies");
}

TEST(RouterTest, UnknownPathIsNotFoundAndWrongMethodIsDistinct) {
  Router r = MakeTestRouter();
  EXPECT_EQ(r.Resolve("GET", "/v1/nothing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.Resolve("GET", "/v1/policies/").status().code(), absl::StatusCode::kNotFound);
  absl::Status st = r.Resolve("DELETE", "/v1/policies/x").status();
  EXPECT_TRUE(IsMethodNotAllowed(st)) << st;
  EXPECT_FALSE(IsMethodNotAllowed(r.Resolve("GET", "/nope").status()));
}

TEST(RouterTest, RejectsTraversalBadEscapesAndInvalidUtf8InSegments) {
  Router r = MakeTestRouter();
  for (const char* target :
       {"/v1/policies/..", "/v1/policies/%2e%2E", "/v1/policies/.", "/v1/policies/%zz",
        "/v1/policies/%4", "/v1/policies/a%00b", "/v1/policies/%ff%fe", "/v1/policies/%c0%af"}) {
    absl::Status st = r.Resolve("GET", target).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << target << ": " << st;
  }
  EXPECT_EQ(r.Resolve("GET", "relative").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RouterTest, AddRejectsDuplicatesAndBadRoutes) {
  Router r = MakeTestRouter();
  EXPECT_EQ(r.Add(MakeRoute("GET", "/v1/policies", Echo(), {})).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.Add(MakeRoute("TRACE", "/x", Echo(), {})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Add(MakeRoute("GET", "x", Echo(), {})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Add(MakeRoute("GET", "/y", nullptr, {})).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RouterTest, MayBlockMatchesOnlyRoutesMarkedBlocking) {
  Router r = MakeTestRouter();
  EXPECT_FALSE(r.MayBlock("/v1/revisions/3/tensors"));  // no blocking route yet
  Route tensors = MakeRoute("GET", "/v1/revisions/{id}/tensors", Echo(), {}, {"id"});
  tensors.blocking = true;
  ASSERT_TRUE(r.Add(std::move(tensors)).ok());
  EXPECT_TRUE(r.MayBlock("/v1/revisions/3/tensors"));
  EXPECT_TRUE(r.MayBlock("/v1/revisions/3/tensors?x=1"));
  EXPECT_TRUE(r.MayBlock("/v1/revisions/%33/tensors"));  // not decoded: the handler checks
  EXPECT_FALSE(r.MayBlock("/v1/revisions//tensors"));    // an empty parameter matches nothing
  EXPECT_FALSE(r.MayBlock("/v1/revisions/3"));
  EXPECT_FALSE(r.MayBlock("/v1/revisions/3/tensors/x"));
  EXPECT_FALSE(r.MayBlock("/v1/revisions/3/tier"));
  EXPECT_FALSE(r.MayBlock("no-slash"));
  EXPECT_FALSE(r.MayBlock(""));
  // Only reads can be blocking; the refused route is not added.
  Route put = MakeRoute("PUT", "/v1/slow/{x}", Echo(), {});
  put.blocking = true;
  EXPECT_TRUE(absl::IsInvalidArgument(r.Add(std::move(put))));
  EXPECT_FALSE(r.MayBlock("/v1/slow/1"));
  EXPECT_TRUE(absl::IsNotFound(r.Resolve("PUT", "/v1/slow/1").status()));
}

TEST(RouterTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_FALSE(IsValidUtf8("\xc3"));                                 // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));                             // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));                         // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));                     // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\x80"));                         // overlong 3-byte
}

TEST(StatusMappingTest, EveryCodeMapsToItsHttpStatus) {
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kAlreadyExists), 409);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kFailedPrecondition), 409);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(HttpStatusFor(absl::StatusCode::kDataLoss), 500);
}

TEST(StatusMappingTest, ErrorReplyShapeAndRetryAfter) {
  Reply r = ErrorReply(absl::NotFoundError("no revision 7"));
  EXPECT_EQ(r.status, 404);
  nlohmann::json j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["error"]["code"], "not_found");
  EXPECT_EQ(j["error"]["message"], "no revision 7");

  absl::Status busy = absl::ResourceExhaustedError("load queue full");
  busy.SetPayload("type.loradb.dev/retry_after_ms", absl::Cord("2500"));
  r = ErrorReply(busy);
  EXPECT_EQ(r.status, 429);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].first, "Retry-After");
  EXPECT_EQ(r.headers[0].second, "3");
  r = ErrorReply(absl::ResourceExhaustedError("no hint"));
  EXPECT_EQ(r.headers.at(0).second, "1");
  // Invalid UTF-8 in a message never throws; it is replaced.
  r = ErrorReply(absl::InvalidArgumentError("bad \xff name"));
  EXPECT_TRUE(IsValidUtf8(r.body));
}

TEST(JsonBodyTest, RejectsMalformedUnknownAndWrongTypes) {
  Call c;
  c.body = "{\"name\": \"a\", \"n\": 3}";
  absl::StatusOr<nlohmann::json> j = ParseJsonObject(c, {"name", "n"});
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(**GetString(*j, "name", true), "a");
  EXPECT_EQ(**GetUint(*j, "n", true), 3u);
  EXPECT_FALSE(GetString(*j, "n", true).ok());
  EXPECT_FALSE(GetUint(*j, "name", true).ok());
  EXPECT_FALSE(GetBool(*j, "missing", true).ok());
  EXPECT_FALSE(GetBool(*j, "missing", false)->has_value());

  j = ParseJsonObject(c, {"name"});
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("unknown field 'n'"), absl::string_view::npos);
  for (const char* body : {"{", "[1,2]", "\"s\"", "{\"name\": \"\xff\"}", "nul"}) {
    c.body = body;
    EXPECT_EQ(ParseJsonObject(c, {"name"}).status().code(), absl::StatusCode::kInvalidArgument)
        << body;
  }
  c.body = "{\"n\": -1}";
  EXPECT_FALSE(GetUint(*ParseJsonObject(c, {"n"}), "n", true).ok());
  c.body = "";
  EXPECT_TRUE(ParseJsonObject(c, {})->empty());
}

TEST(ParseUintTest, StrictDecimal) {
  EXPECT_EQ(*ParseUint("42", "id"), 42u);
  EXPECT_EQ(*ParseUint("18446744073709551615", "id"), 18446744073709551615u);
  for (const char* bad : {"", "-1", "+1", " 1", "1a", "18446744073709551616", "0x10"}) {
    EXPECT_FALSE(ParseUint(bad, "id").ok()) << bad;
  }
}

TEST(OpenApiTest, DescribesEveryRouteWithPathParametersAndSecurity) {
  Router r = MakeTestRouter();
  nlohmann::json doc = r.OpenApi("t", "1");
  EXPECT_EQ(doc["openapi"], "3.1.0");
  EXPECT_EQ(doc["paths"].size(), 4u);
  const auto& rev = doc["paths"]["/v1/revisions/{id}"]["get"];
  EXPECT_EQ(rev["parameters"][0]["name"], "id");
  EXPECT_EQ(rev["parameters"][0]["schema"]["type"], "integer");
  EXPECT_FALSE(rev.contains("security"));
  const auto& put = doc["paths"]["/v1/policies/{policy}/aliases/{alias}"]["put"];
  EXPECT_EQ(put["parameters"].size(), 2u);
  EXPECT_TRUE(put.contains("security"));
  EXPECT_TRUE(put["responses"].contains("default"));
}

}  // namespace
}  // namespace loradb::http
