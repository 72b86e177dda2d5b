// The real Prometheus server scrapes a MetricsServer, loads the shipped rules, and accepts every
// query of the shipped Grafana dashboard.
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/process.h"
#include "gtest/gtest.h"
#include "monitoring/metrics.h"
#include "monitoring/metrics_server.h"
#include "monitoring/testing/http_get.h"
#include "nlohmann/json.hpp"

namespace shardline::monitoring {
namespace {

namespace fs = std::filesystem;
using testing::HttpGet;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr auto kWaitLimit = std::chrono::seconds(20);

// A port free right now. Prometheus has no "pick a port and tell me" mode; the short race with
// other processes taking it is acceptable in a test.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class MonitoringPrometheusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kPrometheus)) GTEST_SKIP() << kPrometheus << " is not installed";
    char dir_template[] = "/tmp/shardline-prometheus-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }

  void TearDown() override {
    if (pid_ > 0) Terminate(pid_, std::chrono::seconds(5));
    if (HasFailure() && !dir_.empty()) {
      std::cerr << "--- prometheus log ---\n" << ReadFile(dir_ / "prometheus.log");
    }
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Starts Prometheus scraping `target` every second, with the shipped rules loaded.
  void StartPrometheus(const std::string& target) {
    std::ofstream(dir_ / "targets.json")
        << R"([{"targets": [")" << target << R"("], "labels": {"cluster_role": "test"}}])";
    std::ofstream(dir_ / "prometheus.yml")
        << "global:\n"
           "  scrape_interval: 1s\n"
           "  evaluation_interval: 1s\n"
           "rule_files:\n"
           "  - " SHARDLINE_MONITORING_DIR
           "/prometheus/rules.yml\n"
           "scrape_configs:\n"
           "  - job_name: shardline-actor\n"
           "    honor_labels: true\n"  // as in monitoring/prometheus/prometheus.yml
           "    file_sd_configs:\n"
           "      - files: ['"
        << (dir_ / "targets.json").string() << "']\n";
    address_ = "127.0.0.1:" + std::to_string(FreePort());
    SpawnOptions options;
    options.argv = {kPrometheus, "--config.file=" + (dir_ / "prometheus.yml").string(),
                    "--storage.tsdb.path=" + (dir_ / "data").string(),
                    "--web.listen-address=" + address_, "--log.level=warn"};
    options.log_path = (dir_ / "prometheus.log").string();
    auto pid = Spawn(options);
    ASSERT_TRUE(pid.ok()) << pid.status();
    pid_ = *pid;
  }

  // GETs an API path and returns its "data" once "status" is "success".
  absl::StatusOr<nlohmann::json> Api(const std::string& path_and_query) {
    auto response = HttpGet(address_, path_and_query, std::chrono::seconds(2));
    if (!response.ok()) return response.status();
    const auto body = nlohmann::json::parse(response->body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded() || body.value("status", "") != "success") {
      return absl::InternalError(path_and_query + ": HTTP " + std::to_string(response->status) +
                                 ": " + response->body.substr(0, 300));
    }
    return body["data"];
  }

  absl::StatusOr<nlohmann::json> Query(const std::string& promql) {
    return Api("/api/v1/query?query=" + UrlEncode(promql));
  }

  // Polls `done` until it holds or kWaitLimit passes; the last error goes into `why`.
  bool WaitUntil(const std::function<bool(std::string& why)>& done, std::string& why) {
    const auto deadline = std::chrono::steady_clock::now() + kWaitLimit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (done(why)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  fs::path dir_;
  std::string address_;
  pid_t pid_ = -1;
};

TEST_F(MonitoringPrometheusTest, ScrapesOurServerEvaluatesRulesAndRunsDashboardQueries) {
  auto server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  const Labels labels = {{"component", "actor"}, {"job", "gpt-small"}, {"rank", "0"}};
  WireMetrics wire((*server)->registry(), labels);
  for (int i = 0; i < 7; ++i) wire.OnReceived("heartbeat");
  ActorMetrics actor((*server)->registry(), labels);
  actor.OnOperation("allreduce", 1 << 20, 0.001, true);
  actor.SetStep(42);

  StartPrometheus((*server)->address());
  if (HasFatalFailure()) return;

  // 1. Our samples arrive, with our `job` label kept (honor_labels).
  std::string why;
  const bool scraped = WaitUntil(
      [&](std::string& why) {
        auto data = Query(R"(shardline_messages_received_total{type="heartbeat"})");
        if (!data.ok()) {
          why = data.status().ToString();
          return false;
        }
        const auto& result = (*data)["result"];
        if (result.empty()) {
          why = "no sample yet";
          return false;
        }
        const auto& metric = result[0]["metric"];
        EXPECT_EQ(metric.value("job", ""), "gpt-small");
        EXPECT_EQ(metric.value("component", ""), "actor");
        EXPECT_EQ(metric.value("cluster_role", ""), "test");
        EXPECT_EQ(result[0]["value"][1], "7");
        return true;
      },
      why);
  ASSERT_TRUE(scraped) << "Prometheus never returned the sample within " << kWaitLimit.count()
                       << " s: " << why;
  auto step = Query(R"(shardline_actor_step{rank="0"})");
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_EQ((*step)["result"].size(), 1u);
  EXPECT_EQ((*step)["result"][0]["value"][1], "42");

  // 2. The shipped rules load and evaluate without error.
  const bool rules_ok = WaitUntil(
      [&](std::string& why) {
        auto data = Api("/api/v1/rules");
        if (!data.ok()) {
          why = data.status().ToString();
          return false;
        }
        int rules = 0;
        for (const auto& group : (*data)["groups"]) {
          for (const auto& rule : group["rules"]) {
            ++rules;
            const std::string health = rule.value("health", "");
            if (health != "ok") {
              why = rule.value("name", "?") + " is " + health + ": " + rule.value("lastError", "");
              return false;
            }
          }
        }
        if (rules == 0) why = "no rules loaded";
        return rules > 0;
      },
      why);
  EXPECT_TRUE(rules_ok) << why;

  // 3. Every query of the dashboard parses and runs, with Grafana's variables filled in.
  const std::string dashboard =
      ReadFile(SHARDLINE_MONITORING_DIR "/grafana/shardline-dashboard.json");
  const auto json = nlohmann::json::parse(dashboard);
  int queries = 0;
  for (const auto& panel : json["panels"]) {
    for (const auto& target : panel.value("targets", nlohmann::json::array())) {
      const std::string expr =
          absl::StrReplaceAll(target["expr"].get<std::string>(),
                              {{"$__rate_interval", "1m"}, {"$job", ".*"}, {"$node", ".*"}});
      auto result = Query(expr);
      EXPECT_TRUE(result.ok()) << "panel \"" << panel["title"].get<std::string>()
                               << "\": " << result.status();
      ++queries;
    }
  }
  EXPECT_GT(queries, 20);
}

}  // namespace
}  // namespace shardline::monitoring
