// CompletionService over a tiny random base and adapters in a real store: concurrent submitters
// on different adapters and the base give what Decoder gives for each request alone; requests
// join a running batch; cancellation frees the sequence within one step; alias moves and
// rollbacks mid-stream; a corrupt or missing blob fails only its requests; the queue bound;
// n > 1, echo, log-probs, stop hooks; bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "compute/decoder/decoder.h"
#include "compute/model/checkpoint.h"
#include "compute/model/kernel_lora_applier.h"
#include "compute/model/qwen3_model.h"
#include "compute/serving/completion_service.h"
#include "compute/serving/random_adapter.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace loradb::serving {
namespace {

using ::loradb::testing::TempDir;
using ::testing::HasSubstr;

class ServingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<ModelConfig> c =
        ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/tiny-dense.json");
    ASSERT_TRUE(c.ok()) << c.status();
    config_ = *c;
    model_dir_ = dir_.file("model");
    ASSERT_TRUE(model::WriteRandomCheckpoint(config_, model_dir_, 7, at::kFloat).ok());
    absl::StatusOr<std::unique_ptr<Store>> s = Store::Open(dir_.file("store"));
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    ASSERT_TRUE(store_
                    ->AddBaseFromConfig("tiny", model_dir_ + "/config.json",
                                        model_dir_ + "/model.safetensors")
                    .ok());
    // The reference: the same base, its own Decoder over the same store.
    absl::StatusOr<std::unique_ptr<model::Qwen3Model>> m = model::Qwen3Model::Load(model_dir_);
    ASSERT_TRUE(m.ok()) << m.status();
    ref_model_ = std::move(*m);
    ref_model_->set_lora_applier(&ref_applier_);
  }

  uint64_t Publish(const std::string& policy, uint64_t seed, const std::string& alias = "prod") {
    RandomAdapterSpec spec;
    spec.seed = seed;
    absl::StatusOr<RevisionRecord> r = PublishRandomAdapter(*store_, "tiny", policy, alias, spec);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->id : 0;
  }

  std::unique_ptr<CompletionService> NewService(ServiceOptions o = {}) {
    o.model_dir = model_dir_;
    o.lora_threads = 1;
    o.device_arena_bytes = 32 << 20;
    absl::StatusOr<std::unique_ptr<CompletionService>> s =
        CompletionService::Create(o, store_.get());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::vector<int64_t> Prompt(uint64_t seed, size_t len) const {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> p(len);
    for (auto& x : p) x = static_cast<int64_t>(rng() % static_cast<uint64_t>(config_.vocab_size));
    return p;
  }

  // `r` run alone through a fresh Decoder, pinned to `revision` (0: base), as sequence `index`
  // of its request (seed + index).
  decoder::GenerateResult Alone(const CompletionRequest& r, uint64_t revision, int64_t index = 0) {
    absl::StatusOr<std::unique_ptr<decoder::Decoder>> d =
        decoder::Decoder::Create(ref_model_.get(), store_.get());
    EXPECT_TRUE(d.ok()) << d.status();
    decoder::GenerateRequest g;
    g.adapter = revision == 0 ? "" : absl::StrCat(revision);
    g.prompt_ids = r.prompt;
    g.max_new_tokens = r.max_tokens;
    g.stop_token_ids = r.stop_token_ids;
    g.sampling = {r.temperature, r.top_k, r.top_p, r.seed + static_cast<uint64_t>(index)};
    g.logprobs = r.logprobs;
    g.prompt_logprobs = r.echo;
    absl::StatusOr<uint64_t> id = (*d)->Submit(g);
    EXPECT_TRUE(id.ok()) << id.status();
    EXPECT_TRUE((*d)->RunUntilIdle().ok());
    absl::StatusOr<std::optional<decoder::GenerateResult>> res = (*d)->Poll(*id);
    EXPECT_TRUE(res.ok() && res->has_value());
    return res.ok() && res->has_value() ? std::move(**res) : decoder::GenerateResult{};
  }

  static CompletionRequest Req(const std::string& model, std::vector<int64_t> prompt,
                               int64_t max_tokens) {
    CompletionRequest r;
    r.model = model;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.temperature = 0;
    return r;
  }

  TempDir dir_;
  ModelConfig config_;
  std::string model_dir_;
  std::unique_ptr<Store> store_;
  model::KernelLoraApplier ref_applier_{1};
  std::unique_ptr<model::Qwen3Model> ref_model_;
};

// Counts tokens of one request and lets a test wait for the n-th.
class TokenCounter {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++count_;
  }
  void WaitFor(int64_t n) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ >= n; };
    mu_.Await(absl::Condition(&reached));
  }
  int64_t count() const {
    absl::MutexLock lock(&mu_);
    return count_;
  }

 private:
  mutable absl::Mutex mu_;
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(ServingTest, ConcurrentSubmittersOnAdaptersAndBaseMatchDecoderAlone) {
  constexpr int kAdapters = 4, kThreads = 6, kPerThread = 3;
  std::vector<uint64_t> revs;
  for (int i = 0; i < kAdapters; ++i) revs.push_back(Publish(absl::StrCat("p", i), 10 + i));
  std::unique_ptr<CompletionService> svc = NewService();
  ASSERT_NE(svc, nullptr);
  struct Job {
    CompletionRequest request;
    uint64_t revision = 0;
    absl::StatusOr<CompletionResult> result = absl::UnknownError("not run");
    std::vector<int64_t> streamed;
  };
  std::vector<Job> jobs(kThreads * kPerThread);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int a = static_cast<int>(j % (kAdapters + 2)) - 2;  // -2, -1: base (by "" and name)
    jobs[j].request = Req(a == -2   ? ""
                          : a == -1 ? "tiny"
                                    : absl::StrCat("p", a, ":prod"),
                          Prompt(j, 3 + j % 5), 4 + static_cast<int64_t>(j % 4));
    jobs[j].revision = a < 0 ? 0 : revs[static_cast<size_t>(a)];
    if (j % 2 == 1) {  // seeded sampling
      jobs[j].request.temperature = 1.3;
      jobs[j].request.top_k = 40;
      jobs[j].request.top_p = 0.95;
      jobs[j].request.seed = 1000 + j;
    }
    if (j % 3 == 0) jobs[j].request.logprobs = 2;
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        Job& job = jobs[static_cast<size_t>(t * kPerThread + k)];
        CompletionRequest r = job.request;
        r.on_token = [&job](const TokenEvent& e) { job.streamed.push_back(e.token); };
        job.result = svc->Complete(std::move(r));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Job& job = jobs[j];
    ASSERT_TRUE(job.result.ok()) << j << ": " << job.result.status();
    ASSERT_EQ(job.result->choices.size(), 1u);
    const Choice& c = job.result->choices[0];
    EXPECT_EQ(c.finish, FinishReason::kLength) << c.status;
    EXPECT_EQ(job.result->revision, job.revision);
    const decoder::GenerateResult alone = Alone(job.request, job.revision);
    EXPECT_EQ(c.tokens, alone.tokens) << "request " << j;
    EXPECT_EQ(job.streamed, c.tokens) << "request " << j;
    EXPECT_EQ(job.result->usage.prompt_tokens, static_cast<int64_t>(job.request.prompt.size()));
    EXPECT_EQ(job.result->usage.completion_tokens, static_cast<int64_t>(c.tokens.size()));
    if (job.request.logprobs >= 0) {
      ASSERT_EQ(c.logprobs.size(), alone.logprobs.size());
      for (size_t i = 0; i < c.logprobs.size(); ++i) {
        EXPECT_EQ(c.logprobs[i].token, c.tokens[i]);
        EXPECT_NEAR(c.logprobs[i].logprob, alone.logprobs[i].logprob, 1e-4);
        ASSERT_EQ(c.logprobs[i].top.size(), 2u);
      }
    } else {
      EXPECT_TRUE(c.logprobs.empty());
    }
  }
  const ServiceStats st = svc->stats();
  EXPECT_EQ(st.submitted, kThreads * kPerThread);
  EXPECT_EQ(st.outstanding_sequences, 0);
  EXPECT_EQ(st.failed, 0);
}

TEST_F(ServingTest, RequestSubmittedWhileOthersDecodeStartsBeforeTheyFinish) {
  Publish("p", 1);
  std::unique_ptr<CompletionService> svc = NewService();
  ASSERT_NE(svc, nullptr);
  TokenCounter long_tokens;
  absl::Mutex mu;
  std::vector<std::string> done_order;
  int64_t long_tokens_when_short_started = -1;
  absl::Notification short_submitted;
  CompletionRequest long_req = Req("p:prod", Prompt(1, 6), 60);
  long_req.on_token = [&](const TokenEvent&) {
    long_tokens.Add();
    // Holds the driver at the third token until the short request is queued, so the test does
    // not depend on how fast this thread is scheduled.
    if (long_tokens.count() == 3) short_submitted.WaitForNotification();
  };
  long_req.on_done = [&](CompletionResult) {
    absl::MutexLock lock(&mu);
    done_order.push_back("long");
  };
  ASSERT_TRUE(svc->Submit(long_req).ok());
  long_tokens.WaitFor(3);
  CompletionRequest short_req = Req("", Prompt(2, 9), 3);
  short_req.on_token = [&](const TokenEvent&) {
    absl::MutexLock lock(&mu);
    if (long_tokens_when_short_started < 0) long_tokens_when_short_started = long_tokens.count();
  };
  absl::Notification short_done;
  CompletionResult short_res;
  size_t done_before = 0;  // requests finished when the short one did (on the driver thread)
  CompletionRequest submitted = short_req;
  submitted.on_done = [&](CompletionResult r) {
    {
      absl::MutexLock lock(&mu);
      done_before = done_order.size();
    }
    short_res = std::move(r);
    short_done.Notify();
  };
  ASSERT_TRUE(svc->Submit(std::move(submitted)).ok());
  short_submitted.Notify();
  short_done.WaitForNotification();
  EXPECT_EQ(short_res.choices[0].tokens, Alone(short_req, 0).tokens);
  int64_t started_at = 0;
  {
    absl::MutexLock lock(&mu);
    started_at = long_tokens_when_short_started;
  }
  svc.reset();  // the callbacks above use this test's locals
  // The short request ran to completion while the long one was still decoding.
  EXPECT_EQ(done_before, 0u);
  EXPECT_GE(started_at, 3);
  EXPECT_LT(started_at, 60);
}

TEST_F(ServingTest, CancelFreesTheSequenceWithinOneStep) {
  Publish("a", 1);
  Publish("b", 2);
  std::unique_ptr<CompletionService> svc = NewService();
  ASSERT_NE(svc, nullptr);
  TokenCounter cancelled_tokens;
  absl::Notification cancelled_done;
  CompletionResult cancelled_result;
  ServiceStats at_done;
  CompletionService* service = svc.get();
  absl::Notification cancel_called;
  CompletionRequest victim = Req("a:prod", Prompt(1, 5), 200);
  victim.on_token = [&](const TokenEvent&) {
    cancelled_tokens.Add();
    // Holds the driver at the third token until Cancel returned.
    if (cancelled_tokens.count() == 3) cancel_called.WaitForNotification();
  };
  victim.on_done = [&](CompletionResult r) {
    at_done = service->stats();  // still inside the step that handled the cancellation
    cancelled_result = std::move(r);
    cancelled_done.Notify();
  };
  // Two others keep decoding: one on adapter b, one on the base. The base one records the
  // service's gauges at each of its tokens (each as of the end of the previous step).
  std::vector<ServiceStats> seen;
  absl::Mutex seen_mu;
  CompletionRequest other = Req("b:prod", Prompt(2, 5), 200);
  CompletionRequest base = Req("", Prompt(3, 5), 200);
  base.on_token = [&](const TokenEvent&) {
    absl::MutexLock lock(&seen_mu);
    seen.push_back(service->stats());
  };
  absl::StatusOr<uint64_t> vid = svc->Submit(victim);
  absl::StatusOr<uint64_t> oid = svc->Submit(other);
  absl::StatusOr<uint64_t> bid = svc->Submit(base);
  ASSERT_TRUE(vid.ok() && oid.ok() && bid.ok());
  cancelled_tokens.WaitFor(3);
  ASSERT_TRUE(svc->Cancel(*vid).ok());
  // The step in flight (held above) missed the cancel; the next one sees it.
  const int64_t steps_at_cancel = svc->stats().steps;
  cancel_called.Notify();
  cancelled_done.WaitForNotification();
  EXPECT_EQ(cancelled_result.choices[0].finish, FinishReason::kCancelled);
  EXPECT_GE(cancelled_result.choices[0].tokens.size(), 3u);
  EXPECT_LT(cancelled_result.choices[0].tokens.size(), 200u);
  // Handled by the step after the one running when Cancel returned, at the latest; its KV
  // sequence is gone at once.
  EXPECT_EQ(at_done.steps, steps_at_cancel + 1);
  EXPECT_EQ(at_done.kv_sequences, 2);
  // Wait for a base token two steps later: the gauges then describe the end of the step that
  // handled the cancellation.
  const int64_t handled = at_done.steps + 1;
  ServiceStats after;
  for (;;) {
    {
      absl::MutexLock lock(&seen_mu);
      auto it = std::find_if(seen.begin(), seen.end(),
                             [&](const ServiceStats& s) { return s.steps >= handled; });
      if (it != seen.end()) {
        after = *it;
        break;
      }
    }
    ASSERT_TRUE(svc->stats().finished < 3) << "the others finished before the check";
    std::this_thread::yield();
  }
  EXPECT_EQ(after.steps, handled);
  EXPECT_EQ(after.running, 2);
  EXPECT_EQ(after.kv_sequences, 2);
  EXPECT_EQ(after.leased_adapters, 1);  // b only: a's lease went with that step
  EXPECT_TRUE(absl::IsNotFound(svc->Cancel(*vid)));
  ASSERT_TRUE(svc->Cancel(*oid).ok());
  ASSERT_TRUE(svc->Cancel(*bid).ok());
  svc.reset();  // the callbacks above use this test's locals
}

TEST_F(ServingTest, AliasMovesAndRollbacksApplyToTheNextSubmitOnly) {
  const uint64_t rev1 = Publish("p", 1);
  const uint64_t rev2 = Publish("p", 2, "");
  std::unique_ptr<CompletionService> svc = NewService();
  ASSERT_NE(svc, nullptr);
  auto model_rev = [&](const std::string& id) -> uint64_t {
    absl::StatusOr<std::vector<ModelEntry>> models = svc->ListModels();
    EXPECT_TRUE(models.ok()) << models.status();
    for (const ModelEntry& m : *models) {
      if (m.id == id) return m.revision;
    }
    return 0;
  };
  EXPECT_EQ(model_rev("p:prod"), rev1);
  TokenCounter a_tokens, b_tokens;
  absl::Notification a_done, b_done;
  CompletionResult a_res, b_res;
  CompletionRequest a = Req("p:prod", Prompt(1, 5), 40);
  a.on_token = [&](const TokenEvent&) { a_tokens.Add(); };
  a.on_done = [&](CompletionResult r) {
    a_res = std::move(r);
    a_done.Notify();
  };
  ASSERT_TRUE(svc->Submit(a).ok());
  a_tokens.WaitFor(2);
  ASSERT_TRUE(store_->SetAlias("p", "prod", rev2).ok());
  EXPECT_EQ(model_rev("p:prod"), rev2);
  CompletionRequest b = Req("p:prod", Prompt(1, 5), 40);
  b.on_token = [&](const TokenEvent&) { b_tokens.Add(); };
  b.on_done = [&](CompletionResult r) {
    b_res = std::move(r);
    b_done.Notify();
  };
  ASSERT_TRUE(svc->Submit(b).ok());
  b_tokens.WaitFor(2);
  absl::StatusOr<uint64_t> back = store_->Rollback("p", "prod");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, rev1);
  EXPECT_EQ(model_rev("p:prod"), rev1);
  absl::StatusOr<CompletionResult> c = svc->Complete(Req("p:prod", Prompt(1, 5), 40));
  ASSERT_TRUE(c.ok()) << c.status();
  a_done.WaitForNotification();
  b_done.WaitForNotification();
  EXPECT_EQ(a_res.revision, rev1);
  EXPECT_EQ(b_res.revision, rev2);
  EXPECT_EQ(c->revision, rev1);
  EXPECT_EQ(a_res.choices[0].tokens, Alone(a, rev1).tokens);
  EXPECT_EQ(b_res.choices[0].tokens, Alone(b, rev2).tokens);
  EXPECT_EQ(c->choices[0].tokens, a_res.choices[0].tokens);
  EXPECT_NE(a_res.choices[0].tokens, b_res.choices[0].tokens);
}

TEST_F(ServingTest, AdapterWithCorruptOrMissingBlobFailsOnlyItsRequests) {
  Publish("good", 1);
  const uint64_t corrupt = Publish("corrupt", 2);
  const uint64_t missing = Publish("missing", 3);
  {
    absl::StatusOr<RevisionRecord> r = store_->GetRevision(corrupt);
    ASSERT_TRUE(r.ok());
    const std::string path = store_->BlobPath(r->blob.hash);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    f.seekg(-64, std::ios::end);
    char ch = 0;
    f.read(&ch, 1);
    f.seekp(-64, std::ios::end);
    ch = static_cast<char>(ch ^ 0x5a);
    f.write(&ch, 1);
  }
  {
    absl::StatusOr<RevisionRecord> r = store_->GetRevision(missing);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(std::filesystem::remove(store_->BlobPath(r->blob.hash)));
  }
  std::unique_ptr<CompletionService> svc = NewService();
  ASSERT_NE(svc, nullptr);
  struct Out {
    absl::Notification done;
    CompletionResult result;
  };
  std::map<std::string, std::unique_ptr<Out>> outs;
  const std::vector<std::string> models = {"good:prod", "corrupt:prod", "", "missing:prod",
                                           "good:prod"};
  std::vector<CompletionRequest> reqs;
  for (size_t i = 0; i < models.size(); ++i) {
    CompletionRequest r = Req(models[i], Prompt(i, 4), 6);
    Out* o = outs.emplace(absl::StrCat(i), std::make_unique<Out>()).first->second.get();
    r.on_done = [o](CompletionResult res) {
      o->result = std::move(res);
      o->done.Notify();
    };
    reqs.push_back(r);
    ASSERT_TRUE(svc->Submit(std::move(r)).ok()) << models[i];
  }
  for (size_t i = 0; i < models.size(); ++i) {
    Out& o = *outs[absl::StrCat(i)];
    o.done.WaitForNotification();
    const Choice& c = o.result.choices[0];
    if (models[i] == "corrupt:prod" || models[i] == "missing:prod") {
      EXPECT_EQ(c.finish, FinishReason::kError) << models[i];
      EXPECT_FALSE(c.status.ok());
      EXPECT_EQ(o.result.status, c.status);
      EXPECT_THAT(std::string(c.status.message()), HasSubstr(absl::StrCat(o.result.revision)))
          << c.status;
      EXPECT_TRUE(c.tokens.empty());
    } else {
      EXPECT_EQ(c.finish, FinishReason::kLength) << models[i] << ": " << c.status;
      EXPECT_EQ(c.tokens, Alone(reqs[i], o.result.revision).tokens) << models[i];
    }
  }
  EXPECT_EQ(svc->stats().failed, 2);
}

TEST_F(ServingTest, QueueBoundRejectsWithRetryAfter) {
  ServiceOptions o;
  o.max_running = 1;
  o.max_queued = 2;
  std::unique_ptr<CompletionService> svc = NewService(o);
  ASSERT_NE(svc, nullptr);
  absl::Notification first_token, release;
  CompletionRequest blocker = Req("", Prompt(1, 4), 3);
  blocker.on_token = [&](const TokenEvent&) {
    if (!first_token.HasBeenNotified()) first_token.Notify();
    release.WaitForNotification();  // holds the driver: nothing finishes meanwhile
  };
  absl::StatusOr<uint64_t> b = svc->Submit(blocker);
  ASSERT_TRUE(b.ok());
  first_token.WaitForNotification();
  ASSERT_TRUE(svc->Submit(Req("", Prompt(2, 4), 3)).ok());
  CompletionRequest two = Req("", Prompt(3, 4), 3);
  two.n = 2;
  absl::StatusOr<uint64_t> over = svc->Submit(two);  // 2 + 2 > 3
  ASSERT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("retry after"));
  std::optional<int64_t> hint = RetryAfterMs(over.status());
  ASSERT_TRUE(hint.has_value());
  EXPECT_GE(*hint, 1);
  ASSERT_TRUE(svc->Submit(Req("", Prompt(4, 4), 3)).ok());  // exactly at the bound
  EXPECT_TRUE(absl::IsResourceExhausted(svc->Submit(Req("", Prompt(5, 4), 3)).status()));
  EXPECT_EQ(svc->stats().rejected, 2);
  EXPECT_EQ(svc->stats().outstanding_sequences, 3);
  release.Notify();
  absl::StatusOr<CompletionResult> after = svc->Complete(two);  // room again once they finish
  while (absl::IsResourceExhausted(after.status())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    after = svc->Complete(two);
  }
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->choices.size(), 2u);
  svc.reset();  // the callbacks above use this test's locals
}

TEST_F(ServingTest, SubmitBatchPrefillsTogetherMatchesAloneAndIsAllOrNothing) {
  const uint64_t a = Publish("a", 11), b = Publish("b", 12);
  ServiceOptions o;
  o.max_running = 8;
  o.max_queued = 0;
  std::unique_ptr<CompletionService> svc = NewService(o);
  ASSERT_NE(svc, nullptr);
  std::vector<CompletionRequest> batch = {Req("a:prod", Prompt(1, 5), 4), Req("", Prompt(2, 7), 4),
                                          Req("b:prod", Prompt(3, 3), 4),
                                          Req("a:prod", Prompt(4, 6), 4)};
  batch[3].n = 2;
  batch[3].temperature = 0.9;
  batch[3].seed = 31;
  const std::vector<uint64_t> revisions = {a, 0, b, a};

  // Refused as a whole: an unknown model in the third request, or more sequences than the
  // service holds at once.
  std::vector<CompletionRequest> bad = batch;
  bad[2].model = "nope:prod";
  absl::Status refused = svc->SubmitBatch(bad).status();
  EXPECT_TRUE(absl::IsNotFound(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("prompt 2: "));
  bad = batch;
  bad[0].n = 4;  // with the next: 4 + 2 + 1 + 2 = 9 sequences, one more than the bound
  bad[1].n = 2;
  refused = svc->SubmitBatch(bad).status();
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("exceed what the service holds"));
  EXPECT_TRUE(absl::IsInvalidArgument(svc->SubmitBatch({}).status()));
  EXPECT_EQ(svc->stats().submitted, 0);
  EXPECT_EQ(svc->stats().outstanding_sequences, 0);
  EXPECT_EQ(svc->stats().steps, 0);

  absl::Mutex mu;
  std::vector<std::optional<CompletionResult>> results(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].on_done = [&, i](CompletionResult r) {
      absl::MutexLock lock(&mu);
      results[i] = std::move(r);
    };
  }
  absl::StatusOr<std::vector<uint64_t>> ids = svc->SubmitBatch(batch);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), batch.size());
  {
    absl::MutexLock lock(&mu);
    auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return std::all_of(results.begin(), results.end(),
                         [](const auto& r) { return r.has_value(); });
    };
    mu.Await(absl::Condition(&all_done));
  }
  // The last callback ran inside its step, which is counted once the gauges show nothing running.
  while (svc->stats().running > 0) std::this_thread::yield();
  // Every prompt was prefilled in the first step: a prompt admitted a step later would have made
  // more steps than the longest completion has tokens.
  size_t longest = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const CompletionResult& r = *results[i];
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.id, (*ids)[i]);
    EXPECT_EQ(r.revision, revisions[i]);
    ASSERT_EQ(r.choices.size(), static_cast<size_t>(batch[i].n));
    for (size_t k = 0; k < r.choices.size(); ++k) {
      EXPECT_EQ(r.choices[k].tokens, Alone(batch[i], revisions[i], static_cast<int64_t>(k)).tokens)
          << i << " " << k;
      longest = std::max(longest, r.choices[k].tokens.size());
    }
  }
  EXPECT_EQ(svc->stats().steps, static_cast<int64_t>(longest));
  EXPECT_EQ(svc->stats().prefill_tokens, 5 + 7 + 3 + 6);
  EXPECT_EQ(svc->stats().submitted, 4);
}

TEST_F(ServingTest, NSequencesEchoLogprobsAndStopHook) {
  const uint64_t rev = Publish("p", 4);
  std::unique_ptr<CompletionService> svc = NewService();
  ASSERT_NE(svc, nullptr);
  CompletionRequest r = Req("p:prod", Prompt(7, 6), 8);
  r.n = 3;
  r.temperature = 1.5;
  r.seed = 77;
  r.logprobs = 3;
  r.echo = true;
  std::map<int64_t, std::vector<int64_t>> streamed;
  r.on_token = [&](const TokenEvent& e) {
    ASSERT_NE(e.logprobs, nullptr);
    EXPECT_EQ(e.logprobs->token, e.token);
    streamed[e.index].push_back(e.token);
  };
  absl::StatusOr<CompletionResult> got = svc->Complete(r);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->choices.size(), 3u);
  int64_t completion = 0;
  for (int64_t i = 0; i < 3; ++i) {
    const Choice& c = got->choices[static_cast<size_t>(i)];
    EXPECT_EQ(c.index, i);
    const decoder::GenerateResult alone = Alone(r, rev, i);
    EXPECT_EQ(c.tokens, alone.tokens) << i;
    EXPECT_EQ(streamed[i], c.tokens);
    ASSERT_EQ(c.logprobs.size(), c.tokens.size());
    for (size_t t = 0; t < c.tokens.size(); ++t) {
      ASSERT_EQ(c.logprobs[t].top.size(), 3u);
      EXPECT_LE(c.logprobs[t].logprob, c.logprobs[t].top[0].second);
      EXPECT_NEAR(c.logprobs[t].logprob, alone.logprobs[t].logprob, 1e-4);
    }
    completion += static_cast<int64_t>(c.tokens.size());
  }
  EXPECT_NE(got->choices[0].tokens, got->choices[1].tokens);
  EXPECT_EQ(got->usage.prompt_tokens, 6);
  EXPECT_EQ(got->usage.completion_tokens, completion);
  EXPECT_EQ(got->usage.total_tokens, 6 + completion);
  // Echo: one entry per prompt token, none for the first.
  ASSERT_EQ(got->prompt_logprobs.size(), 6u);
  EXPECT_FALSE(got->prompt_logprobs[0].has_value());
  for (size_t p = 1; p < 6; ++p) {
    ASSERT_TRUE(got->prompt_logprobs[p].has_value());
    EXPECT_EQ(got->prompt_logprobs[p]->token, r.prompt[p]);
    EXPECT_EQ(got->prompt_logprobs[p]->top.size(), 3u);
  }
  // The stop hook ends a sequence where it says, keeping that token.
  CompletionRequest s = Req("p:prod", Prompt(7, 6), 8);
  std::vector<std::vector<int64_t>> hook_saw;
  s.stop_check = [&](int64_t index, const std::vector<int64_t>& tokens) {
    EXPECT_EQ(index, 0);
    hook_saw.push_back(tokens);
    return tokens.size() == 3;
  };
  absl::StatusOr<CompletionResult> stopped = svc->Complete(s);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_EQ(stopped->choices[0].finish, FinishReason::kStop);
  const std::vector<int64_t> full = Alone(Req("p:prod", Prompt(7, 6), 8), rev).tokens;
  EXPECT_EQ(stopped->choices[0].tokens, std::vector<int64_t>(full.begin(), full.begin() + 3));
  ASSERT_EQ(hook_saw.size(), 3u);
  EXPECT_EQ(hook_saw[1], std::vector<int64_t>(full.begin(), full.begin() + 2));
}

TEST_F(ServingTest, BadInputIsRefusedWithAMessageAndNothingQueued) {
  Publish("p", 5);
  std::unique_ptr<CompletionService> svc = NewService();
  ASSERT_NE(svc, nullptr);
  auto expect = [&](CompletionRequest r, absl::StatusCode code, const std::string& text) {
    absl::StatusOr<uint64_t> id = svc->Submit(std::move(r));
    EXPECT_EQ(id.status().code(), code) << id.status();
    EXPECT_THAT(std::string(id.status().message()), HasSubstr(text));
  };
  const int64_t vocab = config_.vocab_size;
  expect(Req("", {1, vocab}, 4), absl::StatusCode::kInvalidArgument,
         absl::StrCat("prompt token ", vocab, " is outside the vocabulary"));
  expect(Req("p:prod", {-3, 2}, 4), absl::StatusCode::kInvalidArgument, "prompt token -3");
  expect(Req("", {}, 4), absl::StatusCode::kInvalidArgument, "empty prompt");
  expect(Req("", {1, 2}, 0), absl::StatusCode::kInvalidArgument, "max_tokens must be >= 1");
  expect(Req("", {1, 2}, config_.max_position_embeddings - 1), absl::StatusCode::kInvalidArgument,
         "exceeds the model's context length");
  expect(Req("nope", {1, 2}, 4), absl::StatusCode::kNotFound, "model \"nope\" is not served");
  expect(Req("p:staging", {1, 2}, 4), absl::StatusCode::kNotFound, "staging");
  expect(Req("q:prod", {1, 2}, 4), absl::StatusCode::kNotFound, "q");
  expect(Req("p@9", {1, 2}, 4), absl::StatusCode::kNotFound, "");
  expect(Req("987654", {1, 2}, 4), absl::StatusCode::kNotFound, "987654");
  CompletionRequest n0 = Req("", {1, 2}, 4);
  n0.n = 0;
  expect(n0, absl::StatusCode::kInvalidArgument, "n must be >= 1");
  CompletionRequest lp = Req("", {1, 2}, 4);
  lp.logprobs = 21;
  expect(lp, absl::StatusCode::kInvalidArgument, "logprobs must be in [0, 20]");
  CompletionRequest tp = Req("", {1, 2}, 4);
  tp.top_p = 0;
  expect(tp, absl::StatusCode::kInvalidArgument, "top_p");
  const ServiceStats st = svc->stats();
  EXPECT_EQ(st.submitted, 0);
  EXPECT_EQ(st.outstanding_sequences, 0);
  EXPECT_TRUE(absl::IsNotFound(svc->Cancel(1)));
  // The service still serves.
  EXPECT_TRUE(svc->Complete(Req("p:prod", {1, 2}, 2)).ok());
}

TEST_F(ServingTest, ListModelsShowsTheBaseAndEveryAliasWithItsRevision) {
  const uint64_t a1 = Publish("alpha", 1);
  const uint64_t a2 = Publish("alpha", 2, "canary");
  const uint64_t b1 = Publish("beta", 3);
  std::unique_ptr<CompletionService> svc = NewService();
  ASSERT_NE(svc, nullptr);
  EXPECT_EQ(svc->base_name(), "tiny");
  absl::StatusOr<std::vector<ModelEntry>> models = svc->ListModels();
  ASSERT_TRUE(models.ok()) << models.status();
  std::vector<std::pair<std::string, uint64_t>> got;
  for (const ModelEntry& m : *models) got.emplace_back(m.id, m.revision);
  const std::vector<std::pair<std::string, uint64_t>> want = {
      {"tiny", 0}, {"alpha:canary", a2}, {"alpha:prod", a1}, {"beta:prod", b1}};
  EXPECT_EQ(got, want);
  EXPECT_EQ((*models)[1].policy, "alpha");
  EXPECT_EQ((*models)[1].alias, "canary");
}

}  // namespace
}  // namespace loradb::serving
