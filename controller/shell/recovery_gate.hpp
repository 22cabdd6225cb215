// Recovery after a controller restart, as plain C++ with an injected clock.
//
// A restarted controller with a non-empty checkpoint must not reconcile at
// once: nodes still run the replicas its predecessor started, and starting
// new ones before those are reported would duplicate them. So it first
// collects what re-registering nodes report, for at most the recovery window,
// and ends early once every node that was alive before the restart (the ids
// kept in <state_dir>/nodes, see NodesFile) has registered again. While
// recovering, user calls are refused (require_ready).
#pragma once

#include <functional>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "controller/core/clock.hpp"
#include "controller/core/commands.hpp"
#include "controller/membership.hpp"
#include "runtime/status.hpp"

namespace troupe::controller {

class RecoveryGate {
 public:
  // Recovering from now on until every node of `expected` has registered
  // again (never early when `expected` is empty), or until `window_s` passed
  // with no node arriving: each arrival (arrived()) gives the others
  // `window_s` more, up to kMaxWindows windows after the start. With nothing
  // to recover (an empty checkpoint) the shell calls finish() at once.
  RecoveryGate(const Clock& clock, double window_s, std::set<std::string> expected);

  // The longest a recovery waits, in windows: nodes that keep arriving keep
  // it open this long at most.
  static constexpr double kMaxWindows = 10;

  bool is_recovering() const { return recovering_; }
  // errc::unavailable while recovering: the caller retries in a few seconds.
  Status require_ready() const;

  // A node registered again while recovering. Nodes still arriving mean
  // the recovery is under way (a thousand nodes take seconds to reconnect):
  // ending it then would start replicas for those about to be reported, and
  // stop the extras once they are. The window runs again from now, within
  // the cap.
  void arrived();
  // Replicas a (re-)registering node reports hosting; kept for finish().
  void collect(std::vector<HostedReplica> hosted);
  const std::vector<HostedReplica>& collected() const { return hosted_; }
  const std::set<std::string>& expected_nodes() const { return expected_; }

  // True while recovering once every expected node is known to `nodes` and
  // not DEAD: there is nothing more to wait for.
  bool all_expected_back(const std::map<std::string, NodeRecord>& nodes) const;
  // True while recovering once the window has passed on the clock.
  bool window_over() const;
  double deadline() const { return deadline_; }

  // Ends the recovery and hands over the replicas collected (to
  // StateManager::recover). Afterwards every call is admitted.
  std::vector<HostedReplica> finish();

 private:
  const Clock* clock_;
  bool recovering_ = true;
  double window_s_ = 0;
  double deadline_ = 0;
  double latest_ = 0;  // the cap: kMaxWindows windows after the start
  std::set<std::string> expected_;
  std::vector<HostedReplica> hosted_;
};

// <state_dir>/nodes: the ids of the live nodes, one per line, so that a
// restarted controller knows whom to wait for. Written only when it changes,
// replaced atomically with a rename. After a failed write the content is
// unknown (etcd may still commit a write it did not confirm): the next
// save() writes whatever it has.
class NodesFile {
 public:
  // Empty `state_dir`: no file; load() is empty and save() does nothing.
  explicit NodesFile(const std::string& state_dir)
      : path_(state_dir.empty() ? std::string() : state_dir + "/nodes") {}
  // The same list kept elsewhere (a head candidate's, in etcd): `where`
  // names it; `read` gives the content ("" when none), `write` stores it.
  NodesFile(std::string where, std::function<std::string()> read,
            std::function<bool(const std::string&)> write)
      : path_(std::move(where)), read_(std::move(read)), write_(std::move(write)) {}

  const std::string& path() const { return path_; }
  // The ids in the file; empty when there is none or it cannot be read (the
  // recovery window then runs in full).
  std::set<std::string> load() const;
  // Writes the ids of the nodes in `nodes` that are not DEAD, unless that is
  // what the last successful write put there. False when the write failed:
  // the file keeps what it had (possibly a stale list, which a restart
  // would take as the nodes to wait for), so the caller tries again
  // (ControllerLogic::save_live_nodes).
  bool save(const std::map<std::string, NodeRecord>& nodes);

  // The file's content for `nodes`.
  static std::string render(const std::map<std::string, NodeRecord>& nodes);

 private:
  std::string path_;
  std::function<std::string()> read_;
  std::function<bool(const std::string&)> write_;
  // Last content written; none after a failed write. Empty at first: a
  // controller with no live node does not clear its predecessor's list.
  std::optional<std::string> written_ = std::string();
};

}  // namespace troupe::controller
