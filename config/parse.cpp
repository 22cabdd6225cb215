// The parser's document and sections: the text and its one YAML document,
// the top level, http_options, applications, their deployments and
// autoscaling_config, traffic and shadow (parse_internal.hpp); and
// parse_config.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "config/config.hpp"
#include "config/parse_internal.hpp"
#include "config/scalars.hpp"
#include "controller/core/model.hpp"
#include "controller/core/validate.hpp"
#include "replica/plugin/import_path.hpp"

namespace troupe::config::detail {

namespace {

// Field names. Order is the order to_yaml (emit.cpp) writes them in.

const std::vector<std::string> kTopFields = {"http_options", "target_capacity", "applications"};
const std::vector<std::string> kHttpFields = {"host", "port", "request_timeout_s",
                                              "keep_alive_timeout_s"};
const std::vector<std::string> kAppFields = {"name",   "route_prefix",   "import_path",
                                             "args",   "traffic",        "traffic_key_header",
                                             "shadow", "open_inference", "deployments"};
const std::vector<std::string> kDeploymentFields = {"name",
                                                    "import_path",
                                                    "args",
                                                    "version",
                                                    "num_replicas",
                                                    "max_ongoing_requests",
                                                    "max_queued_requests",
                                                    "user_config",
                                                    "autoscaling_config",
                                                    "health_check_period_s",
                                                    "health_check_timeout_s",
                                                    "graceful_shutdown_wait_loop_s",
                                                    "graceful_shutdown_timeout_s",
                                                    "resources",
                                                    "max_replicas_per_node",
                                                    "isolation",
                                                    "memory_limit",
                                                    "stuck_after_s",
                                                    "max_num_models_per_replica",
                                                    "force_stop_unhealthy_replicas",
                                                    "max_batch_size",
                                                    "batch_wait_timeout_s"};
const std::vector<std::string> kAutoscalingFields = {"min_replicas",
                                                     "max_replicas",
                                                     "initial_replicas",
                                                     "target_ongoing_requests",
                                                     "metrics_interval_s",
                                                     "look_back_period_s",
                                                     "smoothing_factor",
                                                     "upscale_smoothing_factor",
                                                     "downscale_smoothing_factor",
                                                     "upscale_delay_s",
                                                     "downscale_delay_s"};

// The value of a mapping's `name` key when it is a scalar, else "".
std::string peek_name(const YAML::Node& map) {
  for (const auto& entry : map) {
    if (entry.first.IsScalar() && entry.first.Scalar() == "name" && entry.second.IsScalar())
      return entry.second.Scalar();
  }
  return "";
}

const char* const kNameRule =
    "must be 1-100 characters without '#', '/', spaces or control "
    "characters";

// The first character of the text that YAML does not allow: a byte that is
// not part of well-formed UTF-8 (no overlong forms, surrogates or code points
// past U+10FFFF), or a character outside YAML's printable set (the C0 and C1
// controls but tab, LF, CR and NEL; DEL; U+FFFE, U+FFFF). yaml-cpp checks
// neither, and its emitter replaces bad bytes, so such text would not print
// back as it was read.
struct BadText {
  size_t at = std::string::npos;
  bool utf8 = true;   // false: not UTF-8 at `at`
  uint32_t code = 0;  // else the character
};

BadText first_bad_character(const std::string& text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = b[i];
    size_t len = 1;
    uint32_t cp = c;
    if (c >= 0x80) {
      if ((c & 0xE0) == 0xC0) {
        len = 2;
        cp = c & 0x1F;
      } else if ((c & 0xF0) == 0xE0) {
        len = 3;
        cp = c & 0x0F;
      } else if ((c & 0xF8) == 0xF0) {
        len = 4;
        cp = c & 0x07;
      } else {
        return {i, false, 0};
      }
      if (i + len > n)
        return {i, false, 0};
      for (size_t k = 1; k < len; ++k) {
        if ((b[i + k] & 0xC0) != 0x80)
          return {i, false, 0};
        cp = (cp << 6) | (b[i + k] & 0x3F);
      }
      static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return {i, false, 0};
    }
    const bool printable = cp == 0x09 || cp == 0x0A || cp == 0x0D || (cp >= 0x20 && cp <= 0x7E) ||
                           cp == 0x85 || (cp >= 0xA0 && cp <= 0xD7FF) ||
                           (cp >= 0xE000 && cp <= 0xFFFD) || cp >= 0x10000;
    if (!printable)
      return {i, true, cp};
    i += len;
  }
  return {};
}

// Where a document starts, and where its first node is (the parser's
// events; nothing is kept).
class DocumentMarks : public YAML::EventHandler {
 public:
  std::optional<YAML::Mark> start;
  std::optional<YAML::Mark> node;
  void OnDocumentStart(const YAML::Mark& m) override {
    if (!start)
      start = m;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { first(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { first(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                const std::string&) override {
    first(m);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    first(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    first(m);
  }
  void OnMapEnd() override {}

 private:
  void first(const YAML::Mark& m) {
    if (!node)
      node = m;
  }
};

}  // namespace

Result<DeployConfig> Parser::run(const std::string& text) {
  YAML::Node top;
  if (!check_text(text) || !load_document(text, top))
    return error_;
  if (top.IsNull()) {
    return Status(errc::invalid_argument,
                  file_ + " is empty: expected a mapping with 'applications'");
  }
  if (!top.IsMap()) {
    fail(top.Mark(),
         "expected a mapping with 'applications' at the top level, got " + describe(top));
    return error_;
  }
  Fields fields;
  if (!read_fields(top, kTopFields, "at the top level", fields))
    return error_;

  DeployConfig& config = config_;
  if (const Field* f = fields.given("http_options")) {
    if (!http_options(f->value, config.http, config.state.http))
      return error_;
  }
  if (const Field* f = fields.given("target_capacity")) {
    double v = 0;
    if (!get_number(*f, "target_capacity", "a number from 0 to 100", Bounds{0, true, 100}, v))
      return error_;
    config.state.target_capacity = v;
  }
  const Field* apps = fields.get("applications");
  if (!apps) {
    fail(top.Mark(),
         "missing field 'applications' at the top level (use 'applications: []' "
         "to declare none)");
    return error_;
  }
  if (!applications(*apps, config.state))
    return error_;

  // The controller's own rules, so that a config that parses is one the
  // controller accepts; anything caught only here has no position.
  Status valid = controller::validate(config.state);
  if (!valid)
    return Status(errc::invalid_argument, file_ + ": " + valid.message());
  return std::move(config);
}

// Refuses text that YAML does not allow, at its first bad character.
bool Parser::check_text(const std::string& text) {
  BadText bad = first_bad_character(text);
  if (bad.at == std::string::npos)
    return true;
  // (text[bad.at] is not a newline: rfind finds the one before it, if any.)
  size_t line_start = text.rfind('\n', bad.at);
  line_start = line_start == std::string::npos ? 0 : line_start + 1;
  YAML::Mark at;
  at.pos = static_cast<int>(bad.at);
  at.line = static_cast<int>(std::count(text.begin(), text.begin() + bad.at, '\n'));
  at.column = static_cast<int>(bad.at - line_start);
  char what[96];
  if (!bad.utf8) {
    std::snprintf(what, sizeof(what), "not UTF-8 text (byte 0x%02x)",
                  static_cast<unsigned char>(text[bad.at]));
  } else {
    std::snprintf(what, sizeof(what),
                  "character U+%04X is not allowed in YAML text (escape it in double quotes)",
                  bad.code);
  }
  return fail(at, what);
}

// One document: Load reads the first, and the parser is asked for at most
// one more. (Not LoadAll: in yaml-cpp 0.7, Debian 12's, it loops for ever,
// allocating, on some malformed input such as a stray ',' after a
// document, whose parser keeps handing out an empty document without
// consuming the token; found by tests/fuzz/config_fuzz.cpp.)
bool Parser::load_document(const std::string& text, YAML::Node& top) {
  std::optional<DocumentMarks> second;
  try {
    top = YAML::Load(text);
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentMarks first;
    if (parser.HandleNextDocument(first)) {
      DocumentMarks next;
      if (parser.HandleNextDocument(next))
        second = next;
    }
  } catch (const YAML::ParserException& e) {
    return fail(e.mark, "YAML syntax error: " + e.msg);
  }
  if (second) {
    const YAML::Mark start = second->start.value_or(YAML::Mark());
    const bool separator =
        start.pos >= 0 && text.compare(static_cast<size_t>(start.pos), 3, "---") == 0;
    return fail(second->node.value_or(start),
                separator ? "a second YAML document ('---'): expected exactly one"
                          : "more after the first YAML document: expected exactly one");
  }
  return true;
}

// The top level's `applications`: each application, names and route
// prefixes unique.
bool Parser::applications(const Field& f, controller::TargetState& state) {
  if (!f.value.IsSequence()) {
    return fail(mark_of(f),
                "applications: expected a sequence of applications, got " + describe(f.value));
  }
  std::map<std::string, YAML::Mark> names;
  std::map<std::string, std::string> prefixes;  // route_prefix -> application
  size_t index = 0;
  for (const auto& item : f.value) {
    ApplicationSpec app;
    if (!application(item, index++, app))
      return false;
    auto [it, inserted] = names.emplace(app.name, item.Mark());
    if (!inserted) {
      return fail(item.Mark(), "duplicate application name " + in_quotes(app.name) + " (first at " +
                                   position_text(it->second) + ")");
    }
    auto [prefix, fresh] = prefixes.emplace(app.route_prefix, app.name);
    if (!fresh) {
      YAML::Mark at = item.Mark();
      for (const auto& entry : item) {
        if (entry.first.IsScalar() && entry.first.Scalar() == "route_prefix")
          at = entry.second.Mark();
      }
      return fail(at, "route_prefix " + in_quotes(app.route_prefix) + " of application " +
                          in_quotes(app.name) + " is already used by application " +
                          in_quotes(prefix->second));
    }
    state.applications.emplace(app.name, std::move(app));
  }
  return true;
}

bool Parser::http_options(const YAML::Node& node, HttpOptions& out,
                          controller::HttpSettings& settings) {
  if (!node.IsMap())
    return fail(node.Mark(), "http_options: expected a mapping, got " + describe(node));
  Fields fields;
  if (!read_fields(node, kHttpFields, "in http_options", fields))
    return false;
  if (const Field* f = fields.get("host")) {
    std::string host;
    if (!get_string(*f, "host", host))
      return false;
    if (host.empty() || host.find_first_of(" \t\r\n") != std::string::npos)
      return fail(mark_of(*f), "host: " + in_quotes(host) + " is not a host name or address");
    out.host = host;
  }
  if (const Field* f = fields.get("port")) {
    uint16_t port = 0;
    if (!get_int_as(f, "port", "a port number (1-65535)", 1, 65535, port))
      return false;
    out.port = port;
  }
  if (!get_optional_seconds(fields, "request_timeout_s", settings.request_timeout_s))
    return false;
  return get_optional_seconds(fields, "keep_alive_timeout_s", settings.keep_alive_timeout_s);
}

bool Parser::application(const YAML::Node& node, size_t index, ApplicationSpec& out) {
  const std::string position = "applications[" + std::to_string(index) + "]";
  if (!node.IsMap())
    return fail(node.Mark(), position + ": expected a mapping, got " + describe(node));
  const std::string peeked = peek_name(node);
  const std::string where =
      "in application " + in_quotes(peeked.empty() ? std::string("default") : peeked);
  Fields fields;
  if (!read_fields(node, kAppFields, where, fields))
    return false;

  out.name = "default";  // Ray Serve's default application name
  if (const Field* f = fields.get("name")) {
    if (!get_string(*f, "name", out.name))
      return false;
    if (!controller::valid_name(out.name))
      return fail(mark_of(*f), "application name " + in_quotes(out.name) + " " + kNameRule);
  }
  const std::string self = "application " + in_quotes(out.name);

  out.route_prefix = "/";  // Ray Serve's default
  if (const Field* f = fields.get("route_prefix")) {
    if (!get_string(*f, "route_prefix", out.route_prefix))
      return false;
    if (out.route_prefix.empty() || out.route_prefix[0] != '/') {
      return fail(mark_of(*f), "route_prefix " + in_quotes(out.route_prefix) + " of " + self +
                                   " must start with '/'");
    }
  }

  ApplicationContext app;
  app.name = out.name;
  const Field* import = fields.get("import_path");
  if (!import)
    return fail(node.Mark(), "missing field 'import_path' " + where);
  if (!get_string(*import, "import_path", app.import_text))
    return false;
  auto parsed_import = parse_import_path(app.import_text);
  if (!parsed_import)
    return fail(mark_of(*import), parsed_import.status().message());
  app.import = *parsed_import;
  out.ingress = app.import.class_name;

  app.args_mark = node.Mark();
  if (const Field* f = fields.get("args")) {
    if (!get_json(*f, "args", true, app.args))
      return false;
    app.args_mark = mark_of(*f);
  }

  if (!deployments(fields.get("deployments"), app, out))
    return false;
  if (const Field* f = fields.given("traffic")) {
    if (!traffic(*f, out, out.traffic))
      return false;
  }
  if (const Field* f = fields.given("traffic_key_header")) {
    if (!get_string(*f, "traffic_key_header", out.traffic_key_header))
      return false;
    if (!controller::valid_header_name(out.traffic_key_header)) {
      return fail(mark_of(*f), "traffic_key_header " + in_quotes(out.traffic_key_header) + " of " +
                                   self + " must be an HTTP header name");
    }
    if (out.traffic.empty()) {
      return fail(mark_of(*f),
                  "traffic_key_header of " + self + " needs a traffic split (give 'traffic' too)");
    }
  }
  if (const Field* f = fields.given("shadow")) {
    if (!shadow(*f, out, out.shadow))
      return false;
  }
  if (const Field* f = fields.get("open_inference")) {
    if (!get_bool(*f, "open_inference", out.open_inference))
      return false;
  }
  return true;
}

// An application's `deployments` (`f`; null when not given), each name once;
// the ingress first with the defaults when it is not listed.
bool Parser::deployments(const Field* f, const ApplicationContext& app, ApplicationSpec& out) {
  std::map<std::string, YAML::Mark> seen;
  if (f) {
    if (!f->value.IsSequence()) {
      return fail(mark_of(*f),
                  "deployments: expected a sequence of deployments, got " + describe(f->value));
    }
    size_t i = 0;
    for (const auto& item : f->value) {
      DeploymentSpec d;
      if (!deployment(item, i++, app, d))
        return false;
      auto [it, inserted] = seen.emplace(d.name, item.Mark());
      if (!inserted) {
        return fail(item.Mark(), "duplicate deployment name " + in_quotes(d.name) +
                                     " in application " + in_quotes(app.name) + " (first at " +
                                     position_text(it->second) + ")");
      }
      out.deployments.push_back(std::move(d));
    }
  }
  if (!seen.count(out.ingress)) {
    // The ingress is not listed: it runs with the defaults.
    DeploymentSpec ingress;
    ingress.name = out.ingress;
    ingress.import_path = app.import_text;
    ingress.init_args = app.args;
    out.deployments.insert(out.deployments.begin(), std::move(ingress));
  }
  return true;
}

// One entry of an application's `deployments`: its name and code (import_path,
// args, version), then its DeploymentConfig.
bool Parser::deployment(const YAML::Node& node, size_t index, const ApplicationContext& app,
                        DeploymentSpec& out) {
  const std::string position =
      "deployments[" + std::to_string(index) + "] of application " + in_quotes(app.name);
  if (!node.IsMap())
    return fail(node.Mark(), position + ": expected a mapping, got " + describe(node));
  const std::string peeked = peek_name(node);
  const std::string where =
      peeked.empty() ? "in " + position : "in deployment " + in_quotes(peeked);
  Fields fields;
  if (!read_fields(node, kDeploymentFields, where, fields))
    return false;

  const Field* name = fields.get("name");
  if (!name)
    return fail(node.Mark(), "missing field 'name' " + where);
  if (!get_string(*name, "name", out.name))
    return false;
  if (!controller::valid_name(out.name)) {
    return fail(mark_of(*name), "deployment name " + in_quotes(out.name) + " " + kNameRule);
  }
  const bool is_ingress = out.name == app.import.class_name;
  const std::string self = "deployment " + in_quotes(out.name);

  if (const Field* f = fields.get("import_path")) {
    if (!get_string(*f, "import_path", out.import_path))
      return false;
    auto parsed = parse_import_path(out.import_path);
    if (!parsed)
      return fail(mark_of(*f), parsed.status().message());
    if (is_ingress && out.import_path != app.import_text) {
      return fail(mark_of(*f), "import_path of ingress " + self + " must be the application's (" +
                                   in_quotes(app.import_text) + ") or be left out");
    }
  } else if (is_ingress) {
    out.import_path = app.import_text;
  } else {
    out.import_path = app.import.library + ":" + out.name;
    auto parsed = parse_import_path(out.import_path);
    if (!parsed) {
      return fail(mark_of(*name), self + " has no import_path and its name is no class name (" +
                                      parsed.status().message() + "); give an import_path");
    }
  }

  if (const Field* f = fields.get("args")) {
    if (is_ingress && !app.args.empty() && !f->value.IsNull()) {
      return fail(mark_of(*f), "args of ingress " + self + " are given twice: here and at " +
                                   position_text(app.args_mark) + " in the application; keep one");
    }
    if (!get_json(*f, "args", true, out.init_args))
      return false;
  }
  if (is_ingress && out.init_args.empty())
    out.init_args = app.args;

  if (const Field* f = fields.get("version")) {
    if (!get_string(*f, "version", out.code_version))
      return false;
  }
  return deployment_config(fields, out.name, out.config);
}

// The fields of a deployment (`name`) that make its DeploymentConfig.
bool Parser::deployment_config(const Fields& fields, const std::string& name,
                               DeploymentConfig& out) {
  const std::string self = "deployment " + in_quotes(name);
  const long long max_replicas = controller::kMaxReplicas;
  const Field* num_replicas = fields.get("num_replicas");
  if (num_replicas) {
    if (num_replicas->value.IsScalar() && num_replicas->value.Scalar() == "auto") {
      return fail(mark_of(*num_replicas),
                  "num_replicas: 'auto' is not supported; give an autoscaling_config instead");
    }
    if (!get_int_as(num_replicas, "num_replicas", "a non-negative integer", 0, max_replicas,
                    out.num_replicas)) {
      return false;
    }
  }
  if (const Field* f = fields.given("autoscaling_config")) {
    if (num_replicas) {
      return fail(mark_of(*num_replicas),
                  "num_replicas and autoscaling_config of " + self +
                      " are mutually exclusive: give a fixed num_replicas or autoscaling_config, "
                      "not both");
    }
    AutoscalingConfig a;
    if (!autoscaling(*f, name, a))
      return false;
    out.autoscaling_config = a;
  }
  if (!get_int_as(fields.get("max_ongoing_requests"), "max_ongoing_requests", "a positive integer",
                  1, controller::kMaxOngoingRequests, out.max_ongoing_requests) ||
      !get_int_as(fields.get("max_queued_requests"), "max_queued_requests",
                  "an integer (-1 for no limit)", -1, std::numeric_limits<int32_t>::max(),
                  out.max_queued_requests) ||
      !get_int_as(fields.get("max_replicas_per_node"), "max_replicas_per_node",
                  "a non-negative integer (0 for no limit)", 0, max_replicas,
                  out.max_replicas_per_node) ||
      !max_num_models(fields.given("max_num_models_per_replica"), out.max_num_models_per_replica)) {
    return false;
  }
  if (const Field* f = fields.get("user_config")) {
    if (!get_json(*f, "user_config", false, out.user_config))
      return false;
  }
  if (!get_seconds(fields, "health_check_period_s", false, out.health_check_period_s) ||
      !get_seconds(fields, "health_check_timeout_s", false, out.health_check_timeout_s) ||
      !get_seconds(fields, "graceful_shutdown_wait_loop_s", false,
                   out.graceful_shutdown_wait_loop_s) ||
      !get_seconds(fields, "graceful_shutdown_timeout_s", false, out.graceful_shutdown_timeout_s) ||
      !get_seconds(fields, "stuck_after_s", true, out.stuck_after_s)) {
    return false;
  }
  if (const Field* f = fields.get("resources")) {
    if (!resources(*f, out.resources))
      return false;
  }
  if (const Field* f = fields.get("force_stop_unhealthy_replicas")) {
    if (!get_bool(*f, "force_stop_unhealthy_replicas", out.force_stop_unhealthy_replicas))
      return false;
  }
  // Request batching: max_batch_size, and batch_wait_timeout_s in seconds or
  // `auto` (batch_wait_auto; the seconds keep their default).
  const Field* batch_size = fields.get("max_batch_size");
  const std::string batch_sizes =
      "a positive integer (1 to " + std::to_string(controller::kMaxBatchSize) + ")";
  if (!get_int_as(batch_size, "max_batch_size", batch_sizes, 1, controller::kMaxBatchSize,
                  out.max_batch_size)) {
    return false;
  }
  if (const Field* f = fields.get("batch_wait_timeout_s")) {
    if (f->value.IsScalar() && f->value.Scalar() == "auto") {
      out.batch_wait_auto = true;
    } else if (!get_number(*f, "batch_wait_timeout_s",
                           "a number of seconds from 0 to " +
                               format_double(controller::kMaxBatchWaitTimeoutS) + ", or auto",
                           Bounds{0, true, controller::kMaxBatchWaitTimeoutS},
                           out.batch_wait_timeout_s)) {
      return false;
    }
  }
  if (out.max_batch_size > 1 && out.max_ongoing_requests < out.max_batch_size) {
    const Field* at = fields.get("max_ongoing_requests");
    const std::string batch = std::to_string(out.max_batch_size);
    return fail(mark_of(at ? *at : *batch_size),
                "max_ongoing_requests (" + std::to_string(out.max_ongoing_requests) +
                    ") is below max_batch_size (" + batch +
                    "): a replica holds at most max_ongoing_requests requests, so its batches "
                    "could never fill; raise max_ongoing_requests to at least " +
                    batch);
  }
  if (const Field* f = fields.get("isolation")) {
    if (!isolation(*f, out.isolation))
      return false;
  }
  if (const Field* f = fields.get("memory_limit")) {
    if (!memory_limit(*f, out.memory_limit_bytes))
      return false;
    if (out.memory_limit_bytes != 0 && out.isolation == Isolation::in_process) {
      return fail(mark_of(*f), "memory_limit of " + self +
                                   " needs isolation: process (it is enforced on the replica "
                                   "process; this deployment has isolation: in_process)");
    }
  }
  return true;
}

bool Parser::autoscaling(const Field& f, const std::string& deployment_name,
                         AutoscalingConfig& out) {
  if (!f.value.IsMap()) {
    return fail(mark_of(f), "autoscaling_config: expected a mapping, got " + describe(f.value));
  }
  Fields fields;
  if (!read_fields(f.value, kAutoscalingFields,
                   "in autoscaling_config of deployment " + in_quotes(deployment_name), fields)) {
    return false;
  }
  const long long max_replicas = controller::kMaxReplicas;
  const std::string count = "a non-negative integer";
  if (!get_int_as(fields.get("min_replicas"), "min_replicas", count, 0, max_replicas,
                  out.min_replicas) ||
      !get_int_as(fields.get("max_replicas"), "max_replicas", "a positive integer", 1, max_replicas,
                  out.max_replicas)) {
    return false;
  }
  if (const Field* initial = fields.given("initial_replicas")) {
    uint32_t v = 0;
    if (!get_int_as(initial, "initial_replicas", count, 0, max_replicas, v))
      return false;
    out.initial_replicas = v;
  }
  if (out.min_replicas > out.max_replicas) {
    const Field* at = fields.get("min_replicas");
    return fail(at ? mark_of(*at) : f.value.Mark(),
                "min_replicas (" + std::to_string(out.min_replicas) +
                    ") must be <= max_replicas (" + std::to_string(out.max_replicas) + ")");
  }
  if (out.initial_replicas &&
      (*out.initial_replicas < out.min_replicas || *out.initial_replicas > out.max_replicas)) {
    return fail(mark_of(*fields.get("initial_replicas")),
                "initial_replicas (" + std::to_string(*out.initial_replicas) +
                    ") must be within [min_replicas, max_replicas] = [" +
                    std::to_string(out.min_replicas) + ", " + std::to_string(out.max_replicas) +
                    "]");
  }
  const Bounds positive{0, false, std::numeric_limits<double>::infinity()};
  auto positive_number = [&](const std::string& name, double& target) {
    const Field* field = fields.get(name);
    return !field || get_number(*field, name, "a positive number", positive, target);
  };
  auto optional_positive = [&](const std::string& name, std::optional<double>& target) {
    const Field* field = fields.given(name);
    if (!field)
      return true;
    double v = 0;
    if (!get_number(*field, name, "a positive number", positive, v))
      return false;
    target = v;
    return true;
  };
  return positive_number("target_ongoing_requests", out.target_ongoing_requests) &&
         get_seconds(fields, "metrics_interval_s", false, out.metrics_interval_s) &&
         get_seconds(fields, "look_back_period_s", false, out.look_back_period_s) &&
         positive_number("smoothing_factor", out.smoothing_factor) &&
         optional_positive("upscale_smoothing_factor", out.upscale_smoothing_factor) &&
         optional_positive("downscale_smoothing_factor", out.downscale_smoothing_factor) &&
         get_seconds(fields, "upscale_delay_s", true, out.upscale_delay_s) &&
         get_seconds(fields, "downscale_delay_s", true, out.downscale_delay_s);
}

// A mapping of the application's deployment names to numbers in [0, 1]
// (`field` of `self`: the weights of a traffic split, the probabilities of
// shadows), each name once and one of the deployments. `example` ("weights
// like {...}") shows the expected shape in the error for a value that is not
// a mapping.
bool Parser::deployment_shares(const Field& f, const ApplicationSpec& app, const std::string& field,
                               const std::string& self, const std::string& what,
                               const std::string& example, std::map<std::string, double>& out) {
  if (!f.value.IsMap()) {
    return fail(mark_of(f), self + ": expected a mapping of deployment names to " + example +
                                ", got " + describe(f.value));
  }
  std::map<std::string, YAML::Mark> seen;
  for (const auto& entry : f.value) {
    const YAML::Node& key = entry.first;
    if (!key.IsScalar())
      return fail(key.Mark(), self + ": expected deployment names as keys, got " + describe(key));
    const std::string name = key.Scalar();
    auto [it, inserted] = seen.emplace(name, key.Mark());
    if (!inserted) {
      return fail(key.Mark(), self + ": duplicate deployment " + in_quotes(name) + " (first at " +
                                  position_text(it->second) + ")");
    }
    bool known = std::any_of(app.deployments.begin(), app.deployments.end(),
                             [&](const DeploymentSpec& d) { return d.name == name; });
    if (!known) {
      std::string names;
      for (const auto& d : app.deployments)
        names += (names.empty() ? "" : ", ") + d.name;
      return fail(key.Mark(), self + ": " + in_quotes(name) +
                                  " is not a deployment of the application (it has " + names + ")");
    }
    double v = 0;
    if (!get_number(Field{key, entry.second}, field + ": " + name, "a " + what + " from 0 to 1",
                    Bounds{0, true, 1}, v))
      return false;
    out[name] = v;
  }
  return true;
}

// After the deployments: every name must be one of them, the weights sum
// to 1.
bool Parser::traffic(const Field& f, const ApplicationSpec& app,
                     std::map<std::string, double>& out) {
  const std::string self = "traffic of application " + in_quotes(app.name);
  if (f.value.IsMap() && f.value.size() == 0) {
    return fail(mark_of(f), self +
                                ": must name at least one deployment (omit it to send "
                                "everything to the ingress)");
  }
  if (!deployment_shares(f, app, "traffic", self, "weight",
                         "weights like {Hello: 0.9, Canary: 0.1}", out))
    return false;
  double sum = 0;
  for (const auto& [name, w] : out)
    sum += w;
  if (!controller::traffic_sum_is_one(sum)) {
    return fail(mark_of(f),
                self + ": the weights sum to " + format_double(sum) + "; they must sum to 1");
  }
  return true;
}

// After the deployments: every name must be one of them, each probability in
// [0, 1]. That a shadow receives no real traffic is the controller's rule
// (controller::validate, run on the whole config at the end).
bool Parser::shadow(const Field& f, const ApplicationSpec& app,
                    std::map<std::string, double>& out) {
  const std::string self = "shadow of application " + in_quotes(app.name);
  return deployment_shares(f, app, "shadow", self, "probability",
                           "probabilities like {Mirror: 0.5}", out);
}

}  // namespace troupe::config::detail

namespace troupe::config {

Result<DeployConfig> parse_config(const std::string& yaml_text, const std::string& file_name) {
  try {
    return detail::Parser(file_name).run(yaml_text);
  } catch (const std::exception& e) {
    // yaml-cpp and nlohmann throw only on faults once the text has parsed.
    return Status(errc::internal, file_name + ": " + e.what());
  }
}

}  // namespace troupe::config
