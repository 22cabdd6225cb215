#include "controller/store/codec.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <type_traits>
#include <utility>

#include "schemas/target_state.capnp.h"

namespace troupe::controller {
namespace {

// A model value that cannot come from a well-formed record: decoding stops
// with this message. Thrown only inside decode_record() and caught there.
struct Malformed {
  std::string message;
};

kj::StringPtr text(const std::string& s) {
  return kj::StringPtr(s.c_str(), s.size());
}
std::string str(capnp::Text::Reader t) {
  return std::string(t.begin(), t.size());
}

// ---- model -> schema -------------------------------------------------------

void write(const Resources& in, schema::Resources::Builder out) {
  auto list = out.initAmounts(static_cast<unsigned>(in.amounts.size()));
  unsigned i = 0;
  for (const auto& [name, amount] : in.amounts) {
    list[i].setName(text(name));
    list[i].setAmount(amount);
    ++i;
  }
}

void write(const AutoscalingConfig& in, schema::AutoscalingConfig::Builder out) {
  out.setMinReplicas(in.min_replicas);
  out.setMaxReplicas(in.max_replicas);
  if (in.initial_replicas) {
    out.getInitialReplicas().setValue(*in.initial_replicas);
  } else {
    out.getInitialReplicas().setNone();
  }
  out.setTargetOngoingRequests(in.target_ongoing_requests);
  out.setMetricsIntervalS(in.metrics_interval_s);
  out.setLookBackPeriodS(in.look_back_period_s);
  out.setSmoothingFactor(in.smoothing_factor);
  if (in.upscale_smoothing_factor) {
    out.getUpscaleSmoothingFactor().setValue(*in.upscale_smoothing_factor);
  } else {
    out.getUpscaleSmoothingFactor().setNone();
  }
  if (in.downscale_smoothing_factor) {
    out.getDownscaleSmoothingFactor().setValue(*in.downscale_smoothing_factor);
  } else {
    out.getDownscaleSmoothingFactor().setNone();
  }
  out.setUpscaleDelayS(in.upscale_delay_s);
  out.setDownscaleDelayS(in.downscale_delay_s);
}

void write(const DeploymentConfig& in, schema::DeploymentConfig::Builder out) {
  out.setNumReplicas(in.num_replicas);
  out.setMaxOngoingRequests(in.max_ongoing_requests);
  out.setMaxQueuedRequests(in.max_queued_requests);
  out.setUserConfig(text(in.user_config));
  if (in.autoscaling_config) {
    write(*in.autoscaling_config, out.getAutoscaling().initConfig());
  } else {
    out.getAutoscaling().setNone();
  }
  out.setHealthCheckPeriodS(in.health_check_period_s);
  out.setHealthCheckTimeoutS(in.health_check_timeout_s);
  out.setGracefulShutdownWaitLoopS(in.graceful_shutdown_wait_loop_s);
  out.setGracefulShutdownTimeoutS(in.graceful_shutdown_timeout_s);
  write(in.resources, out.initResources());
  out.setMaxReplicasPerNode(in.max_replicas_per_node);
  out.setIsolation(in.isolation == Isolation::in_process ? schema::Isolation::IN_PROCESS
                                                         : schema::Isolation::PROCESS);
  out.setMemoryLimitBytes(in.memory_limit_bytes);
  out.setStuckAfterS(in.stuck_after_s);
  out.setForceStopUnhealthyReplicas(in.force_stop_unhealthy_replicas);
  out.setMaxNumModelsPerReplica(in.max_num_models_per_replica);
  out.setMaxBatchSize(in.max_batch_size);
  out.setBatchWaitTimeoutS(in.batch_wait_timeout_s);
  out.setBatchWaitAuto(in.batch_wait_auto);
}

void write(const DeploymentSpec& in, schema::DeploymentSpec::Builder out) {
  out.setName(text(in.name));
  out.setImportPath(text(in.import_path));
  out.setInitArgs(text(in.init_args));
  out.setCodeVersion(text(in.code_version));
  write(in.config, out.initConfig());
  out.setLibrarySha256(text(in.library_sha256));
}

void write_shadow(const ApplicationSpec& in, schema::ApplicationSpec::Builder out) {
  auto shadow = out.initShadow(static_cast<unsigned>(in.shadow.size()));
  unsigned i = 0;
  for (const auto& [deployment, probability] : in.shadow) {
    shadow[i].setDeployment(text(deployment));
    shadow[i].setProbability(probability);
    ++i;
  }
}

void write(const ApplicationSpec& in, schema::ApplicationSpec::Builder out) {
  out.setName(text(in.name));
  out.setRoutePrefix(text(in.route_prefix));
  out.setIngress(text(in.ingress));
  auto list = out.initDeployments(static_cast<unsigned>(in.deployments.size()));
  for (unsigned i = 0; i < in.deployments.size(); ++i) {
    write(in.deployments[i], list[i]);
  }
  auto traffic = out.initTraffic(static_cast<unsigned>(in.traffic.size()));
  unsigned t = 0;
  for (const auto& [deployment, weight] : in.traffic) {
    traffic[t].setDeployment(text(deployment));
    traffic[t].setWeight(weight);
    ++t;
  }
  out.setTrafficKeyHeader(text(in.traffic_key_header));
  write_shadow(in, out);
  out.setOpenInference(in.open_inference);
}

// The format version a record needs (see kFormatVersion).
uint16_t version_for(const ApplicationSpec& app) {
  if (app.open_inference)
    return 5;
  for (const auto& d : app.deployments) {
    if (!d.library_sha256.empty())
      return 4;
  }
  if (!app.shadow.empty())
    return 3;
  return app.traffic.empty() && app.traffic_key_header.empty() ? 1 : 2;
}

uint16_t version_for(const HttpSettings& http) {
  return http == HttpSettings{} ? 1 : 3;
}

uint16_t version_for(const TargetState& state) {
  uint16_t v = version_for(state.http);
  for (const auto& [name, app] : state.applications)
    v = std::max(v, version_for(app));
  return v;
}

// Everything but the applications.
void write_top_level(const TargetState& in, schema::TargetState::Builder out) {
  if (in.target_capacity) {
    out.getTargetCapacity().setValue(*in.target_capacity);
  } else {
    out.getTargetCapacity().setNone();
  }
  out.setGeneration(in.generation);
  switch (in.target_capacity_direction) {
    case CapacityDirection::none:
      out.setTargetCapacityDirection(schema::CapacityDirection::NONE);
      break;
    case CapacityDirection::up:
      out.setTargetCapacityDirection(schema::CapacityDirection::UP);
      break;
    case CapacityDirection::down:
      out.setTargetCapacityDirection(schema::CapacityDirection::DOWN);
      break;
  }
  if (in.http.request_timeout_s) {
    out.getRequestTimeoutS().setValue(*in.http.request_timeout_s);
  } else {
    out.getRequestTimeoutS().setNone();
  }
  if (in.http.keep_alive_timeout_s) {
    out.getKeepAliveTimeoutS().setValue(*in.http.keep_alive_timeout_s);
  } else {
    out.getKeepAliveTimeoutS().setNone();
  }
  std::size_t n = 0;
  for (const auto& [app, counts] : in.autoscaled_replicas)
    n += counts.size();
  auto list = out.initAutoscaledReplicas(static_cast<unsigned>(n));
  unsigned i = 0;
  for (const auto& [app, counts] : in.autoscaled_replicas) {
    for (const auto& [deployment, replicas] : counts) {
      auto e = list[i++];
      e.setApplication(text(app));
      e.setDeployment(text(deployment));
      e.setReplicas(replicas);
    }
  }
  // A last good declaration equal to the application's own is written as
  // `current`: the head record stays small however large the applications.
  auto last = out.initLastRunning(static_cast<unsigned>(in.last_running.size()));
  unsigned l = 0;
  for (const auto& [app, running] : in.last_running) {
    auto e = last[l++];
    e.setApplication(text(app));
    e.setGeneration(running.generation);
    auto declared = in.applications.find(app);
    if (declared != in.applications.end() && declared->second == running.spec) {
      e.getDeclaration().setCurrent();
    } else {
      write(running.spec, e.getDeclaration().initSpec());
    }
  }
}

void write(const TargetState& in, schema::TargetState::Builder out) {
  auto list = out.initApplications(static_cast<unsigned>(in.applications.size()));
  unsigned i = 0;
  for (const auto& entry : in.applications) {
    write(entry.second, list[i++]);
  }
  write_top_level(in, out);
}

// ---- schema -> model -------------------------------------------------------
// Unknown union members and enumerants (written by a newer schema) are refused
// rather than guessed at, and so are numbers that are not finite (NaN or an
// infinity): no deploy writes one (validate() refuses them), and a controller
// that read one would compare health check periods, delays and weights with
// NaN.

double finite(double v, const char* field) {
  if (!std::isfinite(v))
    throw Malformed{std::string(field) + " is not a finite number"};
  return v;
}

Resources read(schema::Resources::Reader in) {
  Resources out;
  for (auto entry : in.getAmounts()) {
    auto name = str(entry.getName());
    if (!out.amounts.emplace(name, finite(entry.getAmount(), "a resource amount")).second) {
      throw Malformed{"resource '" + name + "' appears twice"};
    }
  }
  return out;
}

// `Group` is a schema group `union { none @a :Void; value @b :T; }`.
template <class Group>
auto read_optional(typename Group::Reader u, const char* field)
    -> std::optional<decltype(u.getValue())> {
  switch (u.which()) {
    case Group::NONE:
      return std::nullopt;
    case Group::VALUE:
      if constexpr (std::is_floating_point_v<decltype(u.getValue())>)
        return finite(u.getValue(), field);
      else
        return u.getValue();
  }
  throw Malformed{std::string(field) + " has an unknown union member " +
                  std::to_string(static_cast<unsigned>(u.which()))};
}

AutoscalingConfig read(schema::AutoscalingConfig::Reader in) {
  AutoscalingConfig out;
  out.min_replicas = in.getMinReplicas();
  out.max_replicas = in.getMaxReplicas();
  out.initial_replicas = read_optional<schema::AutoscalingConfig::InitialReplicas>(
      in.getInitialReplicas(), "initialReplicas");
  out.target_ongoing_requests = finite(in.getTargetOngoingRequests(), "targetOngoingRequests");
  out.metrics_interval_s = finite(in.getMetricsIntervalS(), "metricsIntervalS");
  out.look_back_period_s = finite(in.getLookBackPeriodS(), "lookBackPeriodS");
  out.smoothing_factor = finite(in.getSmoothingFactor(), "smoothingFactor");
  out.upscale_smoothing_factor = read_optional<schema::AutoscalingConfig::UpscaleSmoothingFactor>(
      in.getUpscaleSmoothingFactor(), "upscaleSmoothingFactor");
  out.downscale_smoothing_factor =
      read_optional<schema::AutoscalingConfig::DownscaleSmoothingFactor>(
          in.getDownscaleSmoothingFactor(), "downscaleSmoothingFactor");
  out.upscale_delay_s = finite(in.getUpscaleDelayS(), "upscaleDelayS");
  out.downscale_delay_s = finite(in.getDownscaleDelayS(), "downscaleDelayS");
  return out;
}

DeploymentConfig read(schema::DeploymentConfig::Reader in) {
  DeploymentConfig out;
  out.num_replicas = in.getNumReplicas();
  out.max_ongoing_requests = in.getMaxOngoingRequests();
  out.max_queued_requests = in.getMaxQueuedRequests();
  out.user_config = str(in.getUserConfig());
  auto autoscaling = in.getAutoscaling();
  switch (autoscaling.which()) {
    case schema::DeploymentConfig::Autoscaling::NONE:
      break;
    case schema::DeploymentConfig::Autoscaling::CONFIG:
      out.autoscaling_config = read(autoscaling.getConfig());
      break;
    default:
      throw Malformed{"autoscaling has an unknown union member " +
                      std::to_string(static_cast<unsigned>(autoscaling.which()))};
  }
  out.health_check_period_s = finite(in.getHealthCheckPeriodS(), "healthCheckPeriodS");
  out.health_check_timeout_s = finite(in.getHealthCheckTimeoutS(), "healthCheckTimeoutS");
  out.graceful_shutdown_wait_loop_s = finite(in.getGracefulShutdownWaitLoopS(), "gracefulShutdownWaitLoopS");
  out.graceful_shutdown_timeout_s = finite(in.getGracefulShutdownTimeoutS(), "gracefulShutdownTimeoutS");
  out.resources = read(in.getResources());
  out.max_replicas_per_node = in.getMaxReplicasPerNode();
  switch (in.getIsolation()) {
    case schema::Isolation::PROCESS:
      out.isolation = Isolation::process;
      break;
    case schema::Isolation::IN_PROCESS:
      out.isolation = Isolation::in_process;
      break;
    default:
      throw Malformed{"isolation has an unknown value " +
                      std::to_string(static_cast<unsigned>(in.getIsolation()))};
  }
  out.memory_limit_bytes = in.getMemoryLimitBytes();
  out.stuck_after_s = finite(in.getStuckAfterS(), "stuckAfterS");
  out.force_stop_unhealthy_replicas = in.getForceStopUnhealthyReplicas();
  out.max_num_models_per_replica = in.getMaxNumModelsPerReplica();
  out.max_batch_size = in.getMaxBatchSize();
  out.batch_wait_timeout_s = finite(in.getBatchWaitTimeoutS(), "batchWaitTimeoutS");
  out.batch_wait_auto = in.getBatchWaitAuto();
  return out;
}

DeploymentSpec read(schema::DeploymentSpec::Reader in) {
  DeploymentSpec out;
  out.name = str(in.getName());
  out.import_path = str(in.getImportPath());
  out.init_args = str(in.getInitArgs());
  out.code_version = str(in.getCodeVersion());
  out.config = read(in.getConfig());
  out.library_sha256 = str(in.getLibrarySha256());
  return out;
}

ApplicationSpec read(schema::ApplicationSpec::Reader in) {
  ApplicationSpec out;
  out.name = str(in.getName());
  out.route_prefix = str(in.getRoutePrefix());
  out.ingress = str(in.getIngress());
  auto list = in.getDeployments();
  out.deployments.reserve(list.size());
  for (auto d : list) {
    out.deployments.push_back(read(d));
  }
  for (auto t : in.getTraffic()) {
    auto deployment = str(t.getDeployment());
    if (!out.traffic.emplace(deployment, finite(t.getWeight(), "a traffic weight")).second) {
      throw Malformed{"traffic names deployment '" + deployment + "' twice"};
    }
  }
  out.traffic_key_header = str(in.getTrafficKeyHeader());
  // Records older than version 3 have no shadow list: it reads as empty.
  for (auto t : in.getShadow()) {
    auto deployment = str(t.getDeployment());
    if (!out.shadow.emplace(deployment, finite(t.getProbability(), "a shadow probability")).second) {
      throw Malformed{"shadow names deployment '" + deployment + "' twice"};
    }
  }
  // Records older than version 5 have no flag: it reads as false.
  out.open_inference = in.getOpenInference();
  return out;
}

// Everything but the applications. The last good declarations written as
// `current` are left out of `out.last_running`: `current` gets their
// generation by application, for resolve_current() once the applications are
// read.
TargetState read_top_level(schema::TargetState::Reader in,
                           std::map<std::string, uint64_t>& current) {
  TargetState out;
  out.target_capacity =
      read_optional<schema::TargetState::TargetCapacity>(in.getTargetCapacity(), "targetCapacity");
  out.generation = in.getGeneration();
  switch (in.getTargetCapacityDirection()) {
    case schema::CapacityDirection::UP:
      out.target_capacity_direction = CapacityDirection::up;
      break;
    case schema::CapacityDirection::DOWN:
      out.target_capacity_direction = CapacityDirection::down;
      break;
    default:  // NONE, or a value of a newer binary: the safe reading
      out.target_capacity_direction = CapacityDirection::none;
      break;
  }
  out.http.request_timeout_s = read_optional<schema::TargetState::RequestTimeoutS>(
      in.getRequestTimeoutS(), "requestTimeoutS");
  out.http.keep_alive_timeout_s = read_optional<schema::TargetState::KeepAliveTimeoutS>(
      in.getKeepAliveTimeoutS(), "keepAliveTimeoutS");
  for (auto e : in.getAutoscaledReplicas()) {
    auto& counts = out.autoscaled_replicas[str(e.getApplication())];
    if (!counts.emplace(str(e.getDeployment()), e.getReplicas()).second) {
      throw Malformed{"autoscaled replicas of '" + str(e.getApplication()) + "/" +
                      str(e.getDeployment()) + "' appear twice"};
    }
  }
  for (auto e : in.getLastRunning()) {
    auto app = str(e.getApplication());
    if (out.last_running.count(app) || current.count(app))
      throw Malformed{"the last good declaration of '" + app + "' appears twice"};
    auto declaration = e.getDeclaration();
    switch (declaration.which()) {
      case schema::LastRunning::Declaration::CURRENT:
        current.emplace(app, e.getGeneration());
        break;
      case schema::LastRunning::Declaration::SPEC:
        out.last_running.emplace(
            app, RunningDeclaration{read(declaration.getSpec()), e.getGeneration()});
        break;
      default:
        throw Malformed{"the last good declaration of '" + app + "' has an unknown union member " +
                        std::to_string(static_cast<unsigned>(declaration.which()))};
    }
  }
  return out;
}

TargetState read(schema::TargetState::Reader in) {
  std::map<std::string, uint64_t> current;
  TargetState out = read_top_level(in, current);
  for (auto a : in.getApplications()) {
    auto app = read(a);
    auto name = app.name;
    if (!out.applications.emplace(name, std::move(app)).second) {
      throw Malformed{"application '" + name + "' appears twice"};
    }
  }
  if (Status s = resolve_current(out, current); !s)
    throw Malformed{s.message()};
  return out;
}

// ---- envelope --------------------------------------------------------------

const char* kind_name(RecordKind kind) {
  switch (kind) {
    case RecordKind::target_state:
      return "target state";
    case RecordKind::head:
      return "checkpoint head";
    case RecordKind::application:
      return "application";
  }
  return "unknown";
}

std::string frame(RecordKind kind, capnp::MessageBuilder& message, uint16_t version) {
  auto words = capnp::messageToFlatArray(message);
  auto body = words.asBytes();
  std::string out;
  out.reserve(kEnvelopeSize + body.size());
  out.append(kCheckpointMagic, sizeof kCheckpointMagic);
  out.push_back(static_cast<char>(version & 0xff));
  out.push_back(static_cast<char>(version >> 8));
  out.push_back(static_cast<char>(kind));
  out.push_back('\0');
  out.append(reinterpret_cast<const char*>(body.begin()), body.size());
  return out;
}

// Checks the envelope, then runs `convert` on the message root inside one
// exception boundary: every kj exception (bad pointers, truncation, limits),
// std exception or Malformed becomes errc::corrupt.
template <class Root, class Convert>
auto decode_record(std::string_view bytes, RecordKind kind, Convert convert)
    -> Result<decltype(convert(std::declval<typename Root::Reader>()))> {
  const std::string what = kind_name(kind);
  if (bytes.size() < kEnvelopeSize) {
    return Status(errc::corrupt, what + " record is " + std::to_string(bytes.size()) +
                                     " bytes, shorter than the " + std::to_string(kEnvelopeSize) +
                                     "-byte header");
  }
  if (std::memcmp(bytes.data(), kCheckpointMagic, sizeof kCheckpointMagic) != 0) {
    return Status(errc::corrupt, what + " record does not start with the checkpoint magic 'TRCP'");
  }
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const unsigned version = b[4] | (b[5] << 8);
  if (version > kFormatVersion) {
    return Status(errc::version_mismatch,
                  what + " record has checkpoint format version " + std::to_string(version) +
                      ", newer than the " + std::to_string(kFormatVersion) +
                      " this binary reads: it was written by a newer troupe; run that "
                      "version (or newer) of the controller");
  }
  if (version == 0) {
    return Status(errc::corrupt, what + " record has format version 0, which was never written");
  }
  if (b[6] != static_cast<unsigned char>(kind)) {
    return Status(errc::corrupt,
                  "expected a " + what + " record, found record kind " + std::to_string(b[6]));
  }
  if (b[7] != 0) {
    return Status(errc::corrupt, what + " record has a non-zero reserved header byte");
  }
  const size_t body_size = bytes.size() - kEnvelopeSize;
  if (body_size % sizeof(capnp::word) != 0) {
    return Status(errc::corrupt, what + " record body of " + std::to_string(body_size) +
                                     " bytes is not a whole number of 8-byte words");
  }
  try {
    // Copied: RocksDB values are not word-aligned, Cap'n Proto needs that.
    auto words = kj::heapArray<capnp::word>(body_size / sizeof(capnp::word));
    std::memcpy(words.begin(), b + kEnvelopeSize, body_size);
    // A well-formed record is traversed once, so it never reads more words
    // than it has. Limiting the traversal to (twice) its size bounds what
    // garbage can make us allocate: Cap'n Proto counts each element of a
    // list of empty structs as a word read, so a few bytes cannot claim
    // millions of list elements (the default limit is 8M words per record).
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 2 * words.size() + 64;
    capnp::FlatArrayMessageReader reader(words, options);
    auto value = convert(reader.getRoot<Root>());
    const auto rest = static_cast<size_t>(words.end() - reader.getEnd());
    if (rest != 0) {
      return Status(errc::corrupt, what + " record has " +
                                       std::to_string(rest * sizeof(capnp::word)) +
                                       " stray bytes after its message");
    }
    return value;
  } catch (const Malformed& e) {
    return Status(errc::corrupt, what + " record is malformed: " + e.message);
  } catch (const kj::Exception& e) {
    return Status(errc::corrupt,
                  what + " record cannot be decoded: " + std::string(e.getDescription().cStr()));
  } catch (const std::exception& e) {
    return Status(errc::corrupt, what + " record cannot be decoded: " + std::string(e.what()));
  }
}

}  // namespace

std::string encode_target_state(const TargetState& state) {
  capnp::MallocMessageBuilder message;
  write(state, message.initRoot<schema::TargetState>());
  return frame(RecordKind::target_state, message, version_for(state));
}

Result<TargetState> decode_target_state(std::string_view bytes) {
  return decode_record<schema::TargetState>(bytes, RecordKind::target_state,
                                            [](schema::TargetState::Reader r) { return read(r); });
}

std::string encode_application(const ApplicationSpec& app) {
  capnp::MallocMessageBuilder message;
  write(app, message.initRoot<schema::ApplicationSpec>());
  return frame(RecordKind::application, message, version_for(app));
}

Result<ApplicationSpec> decode_application(std::string_view bytes) {
  return decode_record<schema::ApplicationSpec>(
      bytes, RecordKind::application, [](schema::ApplicationSpec::Reader r) { return read(r); });
}

std::string encode_head(const TargetState& state, uint32_t application_count) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<schema::CheckpointHead>();
  write_top_level(state, root.initState());
  root.setApplicationCount(application_count);
  return frame(RecordKind::head, message, version_for(state.http));
}

Result<CheckpointHead> decode_head(std::string_view bytes) {
  return decode_record<schema::CheckpointHead>(
      bytes, RecordKind::head, [](schema::CheckpointHead::Reader r) {
        auto state = r.getState();
        if (state.getApplications().size() != 0) {
          throw Malformed{"the head holds applications; they belong under their own keys"};
        }
        CheckpointHead head;
        head.state = read_top_level(state, head.last_running_current);
        head.application_count = r.getApplicationCount();
        return head;
      });
}

Status resolve_current(TargetState& state, const std::map<std::string, uint64_t>& current) {
  for (const auto& [app, generation] : current) {
    auto declared = state.applications.find(app);
    if (declared == state.applications.end()) {
      return Status(errc::corrupt, "the last good declaration of '" + app +
                                       "' is its current one, but there is no application '" + app +
                                       "'");
    }
    state.last_running[app] = RunningDeclaration{declared->second, generation};
  }
  return Status::ok();
}

}  // namespace troupe::controller
