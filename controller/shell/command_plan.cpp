#include "controller/shell/command_plan.hpp"

namespace troupe::controller {

const char* to_string(CommandAction a) {
  switch (a) {
    case CommandAction::spawn:
      return "spawn";
    case CommandAction::no_agent:
      return "no_agent";
    case CommandAction::reconfigure:
      return "reconfigure";
    case CommandAction::watch_health:
      return "watch_health";
    case CommandAction::query_version:
      return "query_version";
    case CommandAction::replica_gone:
      return "replica_gone";
    case CommandAction::already_gone:
      return "already_gone";
    case CommandAction::exit_replica:
      return "exit_replica";
    case CommandAction::stop_via_agent:
      return "stop_via_agent";
    case CommandAction::kill_via_agent:
      return "kill_via_agent";
    case CommandAction::awaiting_node:
      return "awaiting_node";
  }
  return "?";
}

CommandAction plan_command(const Command& cmd, bool agent_connected, bool replica_known) {
  switch (cmd.kind) {
    case CommandKind::start:
      return agent_connected ? CommandAction::spawn : CommandAction::no_agent;
    case CommandKind::reconfigure:
      return replica_known ? CommandAction::reconfigure : CommandAction::replica_gone;
    case CommandKind::watch_health:
      // The node checks the replica whether or not this controller holds its
      // handle; it answers for a replica it does not host with nothing.
      return agent_connected ? CommandAction::watch_health : CommandAction::awaiting_node;
    case CommandKind::recover:
      return replica_known ? CommandAction::query_version : CommandAction::replica_gone;
    case CommandKind::stop:
    case CommandKind::kill:
      if (!replica_known)
        return CommandAction::already_gone;
      if (!agent_connected)
        return CommandAction::exit_replica;
      return cmd.kind == CommandKind::stop ? CommandAction::stop_via_agent
                                           : CommandAction::kill_via_agent;
  }
  return CommandAction::replica_gone;
}

BatchSettings batch_settings(const DeploymentConfig& config) {
  BatchSettings b;
  b.max_batch_size = config.max_batch_size;
  b.wait_s = config.batch_wait_timeout_s;
  b.adaptive = config.batch_wait_auto;
  return b;
}

ReplicaSpec wire_spec(const Command& cmd, double request_timeout_s) {
  ReplicaSpec spec;
  spec.replica_id = cmd.replica_id;
  spec.app = cmd.app;
  spec.deployment = cmd.deployment;
  spec.import_path = replica_import_path(*cmd.spec);
  spec.init_args = cmd.spec->init_args;
  spec.code_version = cmd.version.code;
  spec.user_config = cmd.version.user_config;
  spec.max_ongoing_requests = cmd.spec->config.max_ongoing_requests;
  // Without autoscaling nobody reads the reports; the replica still needs a
  // period.
  spec.metrics_interval_s = cmd.spec->config.autoscaling_config
                                ? cmd.spec->config.autoscaling_config->metrics_interval_s
                                : 10.0;
  spec.isolation = to_string(cmd.spec->config.isolation);
  spec.memory_limit_bytes = cmd.spec->config.memory_limit_bytes;
  spec.stuck_after_s = effective_stuck_after_s(cmd.spec->config.stuck_after_s, request_timeout_s);
  spec.max_num_models_per_replica = cmd.spec->config.max_num_models_per_replica;
  spec.health_check_timeout_s = cmd.spec->config.health_check_timeout_s;
  spec.health_check_period_s = cmd.spec->config.health_check_period_s;
  spec.batch = batch_settings(cmd.spec->config);
  return spec;
}

}  // namespace troupe::controller
