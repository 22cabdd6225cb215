#include "runtime/metrics.hpp"

#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "schemas/metrics.capnp.h"

namespace troupe::metrics {

struct Registry::Impl {
  prometheus::Registry registry;
  mutable std::mutex mutex;
  std::map<std::string, std::vector<prometheus::MetricFamily>> remote;
};

namespace {

schema::MetricType to_wire(prometheus::MetricType t) {
  switch (t) {
    case prometheus::MetricType::Counter:
      return schema::MetricType::COUNTER;
    case prometheus::MetricType::Gauge:
      return schema::MetricType::GAUGE;
    case prometheus::MetricType::Histogram:
      return schema::MetricType::HISTOGRAM;
    default:
      return schema::MetricType::UNTYPED;
  }
}

prometheus::MetricType from_wire(schema::MetricType t) {
  switch (t) {
    case schema::MetricType::COUNTER:
      return prometheus::MetricType::Counter;
    case schema::MetricType::GAUGE:
      return prometheus::MetricType::Gauge;
    case schema::MetricType::HISTOGRAM:
      return prometheus::MetricType::Histogram;
    default:
      return prometheus::MetricType::Untyped;
  }
}

double value_of(const prometheus::ClientMetric& m, prometheus::MetricType t) {
  switch (t) {
    case prometheus::MetricType::Counter:
      return m.counter.value;
    case prometheus::MetricType::Gauge:
      return m.gauge.value;
    default:
      return m.untyped.value;
  }
}

void set_value(prometheus::ClientMetric& m, prometheus::MetricType t, double v) {
  switch (t) {
    case prometheus::MetricType::Counter:
      m.counter.value = v;
      break;
    case prometheus::MetricType::Gauge:
      m.gauge.value = v;
      break;
    default:
      m.untyped.value = v;
  }
}

Result<std::vector<prometheus::MetricFamily>> decode(const std::string& encoded) {
  if (encoded.size() % sizeof(capnp::word) != 0)
    return Status(errc::invalid_argument, "a metrics report is not a whole number of words");
  std::vector<prometheus::MetricFamily> out;
  try {
    kj::ArrayPtr<const capnp::word> words(reinterpret_cast<const capnp::word*>(encoded.data()),
                                          encoded.size() / sizeof(capnp::word));
    capnp::FlatArrayMessageReader reader(words);
    auto root = reader.getRoot<schema::MetricFamilies>();
    for (auto f : root.getFamilies()) {
      prometheus::MetricFamily family;
      family.name = f.getName().cStr();
      family.help = f.getHelp().cStr();
      family.type = from_wire(f.getType());
      for (auto s : f.getMetrics()) {
        prometheus::ClientMetric m;
        for (auto l : s.getLabels())
          m.label.push_back({l.getName().cStr(), l.getValue().cStr()});
        if (family.type == prometheus::MetricType::Histogram) {
          m.histogram.sample_count = s.getSampleCount();
          m.histogram.sample_sum = s.getSampleSum();
          for (auto b : s.getBuckets())
            m.histogram.bucket.push_back({b.getCumulativeCount(), b.getUpperBound()});
        } else {
          set_value(m, family.type, s.getValue());
        }
        family.metric.push_back(std::move(m));
      }
      out.push_back(std::move(family));
    }
  } catch (const kj::Exception& e) {
    return Status(errc::invalid_argument,
                  std::string("a metrics report does not decode: ") + e.getDescription().cStr());
  }
  return out;
}

}  // namespace

Registry::Registry() : impl_(std::make_unique<Impl>()) {}
Registry::~Registry() = default;

prometheus::Registry& Registry::prom() {
  return impl_->registry;
}

std::string Registry::encode() const {
  auto families = impl_->registry.Collect();
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<schema::MetricFamilies>();
  auto out = root.initFamilies(static_cast<unsigned>(families.size()));
  for (unsigned i = 0; i < families.size(); ++i) {
    const auto& f = families[i];
    auto w = out[i];
    w.setName(f.name.c_str());
    w.setHelp(f.help.c_str());
    w.setType(to_wire(f.type));
    auto samples = w.initMetrics(static_cast<unsigned>(f.metric.size()));
    for (unsigned j = 0; j < f.metric.size(); ++j) {
      const auto& m = f.metric[j];
      auto s = samples[j];
      auto labels = s.initLabels(static_cast<unsigned>(m.label.size()));
      for (unsigned k = 0; k < m.label.size(); ++k) {
        labels[k].setName(m.label[k].name.c_str());
        labels[k].setValue(m.label[k].value.c_str());
      }
      if (f.type == prometheus::MetricType::Histogram) {
        s.setSampleCount(m.histogram.sample_count);
        s.setSampleSum(m.histogram.sample_sum);
        auto buckets = s.initBuckets(static_cast<unsigned>(m.histogram.bucket.size()));
        for (unsigned k = 0; k < m.histogram.bucket.size(); ++k) {
          buckets[k].setCumulativeCount(m.histogram.bucket[k].cumulative_count);
          buckets[k].setUpperBound(m.histogram.bucket[k].upper_bound);
        }
      } else {
        s.setValue(value_of(m, f.type));
      }
    }
  }
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

Status Registry::set_remote(const std::string& source, const std::string& encoded) {
  auto decoded = decode(encoded);
  if (!decoded)
    return decoded.status();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->remote[source] = std::move(*decoded);
  return Status::ok();
}

void Registry::drop_remote(const std::string& source) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->remote.erase(source);
}

size_t Registry::remote_sources() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->remote.size();
}

std::string Registry::render() const {
  std::vector<prometheus::MetricFamily> families = impl_->registry.Collect();
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < families.size(); ++i)
    at.emplace(families[i].name, i);
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (const auto& [source, reported] : impl_->remote) {
      for (const auto& f : reported) {
        auto [it, fresh] = at.emplace(f.name, families.size());
        if (fresh) {
          families.push_back(f);
          continue;
        }
        auto& mine = families[it->second];
        if (mine.type != f.type)
          continue;
        mine.metric.insert(mine.metric.end(), f.metric.begin(), f.metric.end());
      }
    }
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

}  // namespace troupe::metrics
