// The one keeper (runtime/keeper_actor.hpp) under CAF's deterministic test
// scheduler: messages run only when the test says so, the restart policy's
// delays fire only when the test advances CAF's clock, and the policy itself
// reads a clock the test sets. Nothing waits on real time.
#define CAF_TEST_NO_MAIN
#include <caf/test/unit_test_impl.hpp>

#include <caf/test/dsl.hpp>

#include <memory>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "runtime/keeper_actor.hpp"
#include "runtime/wire.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

struct KeeperConfig : caf::actor_system_config {
  KeeperConfig() { register_wire_types(*this); }
};

using who_atom = caf::atom_constant<caf::atom("who")>;
using note_atom = caf::atom_constant<caf::atom("note")>;
using own_atom = caf::atom_constant<caf::atom("own")>;

// What the kept actors saw, over all their generations.
struct Seen {
  int started = 0;
  std::vector<std::string> notes;  // "<generation>:<text>"
  std::vector<caf::actor> kept;
};

// A kept actor: answers (who) with its generation and the sender it saw;
// records (note, text).
caf::behavior kept(caf::event_based_actor* self, std::shared_ptr<Seen> seen, int generation) {
  return {
      [=](who_atom) {
        return caf::make_message(
            generation, self->current_sender() ? self->current_sender()->id() : caf::actor_id{0});
      },
      [=](note_atom, const std::string& text) {
        seen->notes.push_back(std::to_string(generation) + ":" + text);
      },
  };
}

struct Fixture : test_coordinator_fixture<KeeperConfig> {
  std::shared_ptr<Seen> seen = std::make_shared<Seen>();
  RestartLimiter::time_point now{std::chrono::hours(1)};
  std::vector<std::string> gave_up;
  int gone = 0;
  caf::actor keeper;

  KeeperOptions options(int max_restarts, RestartPolicy::duration min_interval = 0s) {
    KeeperOptions k;
    k.what = "test actor";
    k.policy.max_restarts = max_restarts;
    k.policy.window = 60s;
    k.policy.min_interval = min_interval;
    k.now = [this] { return now; };
    k.unavailable = "the test actor is restarting";
    k.start = [seen = seen](Keeper& keeper) {
      auto a = keeper.self()->home_system().spawn(kept, seen, ++seen->started);
      seen->kept.push_back(a);
      return a;
    };
    k.on_gone = [this] { ++gone; };
    k.on_give_up = [this](const std::string& m) { gave_up.push_back(m); };
    k.hold = [](const caf::message& m) { return m.match_element<note_atom>(0); };
    k.handlers = [](Keeper& keeper) -> caf::message_handler {
      return {[&keeper](own_atom) { return keeper.restarts(); }};
    };
    return k;
  }

  void spawn(KeeperOptions k) {
    keeper = spawn_keeper(sys, std::move(k), "troupe.test-keeper");
    sched.run();
  }

  ~Fixture() override {
    if (keeper)
      caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
    sched.run();
  }

  // Kills the current kept actor with an error (a crash) and runs until idle.
  void crash_current() {
    REQUIRE(!seen->kept.empty());
    caf::anon_send_exit(seen->kept.back(), caf::exit_reason::kill);
    sched.run();
  }

  // Asks (who) through the keeper: the kept actor's generation and the
  // sender it saw, or the error.
  caf::expected<std::pair<int, caf::actor_id>> who() {
    auto handle = self->request(keeper, caf::infinite, who_atom::value);
    sched.run();
    caf::expected<std::pair<int, caf::actor_id>> out{caf::error{}};
    handle.receive(
        [&](int generation, caf::actor_id sender) { out = std::make_pair(generation, sender); },
        [&](caf::error& err) { out = std::move(err); });
    return out;
  }
};

}  // namespace

TEST_CASE_FIXTURE(
    Fixture,
    "keeper: a message it does not handle reaches the kept actor - which answers the sender") {
  spawn(options(10));
  auto answer = who();
  REQUIRE(answer);
  CHECK(answer->first == 1);
  CHECK(answer->second == self->id());  // the caller's, not the keeper's
  self->send(keeper, own_atom::value);  // the keeper's own message
  sched.run();
  self->receive([](int restarts) { CHECK(restarts == 0); },
                caf::after(0s) >> [] { FAIL("no answer"); });
}

TEST_CASE_FIXTURE(Fixture,
                  "keeper: a kept actor that crashes is restarted and the next one answers") {
  spawn(options(10));
  crash_current();
  CHECK(gone == 1);
  CHECK(seen->started == 2);
  auto answer = who();
  REQUIRE(answer);
  CHECK(answer->first == 2);
  CHECK(gave_up.empty());
}

TEST_CASE_FIXTURE(Fixture,
                  "keeper: while the restart waits - requests get unavailable and held messages "
                  "wait for the next actor") {
  spawn(options(10, 1s));
  crash_current();  // restart #1: at once
  REQUIRE(seen->started == 2);
  crash_current();  // sooner than min_interval after restart #1: delayed
  CHECK(seen->started == 2);
  auto refused = who();
  REQUIRE_FALSE(refused);
  auto status = from_caf_error(refused.error());
  CHECK(status.code() == errc::unavailable);
  CHECK(status.message() == "the test actor is restarting");
  self->send(keeper, note_atom::value, std::string("while down"));
  sched.run();
  CHECK(seen->notes.empty());
  now += 1s;
  sched.trigger_timeouts();
  sched.run();
  CHECK(seen->started == 3);
  CHECK(seen->notes == std::vector<std::string>{"3:while down"});
}

TEST_CASE_FIXTURE(Fixture,
                  "keeper: past the policy it gives up - on_give_up gets the message and the "
                  "keeper quits with it") {
  spawn(options(2));
  self->monitor(keeper);
  crash_current();
  now += 1s;
  crash_current();
  REQUIRE(seen->started == 3);
  CHECK(gave_up.empty());
  now += 1s;
  crash_current();            // the third death within the window
  CHECK(seen->started == 3);  // not restarted
  REQUIRE(gave_up.size() == 1);
  CHECK(gave_up[0].rfind("gave up on the test actor: it was restarted 2 times within 60 s and died "
                         "again; last exit reason: ",
                         0) == 0);
  caf::error reason;
  self->receive([&](caf::down_msg& dm) { reason = dm.reason; },
                caf::after(0s) >> [] { FAIL("the keeper did not quit"); });
  CHECK(from_caf_error(reason).code() == errc::unavailable);
  CHECK(from_caf_error(reason).message() == gave_up[0]);
  keeper = nullptr;
}

TEST_CASE_FIXTURE(
    Fixture,
    "keeper: a kept actor stopped on request is not restarted - the keeper quits with it") {
  spawn(options(10));
  self->monitor(keeper);
  caf::anon_send_exit(seen->kept.back(), caf::exit_reason::user_shutdown);
  sched.run();
  CHECK(seen->started == 1);
  CHECK(gave_up.empty());
  self->receive([](caf::down_msg& dm) { CHECK(dm.reason == caf::exit_reason::user_shutdown); },
                caf::after(0s) >> [] { FAIL("the keeper did not quit"); });
  keeper = nullptr;
}

TEST_CASE_FIXTURE(Fixture, "keeper: an exit message to the keeper stops the kept actor too") {
  spawn(options(10));
  auto kept_actor = seen->kept.back();
  self->monitor(kept_actor);
  caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
  sched.run();
  self->receive([](caf::down_msg& dm) { CHECK(dm.reason == caf::exit_reason::user_shutdown); },
                caf::after(0s) >> [] { FAIL("the kept actor did not stop"); });
  CHECK(seen->started == 1);
  keeper = nullptr;
}

TEST_CASE_FIXTURE(Fixture, "keeper: an actor already running is adopted - not started again") {
  auto first = sys.spawn(kept, seen, 7);
  seen->kept.push_back(first);
  keeper = spawn_keeper(sys, options(10), "troupe.test-keeper", first);
  sched.run();
  CHECK(seen->started == 0);
  auto answer = who();
  REQUIRE(answer);
  CHECK(answer->first == 7);
  crash_current();  // the adopted one is kept like any other
  CHECK(seen->started == 1);
}

namespace {
using release_atom = caf::atom_constant<caf::atom("release")>;
using again_atom = caf::atom_constant<caf::atom("again")>;
}  // namespace

TEST_CASE_FIXTURE(Fixture,
                  "keeper: a released actor ends without a restart - the keeper stays and start() "
                  "runs the next") {
  auto k = options(0);  // a single crash would give up: a release is none
  k.handlers = [](Keeper& keeper) -> caf::message_handler {
    return {[&keeper](release_atom) { keeper.release(caf::exit_reason::kill); },
            [&keeper](again_atom) { keeper.start(); }};
  };
  spawn(std::move(k));
  auto first = seen->kept.back();
  self->monitor(first);
  self->monitor(keeper);
  self->send(keeper, release_atom::value);
  sched.run();
  self->receive([](caf::down_msg& dm) { CHECK(dm.reason == caf::exit_reason::kill); },
                caf::after(0s) >> [] { FAIL("the released actor did not end"); });
  CHECK(gone == 1);
  CHECK(seen->started == 1);
  CHECK(gave_up.empty());
  auto none = who();
  REQUIRE_FALSE(none);
  CHECK(self->system().render(none.error()).find("the test actor is restarting") !=
        std::string::npos);
  self->send(keeper, again_atom::value);
  sched.run();
  CHECK(seen->started == 2);
  auto answer = who();
  REQUIRE(answer);
  CHECK(answer->first == 2);
  // The keeper did not quit on the way.
  self->receive([](caf::down_msg&) { FAIL("the keeper quit"); }, caf::after(0s) >> [] {});
}
