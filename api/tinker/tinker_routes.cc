#include "api/tinker/tinker_routes.h"

#include <zstd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "api/http/router.h"
#include "api/tinker/tinker_wire.pb.h"
#include "compute/serving/completion_service.h"
#include "compute/training/training_service.h"
#include "storage/util/status_macros.h"

namespace loradb::tinker {
namespace {

using http::Call;
using http::Reply;
using nlohmann::json;

constexpr char kProtobufType[] = "application/x-protobuf";
// Finished sampling futures kept for retrieve_future; older ones are dropped first.
constexpr size_t kMaxFinishedSamples = 4096;

// ---- errors: the endpoint's one error shape, with statuses the SDK does not retry for the
// caller's mistakes (it retries 408, 409, 429 and 5xx).
Reply ErrorOf(const absl::Status& s) {
  int status = 500;
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kUnimplemented:
      status = 400;
      break;
    case absl::StatusCode::kNotFound:
      status = 404;
      break;
    case absl::StatusCode::kResourceExhausted:
      status = 429;
      break;
    case absl::StatusCode::kUnauthenticated:
      status = 401;
      break;
    case absl::StatusCode::kPermissionDenied:
      status = 403;
      break;
    default:
      break;
  }
  return http::ErrorReply(status, http::ErrorCodeFor(s.code()), std::string(s.message()));
}

// ---- JSON bodies: the SDK's pydantic models dumped with exclude_none, so an absent field and a
// null one mean the same.
absl::StatusOr<json> ParseBody(const Call& call) {
  json j = json::parse(call.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("request body is not a JSON object");
  }
  return j;
}

const json* Field(const json& j, const std::string& key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<std::string>> OptString(const json& j, const std::string& key) {
  const json* v = Field(j, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string())
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be a string"));
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<std::string> ReqString(const json& j, const std::string& key) {
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> v, OptString(j, key));
  if (!v) return absl::InvalidArgumentError(absl::StrCat("'", key, "' is required"));
  return *v;
}

absl::StatusOr<std::optional<int64_t>> OptInt(const json& j, const std::string& key) {
  const json* v = Field(j, key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be an integer"));
  }
  return std::optional<int64_t>(v->get<int64_t>());
}

absl::StatusOr<std::optional<double>> OptNumber(const json& j, const std::string& key) {
  const json* v = Field(j, key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number())
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be a number"));
  return std::optional<double>(v->get<double>());
}

absl::StatusOr<double> ReqNumber(const json& j, const std::string& key) {
  LORADB_ASSIGN_OR_RETURN(std::optional<double> v, OptNumber(j, key));
  if (!v) return absl::InvalidArgumentError(absl::StrCat("'", key, "' is required"));
  return *v;
}

absl::StatusOr<std::optional<bool>> OptBool(const json& j, const std::string& key) {
  const json* v = Field(j, key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean())
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be a boolean"));
  return std::optional<bool>(v->get<bool>());
}

// user_metadata: values kept as text (strings as they are, anything else as its JSON).
absl::StatusOr<std::map<std::string, std::string>> Metadata(const json& j) {
  std::map<std::string, std::string> out;
  const json* v = Field(j, "user_metadata");
  if (v == nullptr) return out;
  if (!v->is_object()) return absl::InvalidArgumentError("'user_metadata' must be an object");
  for (const auto& [k, val] : v->items())
    out[k] = val.is_string() ? val.get<std::string>() : val.dump();
  return out;
}

std::string IsoTime(int64_t us) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::FromUnixMicros(us), absl::UTCTimeZone());
}

json CheckpointJson(const training::CheckpointInfo& c) {
  return {{"checkpoint_id", c.checkpoint_id},
          {"checkpoint_type", c.type},
          {"time", IsoTime(c.time_us)},
          {"tinker_path", c.tinker_path},
          {"size_bytes", c.size_bytes},
          {"public", false},
          {"expires_at", nullptr}};
}

json RunJson(const training::RunInfo& r) {
  json j = {{"training_run_id", r.run_id},
            {"base_model", r.base_model},
            {"model_owner", "loradb"},
            {"is_lora", true},
            {"corrupted", false},
            {"lora_rank", r.lora.rank},
            {"last_request_time", IsoTime(r.last_request_us)},
            {"last_checkpoint", nullptr},
            {"last_sampler_checkpoint", nullptr},
            {"user_metadata", r.user_metadata}};
  if (r.last_checkpoint) j["last_checkpoint"] = CheckpointJson(*r.last_checkpoint);
  if (r.last_sampler_checkpoint) {
    j["last_sampler_checkpoint"] = CheckpointJson(*r.last_sampler_checkpoint);
  }
  return j;
}

// limit/offset paging of a listing, with the SDK's cursor object.
absl::StatusOr<std::pair<size_t, size_t>> Page(const Call& call, size_t total) {
  uint64_t limit = 20, offset = 0;
  if (std::optional<std::string> v = call.Query("limit")) {
    LORADB_ASSIGN_OR_RETURN(limit, http::ParseUint(*v, "limit"));
  }
  if (std::optional<std::string> v = call.Query("offset")) {
    LORADB_ASSIGN_OR_RETURN(offset, http::ParseUint(*v, "offset"));
  }
  size_t begin = std::min<uint64_t>(offset, total);
  size_t end = std::min<uint64_t>(begin + limit, total);
  return std::make_pair(begin, end);
}

std::string Session(const std::string& run_id) { return run_id.substr(0, run_id.find(':')); }

// ---- protobuf forward_backward bodies

absl::StatusOr<std::string> Inflate(const std::string& body, size_t limit) {
  const unsigned long long size = ZSTD_getFrameContentSize(body.data(), body.size());
  if (size == ZSTD_CONTENTSIZE_ERROR) {
    return absl::InvalidArgumentError("request body is not valid zstd (Content-Encoding: zstd)");
  }
  if (size != ZSTD_CONTENTSIZE_UNKNOWN) {
    if (size > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("zstd body inflates to ", size, " bytes; at most ", limit, " accepted"));
    }
    std::string out(size, '\0');
    const size_t n = ZSTD_decompress(out.data(), out.size(), body.data(), body.size());
    if (ZSTD_isError(n) || n != size) {
      return absl::InvalidArgumentError(
          absl::StrCat("request body is not valid zstd: ",
                       ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short frame"));
    }
    return out;
  }
  // No content size in the frame: stream, bounded.
  std::unique_ptr<ZSTD_DStream, size_t (*)(ZSTD_DStream*)> ds(ZSTD_createDStream(),
                                                              ZSTD_freeDStream);
  ZSTD_initDStream(ds.get());
  std::string out;
  std::vector<char> buf(ZSTD_DStreamOutSize());
  ZSTD_inBuffer in{body.data(), body.size(), 0};
  size_t ret = 1;
  while (in.pos < in.size) {
    ZSTD_outBuffer o{buf.data(), buf.size(), 0};
    ret = ZSTD_decompressStream(ds.get(), &o, &in);
    if (ZSTD_isError(ret)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request body is not valid zstd: ", ZSTD_getErrorName(ret)));
    }
    out.append(buf.data(), o.pos);
    if (out.size() > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("zstd body inflates to more than ", limit, " bytes"));
    }
    if (o.pos == 0 && ret != 0 && in.pos == in.size) break;
  }
  if (ret != 0) return absl::InvalidArgumentError("request body is a truncated zstd frame");
  return out;
}

template <typename T>
absl::StatusOr<std::vector<T>> LittleEndianArray(const std::string& bytes,
                                                 const std::string& what) {
  if (bytes.size() % sizeof(T) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", bytes.size(), " bytes, not a multiple of ", sizeof(T)));
  }
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

absl::StatusOr<training::TensorInput> ToTensorInput(const wire::Tensor& t,
                                                    const std::string& what) {
  if (t.encoding_case() != wire::Tensor::kDense) {
    return absl::UnimplementedError(absl::StrCat(what, " is a sparse (CSR) tensor; send it dense"));
  }
  training::TensorInput out;
  out.shape.assign(t.shape().begin(), t.shape().end());
  if (t.dtype() == wire::DTYPE_FLOAT32) {
    out.dtype = training::TensorInput::DType::kFloat32;
    LORADB_ASSIGN_OR_RETURN(out.floats, LittleEndianArray<float>(t.dense(), what));
  } else if (t.dtype() == wire::DTYPE_INT64) {
    out.dtype = training::TensorInput::DType::kInt64;
    LORADB_ASSIGN_OR_RETURN(out.ints, LittleEndianArray<int64_t>(t.dense(), what));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(what, " has dtype ", wire::DType_Name(t.dtype()),
                                                   "; float32 or int64 expected"));
  }
  return out;
}

absl::StatusOr<training::ForwardBackwardRequest> DecodeForwardBackward(const Call& call,
                                                                       size_t inflate_limit) {
  if (!absl::StartsWith(call.content_type, kProtobufType)) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward_backward takes a protobuf body (Content-Type: ", kProtobufType,
                     "), not '", call.content_type, "'"));
  }
  std::string inflated;
  const std::string* body = &call.body;
  if (absl::EqualsIgnoreCase(call.content_encoding, "zstd")) {
    LORADB_ASSIGN_OR_RETURN(inflated, Inflate(call.body, inflate_limit));
    body = &inflated;
  } else if (!call.content_encoding.empty() &&
             !absl::EqualsIgnoreCase(call.content_encoding, "identity")) {
    return absl::InvalidArgumentError(absl::StrCat("Content-Encoding '", call.content_encoding,
                                                   "' is not accepted (zstd or none)"));
  }
  wire::ForwardBackwardRequest req;
  if (!req.ParseFromString(*body)) {
    return absl::InvalidArgumentError(
        "request body is not a valid ForwardBackwardRequest protobuf");
  }
  training::ForwardBackwardRequest out;
  out.run_id = req.model_id();
  out.seq_id = req.seq_id();
  out.loss_fn = req.loss_fn();
  out.forward_only = req.forward_only();
  if (req.loss_fn_config_v2_size() > 0) {
    for (const auto& [key, value] : req.loss_fn_config_v2()) {
      if (value.value_case() != wire::LossConfigValue::kNumber) {
        return absl::InvalidArgumentError(
            absl::StrCat("loss_fn_config['", key, "'] must be a number"));
      }
      out.loss_fn_config[key] = value.number();
    }
  } else {
    for (const auto& [key, value] : req.loss_fn_config()) out.loss_fn_config[key] = value;
  }
  out.data.reserve(req.data_size());
  for (int i = 0; i < req.data_size(); ++i) {
    const wire::Datum& d = req.data(i);
    training::DatumInput in;
    for (const wire::Chunk& c : d.model_input()) {
      if (c.chunk_case() != wire::Chunk::kEncodedText) {
        return absl::UnimplementedError(
            absl::StrCat("datum ", i, ": model_input has a ",
                         c.chunk_case() == wire::Chunk::kImage ? "image" : "dmel (audio)",
                         " chunk; this base takes text tokens only"));
      }
      LORADB_ASSIGN_OR_RETURN(
          std::vector<int32_t> ids,
          LittleEndianArray<int32_t>(c.encoded_text().tokens(),
                                     absl::StrCat("datum ", i, ": model_input tokens")));
      in.model_input.insert(in.model_input.end(), ids.begin(), ids.end());
    }
    for (const auto& [key, t] : d.loss_fn_inputs()) {
      LORADB_ASSIGN_OR_RETURN(
          in.loss_fn_inputs[key],
          ToTensorInput(t, absl::StrCat("datum ", i, ": loss_fn_inputs['", key, "']")));
    }
    out.data.push_back(std::move(in));
  }
  return out;
}

std::string EncodeForwardBackward(const training::ForwardBackwardResult& r) {
  wire::ForwardBackwardOutput out;
  out.set_loss_fn_output_type("ArrayRecord");
  for (const auto& [k, v] : r.metrics) (*out.mutable_metrics())[k] = v;
  wire::ArrayRecord* rec = out.add_loss_fn_outputs();
  rec->set_num_datums(static_cast<int64_t>(r.outputs.size()));
  auto field = [&](const char* name, std::vector<float> training::DatumOutput::*member) {
    wire::BatchedTensor& bt = (*rec->mutable_fields())[name];
    bt.set_dtype(wire::DTYPE_FLOAT32);
    std::string data;
    std::vector<int64_t> offsets = {0};
    for (const training::DatumOutput& o : r.outputs) {
      const std::vector<float>& v = o.*member;
      data.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
      offsets.push_back(static_cast<int64_t>(data.size()));
    }
    bt.set_data(std::move(data));
    bt.set_offsets(std::string(reinterpret_cast<const char*>(offsets.data()),
                               offsets.size() * sizeof(int64_t)));
  };
  field("logprobs", &training::DatumOutput::logprobs);
  field("elementwise_loss", &training::DatumOutput::elementwise_loss);
  return out.SerializeAsString();
}

// ---- the routes' state

struct SamplingSession {
  std::string model_ref;   // what the completion service samples: "" (base) or a revision id
  std::string model_path;  // the sampler path it was opened on; empty for the base
};

struct SampleFuture {
  bool done = false;
  absl::Status error;
  std::string payload;  // SampleResponse protobuf
};

struct State {
  std::shared_ptr<Store> store;
  TinkerRoutesOptions options;
  std::vector<int64_t> eos_ids;  // the model's EOS: the default stop tokens
  std::string id_prefix;

  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, SamplingSession> sampling_sessions;  // guarded by mu
  std::map<std::string, SampleFuture> samples;               // guarded by mu
  std::deque<std::string> finished_samples;                  // guarded by mu
  uint64_t next_sample = 0;                                  // guarded by mu
  // save_weights_for_sampler calls that asked for a sampling session: future id -> session id.
  std::map<std::string, std::string> sampler_sessions_of;  // guarded by mu

  // Declared last so that they stop (and run their last callbacks) while the rest is alive.
  std::unique_ptr<training::TrainingService> training;
  std::unique_ptr<serving::CompletionService> sampler;

  ~State() {
    sampler.reset();
    training.reset();
  }
};

absl::StatusOr<std::vector<int64_t>> ReadEosIds(const std::string& model_dir) {
  std::ifstream in(model_dir + "/config.json");
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", model_dir, "/config.json"));
  json j = json::parse(in, nullptr, false);
  std::vector<int64_t> out;
  if (j.is_discarded() || !j.is_object()) return out;
  auto it = j.find("eos_token_id");
  if (it == j.end()) return out;
  if (it->is_number_integer()) out.push_back(it->get<int64_t>());
  if (it->is_array()) {
    for (const json& v : *it) {
      if (v.is_number_integer()) out.push_back(v.get<int64_t>());
    }
  }
  return out;
}

json FutureJson(const training::Submitted& s) {
  return {{"request_id", s.request_id}, {"model_id", s.run_id}};
}

absl::StatusOr<Reply> FutureReply(absl::StatusOr<training::Submitted> s) {
  if (!s.ok()) return s.status();
  return Reply::Json(FutureJson(*s));
}

// The finished future's typed result, as the SDK parses it.
Reply ResultReply(State* st, const training::FutureStatus& f) {
  struct Visitor {
    State* st;
    const training::FutureStatus& f;
    Reply operator()(const training::CreateRunResult& r) const {
      return Reply::Json({{"model_id", r.run_id}, {"type", "create_model"}});
    }
    Reply operator()(const training::ForwardBackwardResult& r) const {
      return Reply::Text(EncodeForwardBackward(r), kProtobufType);
    }
    Reply operator()(const training::OptimStepResult& r) const {
      return Reply::Json({{"metrics", r.metrics}});
    }
    Reply operator()(const training::SaveWeightsResult& r) const {
      return Reply::Json({{"path", r.path}, {"type", "save_weights"}});
    }
    Reply operator()(const training::LoadWeightsResult& r) const {
      return Reply::Json({{"path", r.path}, {"model_id", r.run_id}, {"type", "load_weights"}});
    }
    Reply operator()(const training::SaveForSamplerResult& r) const {
      json j = {{"path", r.path}, {"type", "save_weights_for_sampler"}};
      std::lock_guard<std::mutex> lock(st->mu);
      auto it = st->sampler_sessions_of.find(f.request_id);
      if (it != st->sampler_sessions_of.end()) {
        // save_weights_and_get_sampling_client: the SDK samples this session at once.
        st->sampling_sessions[it->second] = {absl::StrCat(r.revision_id), r.path};
        j["sampling_session_id"] = it->second;
      }
      return Reply::Json(j);
    }
    Reply operator()(const training::UnloadResult& r) const {
      return Reply::Json({{"model_id", r.run_id}, {"type", "unload_model"}});
    }
    Reply operator()(const training::SampleResult&) const {
      return http::ErrorReply(500, "internal", "unexpected sample result");
    }
  };
  return std::visit(Visitor{st, f}, *f.value);
}

Reply TryAgain(const std::string& id) {
  return Reply::Json({{"type", "try_again"}, {"request_id", id}, {"queue_state", "active"}});
}

Reply Failed(const absl::Status& error, bool user) {
  return Reply::Json(
      {{"error", std::string(error.message())}, {"category", user ? "user" : "server"}});
}

bool IsUserCode(absl::StatusCode c) {
  return c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kNotFound ||
         c == absl::StatusCode::kFailedPrecondition || c == absl::StatusCode::kOutOfRange ||
         c == absl::StatusCode::kUnimplemented || c == absl::StatusCode::kAlreadyExists;
}

absl::StatusOr<Reply> RetrieveFuture(State* st, const Call& call) {
  LORADB_ASSIGN_OR_RETURN(json j, ParseBody(call));
  LORADB_ASSIGN_OR_RETURN(std::string id, ReqString(j, "request_id"));
  {
    std::unique_lock<std::mutex> lock(st->mu);
    auto it = st->samples.find(id);
    if (it != st->samples.end()) {
      st->cv.wait_for(lock, absl::ToChronoMilliseconds(st->options.poll_wait), [&] {
        auto f = st->samples.find(id);
        return f == st->samples.end() || f->second.done;
      });
      it = st->samples.find(id);
      if (it == st->samples.end()) return absl::NotFoundError(absl::StrCat("no future ", id));
      if (!it->second.done) return TryAgain(id);
      if (!it->second.error.ok()) {
        return Failed(it->second.error, IsUserCode(it->second.error.code()));
      }
      return Reply::Text(it->second.payload, kProtobufType);
    }
  }
  LORADB_ASSIGN_OR_RETURN(training::FutureStatus f,
                          st->training->Retrieve(id, st->options.poll_wait));
  switch (f.state) {
    case training::FutureState::kPending:
      return TryAgain(id);
    case training::FutureState::kFailed:
      return Failed(f.error, f.user_error);
    case training::FutureState::kDone:
      break;
  }
  return ResultReply(st, f);
}

// ---- sampling

std::string EncodeSample(const serving::CompletionResult& r) {
  wire::SampleResponse out;
  for (const serving::Choice& c : r.choices) {
    wire::SampledSequence* s = out.add_sequences();
    s->set_stop_reason(c.finish == serving::FinishReason::kStop ? wire::STOP_REASON_STOP
                                                                : wire::STOP_REASON_LENGTH);
    std::vector<int32_t> tokens(c.tokens.begin(), c.tokens.end());
    s->set_tokens(
        std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(int32_t)));
    std::vector<float> lp;
    for (const serving::TokenLogprob& t : c.logprobs) lp.push_back(t.logprob);
    s->set_logprobs(
        std::string(reinterpret_cast<const char*>(lp.data()), lp.size() * sizeof(float)));
  }
  return out.SerializeAsString();
}

absl::StatusOr<std::vector<int64_t>> PromptTokens(const json& prompt) {
  const json* chunks = Field(prompt, "chunks");
  if (chunks == nullptr || !chunks->is_array()) {
    return absl::InvalidArgumentError("'prompt.chunks' must be a list");
  }
  std::vector<int64_t> out;
  for (const json& c : *chunks) {
    if (!c.is_object()) return absl::InvalidArgumentError("prompt chunks must be objects");
    LORADB_ASSIGN_OR_RETURN(std::string type, ReqString(c, "type"));
    if (type != "encoded_text") {
      return absl::UnimplementedError(absl::StrCat(
          "prompt chunk type '", type, "' is not supported; this base takes encoded_text only"));
    }
    const json* tokens = Field(c, "tokens");
    if (tokens == nullptr || !tokens->is_array()) {
      return absl::InvalidArgumentError("'prompt.chunks[].tokens' must be a list of integers");
    }
    for (const json& t : *tokens) {
      if (!t.is_number_integer()) {
        return absl::InvalidArgumentError("'prompt.chunks[].tokens' must be a list of integers");
      }
      out.push_back(t.get<int64_t>());
    }
  }
  return out;
}

absl::StatusOr<Reply> Asample(State* st, const Call& call) {
  LORADB_ASSIGN_OR_RETURN(json j, ParseBody(call));
  serving::CompletionRequest req;
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> session, OptString(j, "sampling_session_id"));
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> path, OptString(j, "model_path"));
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> base, OptString(j, "base_model"));
  if (session) {
    std::lock_guard<std::mutex> lock(st->mu);
    auto it = st->sampling_sessions.find(*session);
    if (it == st->sampling_sessions.end()) {
      return absl::NotFoundError(absl::StrCat("no sampling session ", *session));
    }
    req.model = it->second.model_ref;
  } else if (path) {
    LORADB_ASSIGN_OR_RETURN(RevisionRecord rev, st->training->ResolveSamplerPath(*path));
    req.model = absl::StrCat(rev.id);
  } else if (!base || *base != st->training->base_model()) {
    return absl::InvalidArgumentError(
        absl::StrCat("asample needs sampling_session_id, model_path or base_model '",
                     st->training->base_model(), "'"));
  }
  const json* prompt = Field(j, "prompt");
  if (prompt == nullptr || !prompt->is_object())
    return absl::InvalidArgumentError("'prompt' is required");
  LORADB_ASSIGN_OR_RETURN(req.prompt, PromptTokens(*prompt));
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> n, OptInt(j, "num_samples"));
  req.n = n.value_or(1);
  LORADB_ASSIGN_OR_RETURN(std::optional<bool> prompt_logprobs, OptBool(j, "prompt_logprobs"));
  if (prompt_logprobs.value_or(false)) {
    return absl::UnimplementedError("prompt_logprobs is not supported by this server");
  }
  for (const char* key : {"topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"}) {
    LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> k, OptInt(j, key));
    if (k.value_or(0) != 0) {
      return absl::UnimplementedError(absl::StrCat(key, " is not supported by this server"));
    }
  }
  if (Field(j, "target_prompt_logprobs") != nullptr) {
    return absl::UnimplementedError("target_prompt_logprobs is not supported by this server");
  }
  if (Field(j, "prompt_logprobs_last_n") != nullptr) {
    return absl::UnimplementedError("prompt_logprobs_last_n is not supported by this server");
  }
  const json* params = Field(j, "sampling_params");
  if (params == nullptr || !params->is_object()) {
    return absl::InvalidArgumentError("'sampling_params' is required");
  }
  for (const auto& [key, _] : params->items()) {
    if (key != "max_tokens" && key != "seed" && key != "stop" && key != "temperature" &&
        key != "top_k" && key != "top_p") {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling_params['", key, "'] is not a sampling parameter of this server"));
    }
  }
  LORADB_ASSIGN_OR_RETURN(std::optional<double> temperature, OptNumber(*params, "temperature"));
  req.temperature = temperature.value_or(1.0);
  LORADB_ASSIGN_OR_RETURN(std::optional<double> top_p, OptNumber(*params, "top_p"));
  req.top_p = top_p.value_or(1.0);
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, OptInt(*params, "top_k"));
  req.top_k = top_k.value_or(-1) < 0 ? 0 : *top_k;  // Tinker's -1: every token
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> seed, OptInt(*params, "seed"));
  if (seed) {
    req.seed = static_cast<uint64_t>(*seed);
  } else {
    std::random_device rd;  // an unseeded request draws a fresh seed
    req.seed = (static_cast<uint64_t>(rd()) << 32) | rd();
  }
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens, OptInt(*params, "max_tokens"));
  req.max_tokens = max_tokens
                       ? *max_tokens
                       : st->sampler->max_context() - static_cast<int64_t>(req.prompt.size());
  const json* stop = Field(*params, "stop");
  if (stop == nullptr) {
    req.stop_token_ids = st->eos_ids;
  } else if (stop->is_array()) {
    for (const json& s : *stop) {
      if (!s.is_number_integer()) {
        return absl::UnimplementedError(
            "sampling_params.stop: string stop sequences are not supported; give token ids");
      }
      req.stop_token_ids.push_back(s.get<int64_t>());
    }
  } else {
    return absl::UnimplementedError(
        "sampling_params.stop: string stop sequences are not supported; give token ids");
  }
  for (int64_t t : req.stop_token_ids) {
    if (t < 0 || t >= st->sampler->vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("sampling_params.stop token id ", t,
                                                     " is outside the vocabulary [0, ",
                                                     st->sampler->vocab_size(), ")"));
    }
  }
  req.logprobs = 0;
  std::string id;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    id = absl::StrCat("sample-", st->id_prefix, "-", ++st->next_sample);
    st->samples[id] = SampleFuture{};
  }
  req.on_done = [st, id](serving::CompletionResult r) {
    std::string payload;
    if (r.status.ok()) payload = EncodeSample(r);
    std::lock_guard<std::mutex> lock(st->mu);
    SampleFuture& f = st->samples[id];
    f.done = true;
    f.error = r.status;
    f.payload = std::move(payload);
    st->finished_samples.push_back(id);
    while (st->finished_samples.size() > kMaxFinishedSamples) {
      st->samples.erase(st->finished_samples.front());
      st->finished_samples.pop_front();
    }
    st->cv.notify_all();
  };
  absl::StatusOr<uint64_t> submitted = st->sampler->Submit(std::move(req));
  if (!submitted.ok()) {
    std::lock_guard<std::mutex> lock(st->mu);
    st->samples.erase(id);
    return submitted.status();
  }
  // The SDK stamps these ids on the sequences it returns (one per sample, fixed at submission).
  json sequence_ids = json::array();
  for (int64_t i = 0; i < n.value_or(1); ++i) sequence_ids.push_back(absl::StrCat(id, ":", i));
  return Reply::Json({{"request_id", id}, {"sample_sequence_ids", sequence_ids}});
}

// ---- training calls

absl::StatusOr<Reply> CreateModel(State* st, const Call& call) {
  LORADB_ASSIGN_OR_RETURN(json j, ParseBody(call));
  training::CreateRunRequest req;
  LORADB_ASSIGN_OR_RETURN(req.session_id, ReqString(j, "session_id"));
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> seq, OptInt(j, "model_seq_id"));
  if (!seq) return absl::InvalidArgumentError("'model_seq_id' is required");
  req.model_seq_id = *seq;
  LORADB_ASSIGN_OR_RETURN(req.base_model, ReqString(j, "base_model"));
  LORADB_ASSIGN_OR_RETURN(req.user_metadata, Metadata(j));
  const json* lora = Field(j, "lora_config");
  if (lora == nullptr || !lora->is_object()) {
    return absl::InvalidArgumentError("'lora_config' is required: this server trains LoRA runs");
  }
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> rank, OptInt(*lora, "rank"));
  if (!rank) return absl::InvalidArgumentError("'lora_config.rank' is required");
  req.lora.rank = *rank;
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> seed, OptInt(*lora, "seed"));
  if (seed) req.lora.seed = static_cast<uint64_t>(*seed);
  // The SDK's LoraConfig defaults are true for all three; an absent field keeps that meaning.
  LORADB_ASSIGN_OR_RETURN(std::optional<bool> unembed, OptBool(*lora, "train_unembed"));
  LORADB_ASSIGN_OR_RETURN(std::optional<bool> mlp, OptBool(*lora, "train_mlp"));
  LORADB_ASSIGN_OR_RETURN(std::optional<bool> attn, OptBool(*lora, "train_attn"));
  req.lora.train_unembed = unembed.value_or(true);
  req.lora.train_mlp = mlp.value_or(true);
  req.lora.train_attn = attn.value_or(true);
  if (const json* opt = Field(j, "optimizer_config")) {
    if (!opt->is_object())
      return absl::InvalidArgumentError("'optimizer_config' must be an object");
    LORADB_ASSIGN_OR_RETURN(std::optional<std::string> type, OptString(*opt, "type"));
    req.optimizer = type.value_or("adamw");
  }
  return FutureReply(st->training->CreateRun(req));
}

absl::StatusOr<Reply> OptimStep(State* st, const Call& call) {
  LORADB_ASSIGN_OR_RETURN(json j, ParseBody(call));
  LORADB_ASSIGN_OR_RETURN(std::string run, ReqString(j, "model_id"));
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> seq, OptInt(j, "seq_id"));
  if (Field(j, "optimizer_params") != nullptr) {
    return absl::UnimplementedError("optimizer_params: only Adam steps (adam_params) are served");
  }
  const json* p = Field(j, "adam_params");
  if (p == nullptr || !p->is_object())
    return absl::InvalidArgumentError("'adam_params' is required");
  training::AdamParams a;
  // Every field is sent by the SDK; none is defaulted here, since each changes the step.
  LORADB_ASSIGN_OR_RETURN(a.learning_rate, ReqNumber(*p, "learning_rate"));
  LORADB_ASSIGN_OR_RETURN(a.beta1, ReqNumber(*p, "beta1"));
  LORADB_ASSIGN_OR_RETURN(a.beta2, ReqNumber(*p, "beta2"));
  LORADB_ASSIGN_OR_RETURN(a.eps, ReqNumber(*p, "eps"));
  LORADB_ASSIGN_OR_RETURN(a.weight_decay, ReqNumber(*p, "weight_decay"));
  LORADB_ASSIGN_OR_RETURN(a.grad_clip_norm, ReqNumber(*p, "grad_clip_norm"));
  for (const auto& [key, _] : p->items()) {
    if (key != "learning_rate" && key != "beta1" && key != "beta2" && key != "eps" &&
        key != "weight_decay" && key != "grad_clip_norm") {
      return absl::InvalidArgumentError(absl::StrCat("adam_params['", key, "'] is not served"));
    }
  }
  return FutureReply(st->training->OptimStep(run, seq.value_or(0), a));
}

absl::StatusOr<Reply> SaveWeights(State* st, const Call& call) {
  LORADB_ASSIGN_OR_RETURN(json j, ParseBody(call));
  training::SaveWeightsRequest req;
  LORADB_ASSIGN_OR_RETURN(req.run_id, ReqString(j, "model_id"));
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> seq, OptInt(j, "seq_id"));
  req.seq_id = seq.value_or(0);
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> name, OptString(j, "path"));
  req.name = name.value_or("");
  LORADB_ASSIGN_OR_RETURN(std::optional<bool> overwrite, OptBool(j, "overwrite"));
  req.overwrite = overwrite.value_or(false);
  return FutureReply(st->training->SaveWeights(req));
}

absl::StatusOr<Reply> LoadWeights(State* st, const Call& call) {
  LORADB_ASSIGN_OR_RETURN(json j, ParseBody(call));
  training::LoadWeightsRequest req;
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> run, OptString(j, "model_id"));
  req.run_id = run.value_or("");
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> seq, OptInt(j, "seq_id"));
  req.seq_id = seq.value_or(0);
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> session, OptString(j, "session_id"));
  req.session_id = session.value_or("");
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> model_seq, OptInt(j, "model_seq_id"));
  req.model_seq_id = model_seq.value_or(-1);
  LORADB_ASSIGN_OR_RETURN(req.path, ReqString(j, "path"));
  LORADB_ASSIGN_OR_RETURN(std::optional<bool> optimizer, OptBool(j, "optimizer"));
  if (!optimizer) return absl::InvalidArgumentError("'optimizer' is required");
  req.optimizer = *optimizer;
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> base, OptString(j, "base_model"));
  req.base_model = base.value_or("");
  LORADB_ASSIGN_OR_RETURN(req.user_metadata, Metadata(j));
  if (Field(j, "weights_access_token") != nullptr) {
    return absl::UnimplementedError("weights_access_token: external weights are not served");
  }
  return FutureReply(st->training->LoadWeights(req));
}

absl::StatusOr<Reply> SaveForSampler(State* st, const Call& call) {
  LORADB_ASSIGN_OR_RETURN(json j, ParseBody(call));
  training::SaveForSamplerRequest req;
  LORADB_ASSIGN_OR_RETURN(req.run_id, ReqString(j, "model_id"));
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> seq, OptInt(j, "seq_id"));
  req.seq_id = seq.value_or(0);
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> name, OptString(j, "path"));
  req.name = name.value_or("");
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> kind, OptString(j, "kind"));
  if (kind && *kind != "snapshot") {
    return absl::UnimplementedError(
        absl::StrCat("save_weights_for_sampler kind '", *kind, "' is not served (snapshot only)"));
  }
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> sampling_seq,
                          OptInt(j, "sampling_session_seq_id"));
  LORADB_ASSIGN_OR_RETURN(training::Submitted s, st->training->SaveWeightsForSampler(req));
  if (sampling_seq) {
    std::lock_guard<std::mutex> lock(st->mu);
    st->sampler_sessions_of[s.request_id] =
        absl::StrCat(Session(req.run_id), ":sample:", *sampling_seq);
  }
  return Reply::Json(FutureJson(s));
}

absl::StatusOr<Reply> CreateSamplingSession(State* st, const Call& call) {
  LORADB_ASSIGN_OR_RETURN(json j, ParseBody(call));
  LORADB_ASSIGN_OR_RETURN(std::string session, ReqString(j, "session_id"));
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> seq, OptInt(j, "sampling_session_seq_id"));
  if (!seq) return absl::InvalidArgumentError("'sampling_session_seq_id' is required");
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> path, OptString(j, "model_path"));
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> base, OptString(j, "base_model"));
  SamplingSession s;
  if (path) {
    LORADB_ASSIGN_OR_RETURN(RevisionRecord rev, st->training->ResolveSamplerPath(*path));
    s.model_ref = absl::StrCat(rev.id);
    s.model_path = *path;
  } else if (!base || *base != st->training->base_model()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "create_sampling_session needs model_path or base_model '", st->training->base_model(), "'",
        base ? absl::StrCat(" (not '", *base, "')") : ""));
  }
  const std::string id = absl::StrCat(session, ":sample:", *seq);
  std::lock_guard<std::mutex> lock(st->mu);
  st->sampling_sessions[id] = s;
  return Reply::Json({{"type", "create_sampling_session"}, {"sampling_session_id", id}});
}

// ---- registration

nlohmann::json Doc(const std::string& summary) {
  return http::Operation(summary, "tinker",
                         {{"200", http::ResponseSpec("the result", {{"type", "object"}})}});
}

}  // namespace

absl::Status AddTinkerRoutes(std::shared_ptr<Store> store, const TinkerRoutesOptions& options,
                             http::Server* server) {
  auto st = std::make_shared<State>();
  st->store = store;
  st->options = options;
  LORADB_ASSIGN_OR_RETURN(st->eos_ids, ReadEosIds(options.model_dir));
  training::TrainingServiceOptions to;
  to.model_dir = options.model_dir;
  to.base_name = options.base_name;
  to.threads = options.threads;
  to.shared_batches = options.shared_batches;
  LORADB_ASSIGN_OR_RETURN(st->training, training::TrainingService::Create(store.get(), to));
  serving::ServiceOptions so;
  so.model_dir = options.model_dir;
  so.base_name = st->training->base_model();
  LORADB_ASSIGN_OR_RETURN(st->sampler, serving::CompletionService::Create(so, store.get()));
  std::random_device rd;
  st->id_prefix = absl::StrCat(absl::Hex(absl::ToUnixMicros(absl::Now())), absl::Hex(rd()));

  http::Router* router = server->router();
  auto add = [&](const std::string& method, const std::string& pattern,
                 std::function<absl::StatusOr<Reply>(State*, const Call&)> body,
                 const std::string& summary) -> absl::Status {
    State* raw = st.get();
    http::Route route = http::MakeRoute(
        method, pattern,
        [st, raw, body](const Call& call) -> absl::StatusOr<Reply> {
          absl::StatusOr<Reply> r = body(raw, call);
          if (!r.ok()) return ErrorOf(r.status());
          return r;
        },
        Doc(summary));
    route.auth = http::Route::Auth::kApiKey;
    route.blocking = method == "GET";
    return router->Add(std::move(route));
  };
  auto json_call = [](std::function<absl::StatusOr<json>(State*, const json&)> f) {
    return [f](State* s, const Call& call) -> absl::StatusOr<Reply> {
      LORADB_ASSIGN_OR_RETURN(json j, ParseBody(call));
      LORADB_ASSIGN_OR_RETURN(json out, f(s, j));
      return Reply::Json(out);
    };
  };

  LORADB_RETURN_IF_ERROR(add(
      "GET", "/api/v1/healthz",
      [](State*, const Call&) -> absl::StatusOr<Reply> {
        return Reply::Json({{"status", "ok"}});
      },
      "Tinker: liveness"));
  LORADB_RETURN_IF_ERROR(add(
      "GET", "/api/v1/get_server_capabilities",
      [](State* s, const Call&) -> absl::StatusOr<Reply> {
        return Reply::Json({{"supported_models",
                             {{{"model_name", s->training->base_model()},
                               {"max_context_length", s->training->max_context_length()},
                               {"trainable", true},
                               {"sampleable", true}}}}});
      },
      "Tinker: the served base"));
  LORADB_RETURN_IF_ERROR(add(
      "POST", "/api/v1/client/config",
      [](State*, const Call&) -> absl::StatusOr<Reply> {
        // The SDK's optional transports and server-side features this server does not offer.
        return Reply::Json({{"pjwt_auth_enabled", false},
                            {"use_pyqwest_transport", false},
                            {"proto_compress_fwdbwd", false},
                            {"parallel_fwdbwd_chunks", true},
                            {"sample_use_retrieve_futures", false},
                            {"sample_join_sampling_session", false},
                            {"custom_loss_server_side", false}});
      },
      "Tinker: client configuration"));
  LORADB_RETURN_IF_ERROR(add(
      "POST", "/api/v1/client/dynamic_config",
      [](State*, const Call&) -> absl::StatusOr<Reply> {
        return Reply::Json({{"refresh_interval_sec", 300},
                            {"sample_cancel_enabled", false},
                            {"sample_cancel_max_batch_size", 64}});
      },
      "Tinker: dynamic client configuration"));
  LORADB_RETURN_IF_ERROR(add("POST", "/api/v1/create_session",
                             json_call([](State* s, const json& j) -> absl::StatusOr<json> {
                               std::vector<std::string> tags;
                               if (const json* t = Field(j, "tags"); t && t->is_array()) {
                                 for (const json& v : *t) {
                                   if (v.is_string()) tags.push_back(v.get<std::string>());
                                 }
                               }
                               LORADB_ASSIGN_OR_RETURN(auto meta, Metadata(j));
                               LORADB_ASSIGN_OR_RETURN(std::string id,
                                                       s->training->CreateSession(tags, meta));
                               return json{{"type", "create_session"}, {"session_id", id}};
                             }),
                             "Tinker: open a session"));
  LORADB_RETURN_IF_ERROR(add("POST", "/api/v1/session_heartbeat",
                             json_call([](State* s, const json& j) -> absl::StatusOr<json> {
                               LORADB_ASSIGN_OR_RETURN(std::string id, ReqString(j, "session_id"));
                               LORADB_RETURN_IF_ERROR(s->training->Heartbeat(id));
                               return json{{"type", "session_heartbeat"}};
                             }),
                             "Tinker: session heartbeat"));
  LORADB_RETURN_IF_ERROR(add(
      "POST", "/api/v1/sessions/{session_id}/finish",
      [](State*, const Call&) -> absl::StatusOr<Reply> { return Reply::Json(json::object()); },
      "Tinker: the client closed its session"));
  LORADB_RETURN_IF_ERROR(add(
      "POST", "/api/v1/telemetry",
      [](State*, const Call&) -> absl::StatusOr<Reply> {
        return Reply::Json({{"status", "accepted"}});
      },
      "Tinker: client telemetry (discarded)"));
  LORADB_RETURN_IF_ERROR(add("POST", "/api/v1/create_model", CreateModel,
                             "Tinker: create a LoRA training run (future)"));
  LORADB_RETURN_IF_ERROR(add(
      "POST", "/api/v1/get_info", json_call([](State* s, const json& j) -> absl::StatusOr<json> {
        LORADB_ASSIGN_OR_RETURN(std::string id, ReqString(j, "model_id"));
        LORADB_ASSIGN_OR_RETURN(training::RunInfo r, s->training->GetRun(id));
        return json{
            {"type", "get_info"},
            {"model_id", r.run_id},
            {"model_data",
             {{"arch", "qwen3"}, {"model_name", r.base_model}, {"tokenizer_id", r.base_model}}},
            {"optimizer_config", {{"type", "adamw"}}},
            {"is_lora", true},
            {"lora_rank", r.lora.rank},
            {"model_name", r.base_model}};
      }),
      "Tinker: a training run's model"));
  LORADB_RETURN_IF_ERROR(add(
      "POST", "/api/v1/unload_model",
      [](State* s, const Call& call) -> absl::StatusOr<Reply> {
        LORADB_ASSIGN_OR_RETURN(json j, ParseBody(call));
        LORADB_ASSIGN_OR_RETURN(std::string id, ReqString(j, "model_id"));
        LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> seq, OptInt(j, "seq_id"));
        return FutureReply(s->training->UnloadRun(id, seq.value_or(0)));
      },
      "Tinker: stop serving a training run (future)"));
  LORADB_RETURN_IF_ERROR(add(
      "POST", "/api/v1/forward_backward",
      [](State* s, const Call& call) -> absl::StatusOr<Reply> {
        LORADB_ASSIGN_OR_RETURN(training::ForwardBackwardRequest req,
                                DecodeForwardBackward(call, s->options.max_inflated_bytes));
        return FutureReply(s->training->ForwardBackward(req));
      },
      "Tinker: forward/backward or forward (protobuf body, optionally zstd; future)"));
  LORADB_RETURN_IF_ERROR(
      add("POST", "/api/v1/optim_step", OptimStep, "Tinker: one Adam step (future)"));
  LORADB_RETURN_IF_ERROR(add("POST", "/api/v1/save_weights", SaveWeights,
                             "Tinker: save a training checkpoint (future)"));
  LORADB_RETURN_IF_ERROR(add("POST", "/api/v1/load_weights", LoadWeights,
                             "Tinker: load a training checkpoint (future)"));
  LORADB_RETURN_IF_ERROR(add("POST", "/api/v1/save_weights_for_sampler", SaveForSampler,
                             "Tinker: publish the weights for sampling (future)"));
  LORADB_RETURN_IF_ERROR(
      add("POST", "/api/v1/weights_info",
          json_call([](State* s, const json& j) -> absl::StatusOr<json> {
            LORADB_ASSIGN_OR_RETURN(std::string path, ReqString(j, "tinker_path"));
            LORADB_ASSIGN_OR_RETURN(training::WeightsInfo w, s->training->GetWeightsInfo(path));
            return json{{"base_model", w.base_model},
                        {"optimizer_config", {{"type", "adamw"}}},
                        {"is_lora", w.is_lora},
                        {"lora_rank", w.lora_rank},
                        {"train_unembed", w.train_unembed},
                        {"train_mlp", w.train_mlp},
                        {"train_attn", w.train_attn}};
          }),
          "Tinker: what a checkpoint path holds"));
  LORADB_RETURN_IF_ERROR(add("POST", "/api/v1/retrieve_future", RetrieveFuture,
                             "Tinker: a future's result (long poll)"));
  LORADB_RETURN_IF_ERROR(add("POST", "/api/v1/create_sampling_session", CreateSamplingSession,
                             "Tinker: open a sampling session on the base or sampler weights"));
  LORADB_RETURN_IF_ERROR(add("POST", "/api/v1/asample", Asample, "Tinker: sample (future)"));
  LORADB_RETURN_IF_ERROR(add(
      "GET", "/api/v1/samplers/{sampling_session_id}",
      [](State* s, const Call& call) -> absl::StatusOr<Reply> {
        const std::string& id = call.Param("sampling_session_id");
        std::lock_guard<std::mutex> lock(s->mu);
        auto it = s->sampling_sessions.find(id);
        if (it == s->sampling_sessions.end()) {
          return absl::NotFoundError(absl::StrCat("no sampling session ", id));
        }
        json j = {{"sampler_id", id}, {"base_model", s->training->base_model()}};
        if (!it->second.model_path.empty()) j["model_path"] = it->second.model_path;
        return Reply::Json(j);
      },
      "Tinker: a sampling session"));
  LORADB_RETURN_IF_ERROR(add(
      "GET", "/api/v1/training_runs",
      [](State* s, const Call& call) -> absl::StatusOr<Reply> {
        LORADB_ASSIGN_OR_RETURN(std::vector<training::RunInfo> runs, s->training->ListRuns());
        LORADB_ASSIGN_OR_RETURN(auto page, Page(call, runs.size()));
        json list = json::array();
        for (size_t i = page.first; i < page.second; ++i) list.push_back(RunJson(runs[i]));
        return Reply::Json({{"training_runs", list},
                            {"cursor",
                             {{"offset", page.first},
                              {"limit", page.second - page.first},
                              {"total_count", runs.size()}}}});
      },
      "Tinker: training runs"));
  LORADB_RETURN_IF_ERROR(add(
      "GET", "/api/v1/training_runs/{training_run_id}",
      [](State* s, const Call& call) -> absl::StatusOr<Reply> {
        LORADB_ASSIGN_OR_RETURN(training::RunInfo r,
                                s->training->GetRun(call.Param("training_run_id")));
        return Reply::Json(RunJson(r));
      },
      "Tinker: one training run"));
  LORADB_RETURN_IF_ERROR(add(
      "GET", "/api/v1/training_runs/{training_run_id}/checkpoints",
      [](State* s, const Call& call) -> absl::StatusOr<Reply> {
        LORADB_ASSIGN_OR_RETURN(std::vector<training::CheckpointInfo> list,
                                s->training->ListCheckpoints(call.Param("training_run_id")));
        json out = json::array();
        for (const auto& c : list) out.push_back(CheckpointJson(c));
        return Reply::Json({{"checkpoints", out}});
      },
      "Tinker: a training run's checkpoints"));
  LORADB_RETURN_IF_ERROR(add(
      "GET", "/api/v1/checkpoints",
      [](State* s, const Call& call) -> absl::StatusOr<Reply> {
        LORADB_ASSIGN_OR_RETURN(std::vector<training::RunInfo> runs, s->training->ListRuns());
        std::vector<json> all;
        for (const training::RunInfo& r : runs) {
          LORADB_ASSIGN_OR_RETURN(std::vector<training::CheckpointInfo> list,
                                  s->training->ListCheckpoints(r.run_id));
          for (const auto& c : list) all.push_back(CheckpointJson(c));
        }
        LORADB_ASSIGN_OR_RETURN(auto page, Page(call, all.size()));
        json out = json::array();
        for (size_t i = page.first; i < page.second; ++i) out.push_back(all[i]);
        return Reply::Json({{"checkpoints", out},
                            {"cursor",
                             {{"offset", page.first},
                              {"limit", page.second - page.first},
                              {"total_count", all.size()}}}});
      },
      "Tinker: every checkpoint"));
  return absl::OkStatus();
}

}  // namespace loradb::tinker
