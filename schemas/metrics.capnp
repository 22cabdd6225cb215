# Metrics a replica process reports to its node agent (runtime/metrics.hpp),
# which serves them with the node's own at the proxy's /-/metrics. The
# families of prometheus-cpp's Collect(), in its terms. A node and its
# replica processes may be of different builds during an upgrade: fields are
# only ever added, at the end, with the next ordinal.
@0x9d2b077ee121caad;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

struct MetricFamilies {
  families @0 :List(MetricFamily);
}

struct MetricFamily {
  name @0 :Text;
  help @1 :Text;
  type @2 :MetricType;
  metrics @3 :List(MetricSample);
}

enum MetricType {
  counter @0;
  gauge @1;
  histogram @2;
  untyped @3;
}

struct MetricLabel {
  name @0 :Text;
  value @1 :Text;
}

struct MetricBucket {
  cumulativeCount @0 :UInt64;
  upperBound @1 :Float64;
}

struct MetricSample {
  labels @0 :List(MetricLabel);
  # counter, gauge, untyped
  value @1 :Float64;
  # histogram
  sampleCount @2 :UInt64;
  sampleSum @3 :Float64;
  buckets @4 :List(MetricBucket);
}
