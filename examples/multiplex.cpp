// ModelHost: model multiplexing. Each request names a model in the
// `serve_multiplexed_model_id` header (or X-Troupe-Model-Id); the replica keeps
// at most max_num_models_per_replica models in a troupe::ModelCache, loading
// one on a miss (?load_ms=N simulates the load time, default 0) and evicting
// the least recently used. The proxies send a request to a replica that holds
// its model. Answers
//   {"model_id": ..., "replica_id": ..., "node_id": ..., "hit": true|false,
//    "loaded": [ids held after serving, most recently used first],
//    "loads": loads this replica made so far}
// where "hit" says whether the model was loaded already when the request
// arrived (false: this request loaded it, or waited for a load in progress).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include <troupe/deployment.hpp>

#include "example_util.hpp"

namespace {

struct Model {
  std::string id;
};

// The load time of the request being handled on this thread: the loader runs
// on the thread of the get() that missed.
thread_local int64_t current_load_ms = 0;

class ModelHost : public troupe::Deployment {
 public:
  ModelHost(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx)
      : ctx_(ctx), models_(ctx, [this](const std::string& id) { return load(id); }) {}

  troupe::Response handle(const troupe::Request& request) override {
    const std::string model_id = request.multiplexed_model_id();
    if (model_id.empty()) {
      return troupe::Response::json(
          {{"error", "name a model in the serve_multiplexed_model_id header"}}, 400);
    }
    const std::string text = request.query_param("load_ms", "0");
    const int64_t load_ms = troupe_examples::parse_ms(text);
    if (load_ms < 0)
      return troupe_examples::bad_ms(text);
    current_load_ms = load_ms;
    auto found = models_.lookup(model_id);
    return troupe::Response::json({{"model_id", found.model->id},
                                   {"replica_id", ctx_.replica_id},
                                   {"node_id", ctx_.node_id},
                                   {"hit", found.hit},
                                   {"loaded", models_.model_ids()},
                                   {"loads", loads_.load()}});
  }

 private:
  std::shared_ptr<Model> load(const std::string& id) {
    std::this_thread::sleep_for(std::chrono::milliseconds(current_load_ms));
    loads_.fetch_add(1);
    return std::make_shared<Model>(Model{id});
  }

  const troupe::ReplicaContext ctx_;
  std::atomic<int64_t> loads_{0};
  troupe::ModelCache<Model> models_;  // last: its loader uses the members above
};

}  // namespace

TROUPE_DEPLOYMENT(ModelHost)
