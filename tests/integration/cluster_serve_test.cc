// `kind: serve` on a real cluster: a coordinator, an agent and its actors as processes of the built
// binary, the service reached over HTTP as a client would. Its greedy completions are what
// `shardline generate` prints, on tp × pp actors placed by the coordinator; `shardline status`
// shows the URL, the plan and live counters; a cancelled service closes its port; a killed actor
// fails the request in flight with a 503 that says why (never a hang) and the supervisor brings
// the service back on the same address; `parallel: auto` plans the layout; a layout the model
// cannot take, a missing checkpoint or a cache no device holds are refused at submit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/integration/local_cluster.h"
#include "tests/support/tiny_ascii_gpt.h"

namespace shardline::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kModel[] = "tiny";
const std::vector<std::string> kPrompts = {"the cat ", "hello world", "q"};
constexpr int kTokens = 20;

// A serve job of the tiny model; `extra` is appended (more keys).
std::string ServeJob(const std::string& name, const std::string& checkpoint, int tp, int pp,
                     const std::string& extra = "") {
  return "name: " + name + "\nkind: serve\ndevices: cpu\ncheckpoint: " + checkpoint +
         "\nmodel_name: " + kModel + "\nparallel: {tp: " + std::to_string(tp) +
         ", pp: " + std::to_string(pp) +
         "}\nlisten: 127.0.0.1:0\nbootstrap_timeout_s: 60\n"
         "limits: {max_running: 4, max_tokens_per_step: 64, block_size: 8}\n" +
         extra;
}

bool Serving(const json& job) {
  return job["state"] == "running" && job.contains("serving") &&
         job["serving"]["ready"].get<bool>() && !job["serving"]["url"].get<std::string>().empty();
}

bool Ended(const json& job) { return job["state"] != "running" && job["state"] != "pending"; }

pid_t PidOfRank(const json& job, int rank) {
  for (const auto& actor : job["actors"]) {
    if (actor["rank"] == rank) return actor["pid"].get<pid_t>();
  }
  return 0;
}

struct Reply {
  int status = 0;  // 0: no response (refused, reset)
  std::string body;
};

Reply PostCompletion(const std::string& url, const std::string& prompt, int max_tokens,
                     std::chrono::seconds timeout = 60s) {
  httplib::Client client(url);
  client.set_connection_timeout(5);
  client.set_read_timeout(static_cast<time_t>(timeout.count()));
  const json body = {
      {"model", kModel}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  auto result = client.Post("/v1/completions", body.dump(), "application/json");
  if (!result) return {};
  return {result->status, result->body};
}

// The completion's text; "" (and a failure) when the reply is not a 200 with one.
std::string CompletionText(const Reply& reply) {
  EXPECT_EQ(reply.status, 200) << reply.body;
  if (reply.status != 200) return "";
  const json parsed = json::parse(reply.body, nullptr, false);
  if (parsed.is_discarded() || !parsed.contains("choices")) {
    ADD_FAILURE() << "not a completion: " << reply.body;
    return "";
  }
  return parsed["choices"][0]["text"].get<std::string>();
}

class ClusterServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = test_support::ExportTinyAsciiGpt(cluster_.dir() + "/tiny");
    ASSERT_TRUE(cluster_.StartCoordinator().ok());
    // Four devices on any machine: a tp 2 × pp 2 service time-shares the cores.
    ASSERT_TRUE(cluster_.StartAgent("node-a", "cpu:4").ok());
    ASSERT_TRUE(cluster_.WaitForAliveNodes(1, 15s).ok());
  }

  // What `shardline generate` prints after `prompt` (one byte a token).
  std::string Generated(const std::string& prompt) {
    const CommandResult run = RunShardline({"generate", "--checkpoint", model_, "--prompt", prompt,
                                            "--max-new-tokens", std::to_string(kTokens)});
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(run.output.rfind(prompt, 0), 0u) << run.output;
    if (run.output.size() < prompt.size() + 1) return "";
    return run.output.substr(prompt.size(), run.output.size() - prompt.size() - 1);
  }

  // Submits `yaml` and waits until it serves; the job's status then.
  json StartService(const std::string& yaml) {
    auto id = cluster_.Submit(yaml);
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return json();
    auto job = cluster_.WaitForJob(
        *id, [](const json& j) { return Serving(j) || Ended(j); }, 120s);
    EXPECT_TRUE(job.ok()) << job.status() << cluster_.Log("coordinator");
    if (!job.ok()) return json();
    EXPECT_TRUE(Serving(*job)) << job->dump(2) << cluster_.Log("coordinator");
    return *job;
  }

  void Cancel(const std::string& job_id) {
    const CommandResult cancel = RunShardline(
        {"cancel", "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir(), job_id});
    EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
    auto ended = cluster_.WaitForJobEnd(job_id, 30s);
    ASSERT_TRUE(ended.ok()) << ended.status();
    EXPECT_EQ((*ended)["state"], "cancelled");
  }

  LocalCluster cluster_;
  std::string model_;
};

TEST_F(ClusterServeTest, ShardedServiceAnswersAsGenerateAndShowsInStatus) {
  std::vector<std::string> expected;
  for (const std::string& prompt : kPrompts) expected.push_back(Generated(prompt));
  struct Layout {
    int tp, pp;
  };
  for (const Layout layout : {Layout{2, 1}, Layout{1, 2}, Layout{2, 2}}) {
    SCOPED_TRACE("tp " + std::to_string(layout.tp) + ", pp " + std::to_string(layout.pp));
    const json job = StartService(ServeJob("svc", model_, layout.tp, layout.pp));
    if (!Serving(job)) return;
    const std::string id = job["job_id"];
    const std::string url = job["serving"]["url"];
    EXPECT_EQ(job["kind"], "serve");
    EXPECT_EQ(job["world_size"], layout.tp * layout.pp);
    EXPECT_EQ(job["serving"]["tp"], layout.tp);
    EXPECT_EQ(job["serving"]["pp"], layout.pp);
    EXPECT_EQ(job["serving"]["model"], kModel);
    EXPECT_EQ(job["serving"]["max_running"], 4);
    EXPECT_GT(job["serving"]["kv_blocks"].get<int64_t>(), 0);
    // Concurrent requests: the batch must not change what greedy decoding says.
    std::vector<std::future<Reply>> replies;
    for (const std::string& prompt : kPrompts) {
      replies.push_back(std::async(std::launch::async, PostCompletion, url, prompt, kTokens, 60s));
    }
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      EXPECT_EQ(CompletionText(replies[i].get()), expected[i]) << kPrompts[i];
    }
    // The leader reports every second: the counters reach status.
    auto counted = cluster_.WaitForJob(
        id,
        [](const json& j) {
          return Ended(j) || j["serving"]["tokens_generated"].get<int64_t>() >=
                                 static_cast<int64_t>(kPrompts.size()) * kTokens;
        },
        15s);
    ASSERT_TRUE(counted.ok()) << counted.status();
    EXPECT_EQ((*counted)["state"], "running");
    const CommandResult status = RunShardline(
        {"status", "--coordinator", cluster_.endpoint(), "--keys", cluster_.key_dir(), id});
    EXPECT_EQ(status.exit_code, 0) << status.output;
    EXPECT_THAT(status.output, HasSubstr("serving tp " + std::to_string(layout.tp) + " x pp " +
                                         std::to_string(layout.pp) + ": tiny at " + url + "/v1"));
    EXPECT_THAT(status.output, HasSubstr("tokens generated"));
    Cancel(id);
    // The service goes with its job: within the leader's stop grace it may still answer, with a
    // 503, and then nothing answers at its address.
    const auto gone_by = Clock::now() + 10s;
    Reply late = PostCompletion(url, "x", 1, 5s);
    while (late.status != 0 && Clock::now() < gone_by) {
      EXPECT_EQ(late.status, 503) << late.body;
      std::this_thread::sleep_for(50ms);
      late = PostCompletion(url, "x", 1, 5s);
    }
    EXPECT_EQ(late.status, 0) << "the service outlived its job: " << late.body;
  }
}

TEST_F(ClusterServeTest, KilledActorFailsTheRequestInFlightAndTheServiceComesBack) {
  const std::string expected = Generated(kPrompts[0]);
  const json job = StartService(ServeJob("svc", model_, 2, 1, "elastic: {max_restarts: 3}\n"));
  if (!Serving(job)) return;
  const std::string id = job["job_id"];
  const std::string url = job["serving"]["url"];
  EXPECT_EQ(CompletionText(PostCompletion(url, kPrompts[0], kTokens)), expected);

  // Rank 1 stopped, the request cannot finish: it is in flight when rank 1 is killed.
  const pid_t follower = PidOfRank(job, 1);
  ASSERT_GT(follower, 0);
  ASSERT_EQ(::kill(follower, SIGSTOP), 0);
  auto in_flight = std::async(std::launch::async, PostCompletion, url, kPrompts[0], kTokens, 120s);
  EXPECT_EQ(in_flight.wait_for(1500ms), std::future_status::timeout)
      << "the request finished while rank 1 was stopped";
  const auto killed = Clock::now();
  ASSERT_EQ(::kill(follower, SIGKILL), 0);
  // Fast: the leader's collective sees the dead peer at once (well inside its 120 s timeout).
  ASSERT_EQ(in_flight.wait_for(60s), std::future_status::ready) << "the request hangs";
  const Reply failed = in_flight.get();
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  EXPECT_LT(seconds, 30.0) << "the request failed only after a timeout";
  // A 503 naming the failure: the coordinator aborts the generation as soon as the agent reports
  // rank 1's death, but the leader's agent gives it a grace (SIGTERM, then SIGKILL 500 ms later)
  // to answer first. Before that grace the leader was now and then killed before it wrote the
  // 503 (once in 5 suite runs), and the client saw a reset connection.
  EXPECT_EQ(failed.status, 503) << failed.body;
  EXPECT_THAT(failed.body, AnyOf(HasSubstr("the serving group failed"),
                                 HasSubstr("aborted by its supervisor")));

  // The supervisor restarts the generation, which serves again on the same address.
  auto back = cluster_.WaitForJob(
      id, [](const json& j) { return Ended(j) || (j["generation"] == 2 && Serving(j)); }, 120s);
  ASSERT_TRUE(back.ok()) << back.status() << cluster_.Log("coordinator");
  ASSERT_TRUE(Serving(*back)) << back->dump(2) << cluster_.Log("coordinator");
  EXPECT_EQ((*back)["serving"]["url"], url);
  EXPECT_EQ(CompletionText(PostCompletion(url, kPrompts[0], kTokens)), expected);
  const json& first = (*back)["serving"]["generations"][0];
  EXPECT_EQ(first["ending"], "fault");
  EXPECT_THAT(first["cause"].get<std::string>(), HasSubstr("rank 1"));
  EXPECT_THAT(first["cause"].get<std::string>(), HasSubstr("SIGKILL"));
  EXPECT_GE(first["recovery_seconds"].get<double>(), 0.0);
  Cancel(id);
}

// The leader's stop grace is bounded: a leader that cannot answer its agent's SIGTERM (stopped
// here) gets SIGKILL when the grace has run out, and the job still ends.
TEST_F(ClusterServeTest, ALeaderThatCannotAnswerIsKilledWhenItsGraceRunsOut) {
  const json job = StartService(ServeJob("svc", model_, 1, 1));
  if (!Serving(job)) return;
  const pid_t leader = PidOfRank(job, 0);
  ASSERT_GT(leader, 0);
  ASSERT_EQ(::kill(leader, SIGSTOP), 0);
  const auto cancelled = Clock::now();
  Cancel(job["job_id"]);
  // Gone (a zombie reaped by its agent) within the grace and the agent's 20 ms loop, with room.
  const auto gone_by = cancelled + 10s;
  while (::kill(leader, 0) == 0 && Clock::now() < gone_by) std::this_thread::sleep_for(20ms);
  EXPECT_NE(::kill(leader, 0), 0) << "the stopped leader outlived its grace";
  const double seconds = std::chrono::duration<double>(Clock::now() - cancelled).count();
  EXPECT_GE(seconds, 0.4) << "killed before its grace (500 ms) ran out";
}

// A coordinator killed while it supervises a service takes it over from its state dir: the next
// generation serves at the same address (the port `listen: ...:0` got, from the job's record),
// planned again for `parallel: auto` from the checkpoint's shape kept there.
TEST_F(ClusterServeTest, AKilledCoordinatorTakesTheServiceOverAtTheSameAddress) {
  const std::string expected = Generated(kPrompts[0]);
  std::string yaml = ServeJob("svc", model_, 1, 1, "elastic: {max_restarts: 3}\n");
  yaml.replace(yaml.find("parallel: {tp: 1, pp: 1}"), 24, "parallel: auto");
  const json job = StartService(yaml);
  if (!Serving(job)) return;
  const std::string id = job["job_id"];
  const std::string url = job["serving"]["url"];
  ASSERT_TRUE(cluster_.RestartCoordinator().ok());
  auto back = cluster_.WaitForJob(
      id, [](const json& j) { return Ended(j) || (j["generation"] >= 2 && Serving(j)); }, 120s);
  ASSERT_TRUE(back.ok()) << back.status() << cluster_.Log("coordinator");
  ASSERT_TRUE(Serving(*back)) << back->dump(2) << cluster_.Log("coordinator");
  EXPECT_EQ((*back)["serving"]["url"], url);
  EXPECT_THAT((*back)["serving"]["plan_summary"].get<std::string>(),
              HasSubstr("parallel: auto: tp 1 x pp 1, "));
  EXPECT_EQ((*back)["serving"]["generations"][0]["cause_kind"], "coordinator_restart");
  EXPECT_EQ(CompletionText(PostCompletion(url, kPrompts[0], kTokens)), expected);
  Cancel(id);
}

TEST_F(ClusterServeTest, AutoPlansTheLayoutFromTheCheckpointAndTheDevices) {
  const std::string expected = Generated(kPrompts[0]);
  std::string yaml = ServeJob("svc", model_, 1, 1);
  yaml.replace(yaml.find("parallel: {tp: 1, pp: 1}"), 24, "parallel: auto");
  const json job = StartService(yaml);
  if (!Serving(job)) return;
  // The tiny model fits one device: the fewest devices win.
  EXPECT_EQ(job["world_size"], 1);
  EXPECT_EQ(job["serving"]["tp"], 1);
  EXPECT_EQ(job["serving"]["pp"], 1);
  EXPECT_THAT(job["serving"]["plan_summary"].get<std::string>(),
              HasSubstr("parallel: auto: tp 1 x pp 1, "));
  EXPECT_EQ(CompletionText(PostCompletion(job["serving"]["url"], kPrompts[0], kTokens)), expected);
  Cancel(job["job_id"]);
}

TEST_F(ClusterServeTest, WhatCannotBeServedIsRefusedAtSubmitSayingWhy) {
  // The tiny model has 2 heads: tp 4 cannot split them.
  auto split = cluster_.Submit(ServeJob("svc", model_, 4, 1));
  ASSERT_FALSE(split.ok());
  EXPECT_THAT(split.status().message(), HasSubstr("tp 4 must divide the 2 heads"));

  auto missing = cluster_.Submit(ServeJob("svc", cluster_.dir() + "/no-such-model", 1, 1));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("the serve job's checkpoint"));
  EXPECT_THAT(missing.status().message(), HasSubstr("no-such-model"));

  // A cache larger than any device: refused with the shortfall, before a rank tries to allocate.
  std::string huge = ServeJob("svc", model_, 1, 1);
  huge.replace(huge.find("block_size: 8}"), 14, "block_size: 8, kv_cache: 64TiB}");
  auto big = cluster_.Submit(huge);
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(big.status().message(), HasSubstr("each rank of tp 1 x pp 1 needs"));
  EXPECT_THAT(big.status().message(), HasSubstr("the largest cpu device has"));
  EXPECT_THAT(big.status().message(), HasSubstr("short"));

  // What the spec alone shows wrong is refused at parse, naming the line.
  std::string yaml = ServeJob("svc", model_, 1, 1);
  yaml.replace(yaml.find("listen: 127.0.0.1:0"), 19, "listen: nowhere");
  auto listen = cluster_.Submit(yaml);
  ASSERT_FALSE(listen.ok());
  EXPECT_THAT(listen.status().message(), HasSubstr("listen: 'nowhere' is not HOST:PORT"));

  // None of them left a job behind.
  auto status = cluster_.Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE((*status)["jobs"].empty()) << status->dump(2);
}

}  // namespace
}  // namespace shardline::testing
