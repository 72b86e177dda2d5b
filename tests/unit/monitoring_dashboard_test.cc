// The shipped Grafana dashboard and Prometheus rules against the metric families the code really
// registers: a renamed or dropped metric fails here, not on someone's empty panel.
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "monitoring/metrics.h"
#include "nlohmann/json.hpp"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "yaml-cpp/yaml.h"

namespace shardline::monitoring {
namespace {

const std::string kDashboardPath = SHARDLINE_MONITORING_DIR "/grafana/shardline-dashboard.json";
const std::string kRulesPath = SHARDLINE_MONITORING_DIR "/prometheus/rules.yml";

// Every family the four structs register, by name, after touching every method once (families
// of open labels have no series, and so are not exported, until first used).
std::map<std::string, prometheus::MetricFamily> RegisteredFamilies() {
  auto registry = std::make_shared<prometheus::Registry>();
  WireMetrics wire(registry, {});
  wire.OnReceived("x");
  wire.OnSent("x");
  wire.OnDecodeError("garbage");
  CoordinatorMetrics coordinator(registry, {});
  coordinator.SetNodes({{"alive", 1}});
  coordinator.SetDevices({{{"cpu", "free"}, 1}});
  coordinator.SetActors({});
  coordinator.SetJobs({});
  coordinator.OnHeartbeatMissed();
  coordinator.OnKvOperation("get");
  coordinator.OnGeneration("completed");
  coordinator.ObserveBootstrap("world", 1);
  coordinator.SetTrainJobs({{"job-1", {1, 2.5, 100}}});
  AgentMetrics agent(registry, {});
  agent.SetActorsRunning(1);
  agent.OnActorExit("success");
  agent.OnHeartbeatSent();
  agent.OnCoordinatorLost();
  ActorMetrics actor(registry, {});
  actor.OnOperation("allreduce", 1, 1, true);
  actor.OnOperation("allreduce", 1, 1, false);
  actor.SetStep(1);
  actor.SetLoss(1);
  actor.OnNetworkBytes("dp", 1, 1);
  std::map<std::string, prometheus::MetricFamily> families;
  for (auto& family : registry->Collect()) families[family.name] = family;
  return families;
}

struct MetricRefs {
  std::set<std::string> metrics;   // family names, histogram suffixes removed
  std::set<std::string> recorded;  // recording-rule names (level:metric:operation)
};

// The metric names one PromQL expression reads. Strings are dropped first so that label values
// are never taken for names; a name must not follow a letter, digit or colon, so "[5m:1m]"
// yields nothing.
void CollectRefs(const std::string& expr,
                 const std::map<std::string, prometheus::MetricFamily>& families,
                 MetricRefs& refs) {
  const std::string code = std::regex_replace(expr, std::regex(R"("([^"\\]|\\.)*")"), "\"\"");
  static const std::regex kName(R"((^|[^A-Za-z0-9_:])([A-Za-z_][A-Za-z0-9_:]*))");
  for (auto it = std::sregex_iterator(code.begin(), code.end(), kName);
       it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[2];
    if (name.find(':') != std::string::npos) {
      refs.recorded.insert(name);
    } else if (absl::StartsWith(name, "shardline_")) {
      std::string base = name;
      for (const std::string suffix : {"_bucket", "_sum", "_count"}) {
        const std::string stem = name.substr(0, name.size() - suffix.size());
        if (absl::EndsWith(name, suffix) && families.count(stem) != 0 &&
            families.at(stem).type == prometheus::MetricType::Histogram) {
          base = stem;
        }
      }
      refs.metrics.insert(base);
    }
  }
}

nlohmann::json LoadDashboard() {
  std::ifstream in(kDashboardPath);
  EXPECT_TRUE(in.good()) << "cannot open " << kDashboardPath;
  return nlohmann::json::parse(in);  // throws, failing the test, on invalid JSON
}

struct Rule {
  std::string name;  // record or alert name
  bool recording = false;
  std::string expr;
};

std::vector<Rule> LoadRules() {
  std::vector<Rule> rules;
  const YAML::Node root = YAML::LoadFile(kRulesPath);
  for (const auto& group : root["groups"]) {
    for (const auto& rule : group["rules"]) {
      Rule r;
      r.recording = static_cast<bool>(rule["record"]);
      r.name = (r.recording ? rule["record"] : rule["alert"]).as<std::string>();
      r.expr = rule["expr"].as<std::string>();
      rules.push_back(r);
    }
  }
  return rules;
}

TEST(MonitoringNamesTest, FollowPrometheusNamingRules) {
  const auto families = RegisteredFamilies();
  ASSERT_EQ(families.size(), 32u) << "a family was added or lost: update this test, the "
                                     "dashboard and the rules together";
  for (const auto& [name, family] : families) {
    EXPECT_TRUE(absl::StartsWith(name, "shardline_")) << name;
    EXPECT_FALSE(family.help.empty()) << name << " has no help text";
    switch (family.type) {
      case prometheus::MetricType::Counter:
        EXPECT_TRUE(absl::EndsWith(name, "_total")) << "counter " << name;
        break;
      case prometheus::MetricType::Histogram:
        EXPECT_TRUE(absl::EndsWith(name, "_seconds")) << "histogram " << name;
        break;
      default:
        EXPECT_FALSE(absl::EndsWith(name, "_total")) << "non-counter " << name;
    }
  }
}

TEST(MonitoringDashboardTest, IsAnImportableGrafanaDashboard) {
  const nlohmann::json dashboard = LoadDashboard();
  ASSERT_TRUE(dashboard.contains("__inputs"));
  bool has_input = false;
  for (const auto& input : dashboard["__inputs"]) {
    has_input |= input["name"] == "DS_PROMETHEUS" && input["pluginId"] == "prometheus";
  }
  EXPECT_TRUE(has_input) << "import needs a DS_PROMETHEUS datasource input";
  EXPECT_GE(dashboard["schemaVersion"].get<int>(), 36);
  EXPECT_FALSE(dashboard.value("uid", "").empty());

  std::set<int> ids;
  int queries = 0;
  for (const auto& panel : dashboard["panels"]) {
    const std::string title = panel.value("title", "");
    EXPECT_TRUE(ids.insert(panel["id"].get<int>()).second) << "duplicate panel id: " << title;
    const auto& grid = panel["gridPos"];
    EXPECT_LE(grid["x"].get<int>() + grid["w"].get<int>(), 24) << title;
    if (panel["type"] == "row") continue;
    EXPECT_EQ(panel["datasource"]["uid"], "${DS_PROMETHEUS}") << title;
    ASSERT_FALSE(panel["targets"].empty()) << title;
    for (const auto& target : panel["targets"]) {
      EXPECT_FALSE(target.value("expr", "").empty()) << title;
      EXPECT_EQ(target["datasource"]["uid"], "${DS_PROMETHEUS}") << title;
      ++queries;
    }
  }
  EXPECT_GT(queries, 20);
}

TEST(MonitoringDashboardTest, ReadsOnlyMetricsTheCodeExportsOrTheRulesRecord) {
  const auto families = RegisteredFamilies();
  std::set<std::string> recorded;
  for (const auto& rule : LoadRules()) {
    if (rule.recording) recorded.insert(rule.name);
  }
  const nlohmann::json dashboard = LoadDashboard();
  auto check = [&](const std::string& where, const std::string& expr) {
    MetricRefs refs;
    CollectRefs(expr, families, refs);
    EXPECT_FALSE(refs.metrics.empty() && refs.recorded.empty())
        << where << " reads no Shardline metric: " << expr;
    for (const auto& name : refs.metrics) {
      EXPECT_EQ(families.count(name), 1u)
          << where << " reads " << name << ", which monitoring/metrics.cc does not register";
    }
    for (const auto& name : refs.recorded) {
      EXPECT_EQ(recorded.count(name), 1u)
          << where << " reads " << name << ", which rules.yml does not record";
    }
  };
  for (const auto& panel : dashboard["panels"]) {
    for (const auto& target : panel.value("targets", nlohmann::json::array())) {
      check("panel \"" + panel["title"].get<std::string>() + "\"", target["expr"]);
    }
  }
  for (const auto& variable : dashboard["templating"]["list"]) {
    check("variable $" + variable["name"].get<std::string>(), variable["definition"]);
  }
}

TEST(MonitoringRulesTest, ReadOnlyMetricsTheCodeExports) {
  const auto families = RegisteredFamilies();
  std::set<std::string> recorded;
  const std::vector<Rule> rules = LoadRules();
  for (const auto& rule : rules) {
    if (rule.recording) recorded.insert(rule.name);
  }
  for (const auto& rule : rules) {
    MetricRefs refs;
    CollectRefs(rule.expr, families, refs);
    for (const auto& name : refs.metrics) {
      EXPECT_EQ(families.count(name), 1u) << rule.name << " reads unregistered " << name;
    }
    for (const auto& name : refs.recorded) {
      EXPECT_EQ(recorded.count(name), 1u) << rule.name << " reads unrecorded " << name;
    }
  }
}

TEST(MonitoringDashboardTest, ShowsEveryRegisteredFamily) {
  const auto families = RegisteredFamilies();
  std::map<std::string, std::string> recorded_exprs;
  for (const auto& rule : LoadRules()) {
    if (rule.recording) recorded_exprs[rule.name] = rule.expr;
  }
  MetricRefs shown;
  const nlohmann::json dashboard = LoadDashboard();
  for (const auto& panel : dashboard["panels"]) {
    for (const auto& target : panel.value("targets", nlohmann::json::array())) {
      CollectRefs(target["expr"], families, shown);
    }
  }
  // A panel that reads a recording rule shows the metrics that rule reads.
  for (const auto& name : shown.recorded) {
    if (recorded_exprs.count(name) != 0) CollectRefs(recorded_exprs[name], families, shown);
  }
  for (const auto& [name, family] : families) {
    EXPECT_EQ(shown.metrics.count(name), 1u) << name << " is on no dashboard panel";
  }
}

}  // namespace
}  // namespace shardline::monitoring
