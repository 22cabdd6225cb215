#include "replica/control_worker.hpp"

#include <chrono>
#include <exception>
#include <string>

#include <caf/all.hpp>

#include "replica/batching.hpp"
#include "replica/model_report.hpp"
#include "replica/plugin/plugin_loader.hpp"
#include "replica/replica_metrics.hpp"
#include "replica/user_log.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe::replica {

namespace {

Status parse_json(const std::string& text, const char* what, Json& out) {
  if (text.empty()) {
    out = Json::object();
    return Status::ok();
  }
  try {
    out = Json::parse(text);
    return Status::ok();
  } catch (const std::exception& e) {
    return Status(errc::invalid_argument, std::string(what) + " is not valid JSON: " + e.what());
  }
}

}  // namespace

caf::behavior control_worker(caf::stateful_actor<ControlState>* self, ReplicaOptions o) {
  return {
      [=](initialize_atom) -> caf::result<Instance> {
        auto& st = self->state;
        if (st.instance)
          return st.instance;
        auto factory = o.loader->resolve(o.spec.import_path);
        if (!factory)
          return to_caf_error(factory.status());
        if (auto s = check_batching(o.spec.batch, (*factory)->batches, o.spec.import_path); !s)
          return to_caf_error(s);
        Json args;
        if (auto s = parse_json(o.spec.init_args, "init args", args); !s)
          return to_caf_error(s);
        ReplicaContext ctx{o.spec.app, o.spec.deployment,   o.spec.replica_id,
                           o.node_id,  o.spec.code_version, o.handles};
        ctx.max_num_models_per_replica = o.spec.max_num_models_per_replica;
        ctx.models = o.models;
        ctx.metrics = o.replica_metrics->user_sink();
        ctx.logger = make_user_log(o.spec.replica_id, o.log_file);
        try {
          Instance made((*factory)->create(args, ctx));
          if (!o.spec.user_config.empty()) {
            Json config;
            if (auto s = parse_json(o.spec.user_config, "user_config", config); !s) {
              return to_caf_error(s);
            }
            made->reconfigure(config);
          }
          st.instance = std::move(made);
          return st.instance;
        } catch (const std::exception& e) {
          return to_caf_error(Status(
              errc::internal, "constructor of " + o.spec.import_path + " failed: " + e.what()));
        } catch (...) {
          return to_caf_error(Status(errc::internal, "constructor of " + o.spec.import_path +
                                                         " threw a non-standard exception"));
        }
      },
      [=](reconfigure_atom, const std::string& user_config) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        if (!st.instance)
          return to_caf_error(Status(errc::unavailable, "replica not initialized"));
        Json config;
        if (auto s = parse_json(user_config, "user_config", config); !s)
          return to_caf_error(s);
        try {
          st.instance->reconfigure(config);
          return caf::ok_atom::value;
        } catch (const std::exception& e) {
          return to_caf_error(
              Status(errc::internal, std::string("reconfigure failed: ") + e.what()));
        } catch (...) {
          return to_caf_error(Status(errc::internal, "reconfigure threw a non-standard exception"));
        }
      },
      [=](health_atom) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        if (!st.instance)
          return to_caf_error(Status(errc::unavailable, "replica not initialized"));
        auto started = std::chrono::steady_clock::now();
        Status outcome;
        try {
          st.instance->check_health();
        } catch (const std::exception& e) {
          outcome = Status(errc::internal, std::string("unhealthy: ") + e.what());
        } catch (...) {
          outcome = Status(errc::internal, "unhealthy: non-standard exception");
        }
        o.replica_metrics->health(
            outcome.is_ok(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
        if (!outcome)
          return to_caf_error(outcome);
        return caf::ok_atom::value;
      },
  };
}

}  // namespace troupe::replica
