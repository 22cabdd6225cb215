// chaos-netdelay: delays and drops the packets that the firewall of its
// network namespace queues to it (iptables -j NFQUEUE --queue-num N). The
// chaos tool's `degrade` fault runs one per namespace it degrades, for
// kernels without sch_netem (see docs/reliability.md, "Faults between
// hosts").
//
// Every packet is held for --delay-ms (a fixed delay keeps the order), or
// dropped with probability --loss-pct / 100 (seeded). Prints "ready" once it
// listens, so that the rules go in only then; on SIGTERM it lets every held
// packet through and prints what it did.
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <libnetfilter_queue/libnetfilter_queue.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <string>

#include <CLI/CLI.hpp>

namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_stop = 0;

void on_signal(int) {
  g_stop = 1;
}

struct Held {
  uint32_t id;
  Clock::time_point due;
};

struct State {
  nfq_q_handle* queue = nullptr;
  Clock::duration delay{};
  std::bernoulli_distribution lose{0};
  std::mt19937 rng;
  std::deque<Held> held;
  uint64_t seen = 0;
  uint64_t dropped = 0;
  size_t most_held = 0;
};

int on_packet(nfq_q_handle* queue, nfgenmsg*, nfq_data* data, void* arg) {
  auto& st = *static_cast<State*>(arg);
  auto* header = nfq_get_msg_packet_hdr(data);
  if (header == nullptr)
    return 0;
  uint32_t id = ntohl(header->packet_id);
  ++st.seen;
  if (st.lose(st.rng)) {
    ++st.dropped;
    return nfq_set_verdict(queue, id, NF_DROP, 0, nullptr);
  }
  if (st.delay == Clock::duration::zero())
    return nfq_set_verdict(queue, id, NF_ACCEPT, 0, nullptr);
  st.held.push_back({id, Clock::now() + st.delay});
  st.most_held = std::max(st.most_held, st.held.size());
  return 0;
}

void release(State& st, bool all) {
  auto now = Clock::now();
  while (!st.held.empty() && (all || st.held.front().due <= now)) {
    nfq_set_verdict(st.queue, st.held.front().id, NF_ACCEPT, 0, nullptr);
    st.held.pop_front();
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chaos-netdelay: delay and drop the packets queued to it by the firewall"};
  unsigned queue_num = 0;
  double delay_ms = 0;
  double loss_pct = 0;
  uint32_t seed = 1;
  app.add_option("--queue", queue_num, "NFQUEUE number")->required();
  app.add_option("--delay-ms", delay_ms, "delay of every packet it lets through")
      ->check(CLI::Range(0.0, 10000.0));
  app.add_option("--loss-pct", loss_pct, "share of packets dropped")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--seed", seed, "seed of the drops");
  CLI11_PARSE(app, argc, argv);

  State st;
  st.delay = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(delay_ms));
  st.lose = std::bernoulli_distribution(loss_pct / 100.0);
  st.rng.seed(seed);

  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);

  nfq_handle* handle = nfq_open();
  if (handle == nullptr) {
    std::fprintf(stderr, "chaos-netdelay: cannot open netfilter queueing: %s\n",
                 std::strerror(errno));
    return 1;
  }
  nfq_unbind_pf(handle, AF_INET);
  if (nfq_bind_pf(handle, AF_INET) < 0) {
    std::fprintf(stderr, "chaos-netdelay: cannot bind IPv4 queueing: %s\n", std::strerror(errno));
    return 1;
  }
  st.queue = nfq_create_queue(handle, static_cast<uint16_t>(queue_num), &on_packet, &st);
  if (st.queue == nullptr) {
    std::fprintf(stderr, "chaos-netdelay: cannot take queue %u: %s\n", queue_num,
                 std::strerror(errno));
    return 1;
  }
  // Only the verdict is needed, not the payload.
  nfq_set_mode(st.queue, NFQNL_COPY_META, 0);
  nfq_set_queue_maxlen(st.queue, 1 << 16);
  int fd = nfq_fd(handle);
  nfnl_rcvbufsiz(nfq_nfnlh(handle), 8 << 20);
  int on = 1;
  setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &on, sizeof(on));
  std::printf("ready\n");
  std::fflush(stdout);

  alignas(8) char buf[1 << 16];
  while (!g_stop) {
    int timeout_ms = -1;
    if (!st.held.empty()) {
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(st.held.front().due -
                                                                        Clock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, wait.count()));
    }
    pollfd p{fd, POLLIN, 0};
    int n = ::poll(&p, 1, timeout_ms);
    if (n < 0 && errno != EINTR) {
      std::fprintf(stderr, "chaos-netdelay: poll: %s\n", std::strerror(errno));
      break;
    }
    if (n > 0) {
      while (true) {
        ssize_t got = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (got <= 0)
          break;
        nfq_handle_packet(handle, buf, static_cast<int>(got));
      }
    }
    release(st, false);
  }
  release(st, true);
  std::printf("seen %llu dropped %llu most-held %zu\n", static_cast<unsigned long long>(st.seen),
              static_cast<unsigned long long>(st.dropped), st.most_held);
  std::fflush(stdout);
  nfq_destroy_queue(st.queue);
  nfq_close(handle);
  return 0;
}
