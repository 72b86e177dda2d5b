#include "common/logging.h"

#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

#include <unistd.h>

namespace shardline {

absl::Status InitLogging(const std::string& component, const std::string& level) {
  auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError("unknown log level '" + level +
                                      "' (use trace, debug, info, warn, error or off)");
  }
  auto logger = spdlog::stderr_color_mt("shardline-" + component + "-" + std::to_string(::getpid()));
  logger->set_pattern("%H:%M:%S.%e %^%L%$ [" + component + "] %v");
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace shardline
