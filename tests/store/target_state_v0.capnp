# Test fixture: an older, smaller shape of schemas/target_state.capnp, as a
# first release might have shipped it. Same file ID, struct IDs, field names
# and ordinals for what it has; every later field is missing. The compat
# tests encode with this schema (parsed at run time, so its IDs do not clash
# with the compiled-in schema) and decode with the current codec: missing
# fields must come back as the model's defaults.
#
# Never edit this file to follow the current schema: its point is to stay old.
@0xc5910c645bfa5fc2;

struct ResourceAmount @0xeff2a5bdee29facc {
  name @0 :Text;
  amount @1 :Float64;
}

struct Resources @0xa3007cd29b5f67be {
  amounts @0 :List(ResourceAmount);
}

# Missing: metricsIntervalS .. downscaleDelayS (@5 - @13).
struct AutoscalingConfig @0xc2d29b42b777561a {
  minReplicas @0 :UInt32 = 1;
  maxReplicas @1 :UInt32 = 1;
  initialReplicas :union {
    none @2 :Void;
    value @3 :UInt32;
  }
  targetOngoingRequests @4 :Float64 = 2.0;
}

# Missing: healthCheckPeriodS .. maxReplicasPerNode (@6 - @11), so also
# resources.
struct DeploymentConfig @0xfc284f5555afc3f4 {
  numReplicas @0 :UInt32 = 1;
  maxOngoingRequests @1 :UInt32 = 5;
  maxQueuedRequests @2 :Int32 = -1;
  userConfig @3 :Text;
  autoscaling :union {
    none @4 :Void;
    config @5 :AutoscalingConfig;
  }
}

struct DeploymentSpec @0x97f5d1d179ca4da8 {
  name @0 :Text;
  importPath @1 :Text;
  initArgs @2 :Text;
  codeVersion @3 :Text;
  config @4 :DeploymentConfig;
}

struct ApplicationSpec @0x8ac0080a07b65914 {
  name @0 :Text;
  routePrefix @1 :Text;
  ingress @2 :Text;
  deployments @3 :List(DeploymentSpec);
}

# Missing: targetCapacity (@1, @2), generation @3.
struct TargetState @0xd3e510a1aeff7cd6 {
  applications @0 :List(ApplicationSpec);
}

struct CheckpointHead @0xf5f25817edcf7b33 {
  state @0 :TargetState;
  applicationCount @1 :UInt32;
}
