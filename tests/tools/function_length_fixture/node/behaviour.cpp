// A fixture of tools/check_function_length.py (its --selftest): not built.
// Braces in comments do not count: { { { and } } }
/* nor in a block comment: }
   { */
#include <string>

#define OPEN_BRACE {
#define BLOCK(x) \
  { x }

namespace fixture {
namespace {

int spawn_worker(int n) {
  // a comment with a brace }
  const char* s = "a string with { and \" and }";
  char open = '{';
  char close = '}';
  int big = 1'000'000;
  return n + s[0] + open + close + big;
}

// The behaviour of an actor: its handlers are lambdas of the function.
behavior worker(actor* self, int limit) {
  auto count = std::make_shared<int>(0);
  auto bump = [count](int by) {
    *count += by;
    return *count;
  };
  self->set_down_handler([=](const down_msg& msg) {
    if (msg.reason) {
      bump(1);
    }
  });
  return {
    [=](get_atom) -> int {
      return *count;
    },
    [=](put_atom, int x) {
      if (x > limit) {
        return bump(limit);
      }
      for (int i = 0; i < x; ++i) {
        bump(1);
      }
      return *count;
    },
    [=](reset_atom) {
      *count = 0;
      self->delayed_send(self, std::chrono::seconds(1), tick_atom_v);
    },
    [=](tick_atom) {
      struct Local {
        int value{0};
        int get() const { return value; }
      };
      Local l{};
      return l.get();
    },
  };
}

}  // namespace

struct Counter {
  int operator()(int x) const {
    return x + 1;
  }
};
bool operator==(const Counter&, const Counter&) {
  return true;
}

extern "C" {
int legacy_entry(int x) {
  int table[] = {1, 2, 3};
  return table[x];
}
}

const char* platform_name() {
#if defined(__linux__)
  if (true) {
    return "linux";
#else
  if (false) {
    return "other";
#endif
  }
  return "?";
}

}  // namespace fixture
