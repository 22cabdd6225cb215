# The controller's durable checkpoint: troupe::controller::TargetState and
# everything it contains (controller/core/model.hpp), as written ahead to
# RocksDB by controller/store/. A newer binary must read every checkpoint an
# older one wrote, so this file only ever grows.
#
# Evolution rules (Cap'n Proto's own, made explicit here):
#   1. Add a field only at the end of its struct, with the next unused
#      ordinal (@N). Never renumber, remove, rename-with-new-meaning or change
#      the type of an existing field; retire a field by leaving it in place
#      and ignoring it (prefix its name with "obsolete").
#   2. A field missing from an older checkpoint reads as its schema default,
#      so every default below equals the C++ default in model.hpp. Keep them
#      in sync: a new field's schema default must be the model default.
#   3. Optional model fields are a named union whose FIRST member (lowest
#      ordinal) is `none :Void`: an older checkpoint without the union reads
#      as "absent", which is what std::nullopt means.
#   4. Never change a struct ID or this file ID (all are explicit so renaming
#      a struct is harmless). The tests keep an older, smaller copy of this
#      schema (tests/store/target_state_v0.capnp) with the same IDs.
#   5. A change an older binary cannot safely ignore (e.g. a field whose loss
#      on a downgrade would change behaviour) bumps kFormatVersion in
#      controller/store/codec.hpp instead, so older binaries refuse the data
#      rather than silently dropping what they do not know.
@0xc5910c645bfa5fc2;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

# One named amount of Resources ("cpu" = 4, "mem" = 8 GiB in bytes).
struct ResourceAmount @0xeff2a5bdee29facc {
  name @0 :Text;
  amount @1 :Float64;
}

# troupe::Resources; names are unique within one list.
struct Resources @0xa3007cd29b5f67be {
  amounts @0 :List(ResourceAmount);
}

struct AutoscalingConfig @0xc2d29b42b777561a {
  minReplicas @0 :UInt32 = 1;
  maxReplicas @1 :UInt32 = 1;
  initialReplicas :union {
    none @2 :Void;
    value @3 :UInt32;
  }
  targetOngoingRequests @4 :Float64 = 2.0;
  metricsIntervalS @5 :Float64 = 10.0;
  lookBackPeriodS @6 :Float64 = 30.0;
  smoothingFactor @7 :Float64 = 1.0;
  upscaleSmoothingFactor :union {
    none @8 :Void;
    value @9 :Float64;
  }
  downscaleSmoothingFactor :union {
    none @10 :Void;
    value @11 :Float64;
  }
  upscaleDelayS @12 :Float64 = 30.0;
  downscaleDelayS @13 :Float64 = 600.0;
}

struct DeploymentConfig @0xfc284f5555afc3f4 {
  numReplicas @0 :UInt32 = 1;
  maxOngoingRequests @1 :UInt32 = 5;
  maxQueuedRequests @2 :Int32 = -1;  # -1: no limit
  userConfig @3 :Text;  # opaque JSON text; "" means none
  autoscaling :union {
    none @4 :Void;
    config @5 :AutoscalingConfig;
  }
  healthCheckPeriodS @6 :Float64 = 10.0;
  healthCheckTimeoutS @7 :Float64 = 30.0;
  gracefulShutdownWaitLoopS @8 :Float64 = 2.0;
  gracefulShutdownTimeoutS @9 :Float64 = 20.0;
  resources @10 :Resources;
  maxReplicasPerNode @11 :UInt32 = 0;  # 0: no limit
  # Where replicas run. The first enumerant is the default, so a checkpoint
  # written before this field existed reads as `process`.
  isolation @12 :Isolation = process;
  memoryLimitBytes @13 :UInt64 = 0;  # per replica process; 0: no limit
  stuckAfterS @14 :Float64 = 0;  # 0: derived from the request timeout
  maxNumModelsPerReplica @15 :Int32 = -1;  # model multiplexing; -1: no limit
  # Kill an unhealthy replica at once instead of stopping it gracefully. An
  # older binary ignores it (stops gracefully): no format bump.
  forceStopUnhealthyReplicas @16 :Bool = false;
  # Request batching (issue 44): at most maxBatchSize requests per call of
  # the deployment's handle_batch(), a batch closing after
  # batchWaitTimeoutS; batchWaitAuto: `batch_wait_timeout_s: auto` (the wait
  # follows the measured load; batchWaitTimeoutS keeps its value, unused).
  # The defaults are the model's: a checkpoint written before these fields
  # reads as batching off. An older binary ignores them (runs unbatched): no
  # format bump.
  maxBatchSize @17 :UInt32 = 1;  # 1: no batching
  batchWaitTimeoutS @18 :Float64 = 0.01;
  batchWaitAuto @19 :Bool = false;
}

# troupe::controller::Isolation. Only ever append enumerants.
enum Isolation @0xd018646d4bc41863 {
  process @0;    # each replica is its own OS process (the default)
  inProcess @1;  # inside troupe-node: no isolation
}

struct DeploymentSpec @0x97f5d1d179ca4da8 {
  name @0 :Text;
  importPath @1 :Text;
  initArgs @2 :Text;  # opaque JSON text
  codeVersion @3 :Text;
  config @4 :DeploymentConfig;
  # The SHA-256 (hex) of the library's content; "": not known (format 4).
  librarySha256 @5 :Text;
}

# One entry of an application's traffic split.
struct TrafficWeight @0xaf56687cb12b6b25 {
  deployment @0 :Text;
  weight @1 :Float64;
}

# One shadow deployment of an application: the probability of a copy.
struct ShadowTarget @0xdda1a4c2bcb8a019 {
  deployment @0 :Text;
  probability @1 :Float64;
}

struct ApplicationSpec @0x8ac0080a07b65914 {
  name @0 :Text;
  routePrefix @1 :Text;
  ingress @2 :Text;
  deployments @3 :List(DeploymentSpec);
  # The traffic split, sorted by deployment name; empty: all to the ingress.
  # A record with a split is written with format version 2 (codec.hpp): an
  # older binary would drop it and send every request to the ingress.
  traffic @4 :List(TrafficWeight);
  trafficKeyHeader @5 :Text;  # "": a random pick per request
  # Shadow traffic, sorted by deployment name; empty: no copies. A record
  # with shadows is written with format version 3 (codec.hpp): an older
  # binary would drop them and silently stop the copies.
  shadow @6 :List(ShadowTarget);
  # Served by the Open Inference Protocol too (ApplicationSpec::
  # open_inference): /v2/models/<name>/... and inference.GRPCInferenceService
  # on every node. A record with it set is written with format version 5
  # (codec.hpp): an older binary would drop it, silently stop those routes
  # and write the state back without it. A last good declaration written
  # out in a head's lastRunning does not raise the head's version (like a
  # library pin there): a version 4 binary would roll back to it without
  # the flag.
  openInference @7 :Bool;
}

# One autoscaler decision (TargetState::autoscaled_replicas).
struct AutoscaledCount @0x903b2cc21c648461 {
  application @0 :Text;
  deployment @1 :Text;
  replicas @2 :UInt32;
}

# An application's last good declaration (TargetState::last_running): what
# `troupectl rollback` deploys again.
struct LastRunning @0xe5f938e1b6a565aa {
  application @0 :Text;
  generation @1 :UInt64;  # the target state's generation when it was recorded
  declaration :union {
    # Equal to the application's current declaration (the common case: the
    # application runs what it declares), which is not written twice.
    # `current` for an application the state does not hold is corrupt.
    current @2 :Void;
    spec @3 :ApplicationSpec;
  }
}

# The whole target state in one message (codec: encode_target_state).
struct TargetState @0xd3e510a1aeff7cd6 {
  applications @0 :List(ApplicationSpec);  # unique names
  targetCapacity :union {
    none @1 :Void;  # absent: 100 percent
    value @2 :Float64;
  }
  generation @3 :UInt64;
  # The declared http_options (HttpSettings); a record with any of them set
  # is format version 3 (controller/store/codec.hpp).
  requestTimeoutS :union {
    none @4 :Void;  # absent: the node's --request-timeout
    value @5 :Float64;
  }
  keepAliveTimeoutS :union {
    none @6 :Void;  # absent: the node's --proxy-idle-timeout
    value @7 :Float64;
  }
  # Sorted by application, then deployment. An older binary ignores it and
  # starts an autoscaled deployment at the replicas it finds running (what
  # troupe did before the counts were written ahead): no format bump.
  autoscaledReplicas @8 :List(AutoscaledCount);
  # Sorted by application. An older binary ignores it, with the library pins
  # of the declarations written out in `spec` (it never runs those): no
  # format bump. After a downgrade and an upgrade an application has no last
  # good declaration until it runs its declaration again. In the RocksDB head
  # it stays small: a `current` entry costs its name and generation.
  lastRunning @9 :List(LastRunning);
  # Which way targetCapacity last moved (TargetState::target_capacity_
  # direction). An older binary ignores it (min_replicas is then the lower
  # bound while capacity rises): no format bump.
  targetCapacityDirection @10 :CapacityDirection = none;
}

enum CapacityDirection {
  none @0;
  up @1;
  down @2;
}

# The RocksDB store keeps each application under its own key and everything
# else in one head record: `state` with an empty application list, plus the
# number of application keys the same atomic write left, so a lost or stray
# key is detected on load.
struct CheckpointHead @0xf5f25817edcf7b33 {
  state @0 :TargetState;
  applicationCount @1 :UInt32;
}
