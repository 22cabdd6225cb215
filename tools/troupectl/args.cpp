#include "tools/troupectl/args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "controller/core/validate.hpp"

namespace troupe::ctl {

namespace {

std::string in_quotes(const std::string& s) {
  return "\"" + s + "\"";
}

}  // namespace

Result<std::string> parse_app_name(const std::string& text, const std::string& arg) {
  if (!controller::valid_name(text)) {
    return Status(errc::invalid_argument,
                  arg + ": " + in_quotes(text) + " is not a valid application name");
  }
  return text;
}

Result<DeploymentRef> parse_deployment_ref(const std::string& text, const std::string& arg) {
  const auto slash = text.find('/');
  if (slash == std::string::npos) {
    return Status(errc::invalid_argument,
                  arg + ": " + in_quotes(text) +
                      " must name an application and one of its deployments as APP/DEPLOYMENT");
  }
  DeploymentRef ref{text.substr(0, slash), text.substr(slash + 1)};
  if (!controller::valid_name(ref.app)) {
    return Status(errc::invalid_argument, arg + ": " + in_quotes(text) + ": the application name " +
                                              in_quotes(ref.app) + " is not a valid name");
  }
  if (!controller::valid_name(ref.deployment)) {
    return Status(errc::invalid_argument, arg + ": " + in_quotes(text) + ": the deployment name " +
                                              in_quotes(ref.deployment) + " is not a valid name");
  }
  return ref;
}

Result<uint64_t> parse_count(const std::string& text, const std::string& arg, uint64_t max) {
  const std::string rule = "must be a whole number from 0 to " + std::to_string(max);
  if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos)
    return Status(errc::invalid_argument, arg + ": " + in_quotes(text) + " " + rule);
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v > max)
    return Status(errc::invalid_argument, arg + ": " + in_quotes(text) + " " + rule);
  return static_cast<uint64_t>(v);
}

Result<std::map<std::string, double>> parse_weights(const std::vector<std::string>& items) {
  std::map<std::string, double> out;
  if (items.empty()) {
    return Status(errc::invalid_argument,
                  "NAME=W: give at least one deployment and its weight, e.g. Hello=0.9 Canary=0.1");
  }
  for (const auto& item : items) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      return Status(errc::invalid_argument,
                    "NAME=W: " + in_quotes(item) + " must be a deployment name, '=' and a weight");
    }
    const std::string name = item.substr(0, eq);
    const std::string weight = item.substr(eq + 1);
    if (!controller::valid_name(name)) {
      return Status(errc::invalid_argument, "NAME=W: " + in_quotes(item) + ": " + in_quotes(name) +
                                                " is not a valid deployment name");
    }
    char* end = nullptr;
    errno = 0;
    const double w = weight.empty() ? 0 : std::strtod(weight.c_str(), &end);
    if (weight.empty() || end != weight.c_str() + weight.size() || errno == ERANGE ||
        !std::isfinite(w)) {
      return Status(errc::invalid_argument,
                    "NAME=W: " + in_quotes(item) + ": the weight " + in_quotes(weight) +
                        " must be a number (e.g. 0.25)");
    }
    if (!out.emplace(name, w).second) {
      return Status(errc::invalid_argument,
                    "NAME=W: " + in_quotes(name) + " is given more than once");
    }
  }
  return out;
}

}  // namespace troupe::ctl
