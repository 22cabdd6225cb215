#include "node/process_supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "runtime/doorbell.hpp"
#include "runtime/log.hpp"

extern char** environ;

namespace troupe::node {

namespace fs = std::filesystem;

std::string signal_name(int signal) {
  if (const char* abbrev = ::sigabbrev_np(signal))
    return std::string("SIG") + abbrev;
  return "signal " + std::to_string(signal);
}

std::string ProcessExit::describe() const {
  std::string how;
  if (signal > 0) {
    how = "killed by " + signal_name(signal);
    if (core_dumped)
      how += " (core dumped)";
  } else {
    how = "exited with status " + std::to_string(exit_code);
  }
  if (memory_limit_exceeded) {
    std::string limit = memory_limit_bytes > 0 ? " of " + format_bytes(memory_limit_bytes) : "";
    return "exceeded its memory limit" + limit + " (" + how + ")";
  }
  return how;
}

namespace {

int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

int pidfd_send_signal(int pidfd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

bool write_file(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  ssize_t n = ::write(fd, text.data(), text.size());
  ::close(fd);
  return n == static_cast<ssize_t>(text.size());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The cgroup2 directory of this process, or "".
std::string own_cgroup2_dir() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::string path;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0)
      path = line.substr(3);
  }
  if (path.empty())
    return "";
  for (const char* mount : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    if (fs::exists(std::string(mount) + "/cgroup.controllers"))
      return std::string(mount) + (path == "/" ? "" : path);
  }
  return "";
}

bool has_word(const std::string& text, const std::string& word) {
  std::istringstream in(text);
  std::string w;
  while (in >> w) {
    if (w == word)
      return true;
  }
  return false;
}

// A replica id as a file and cgroup name: no '/', no leading dot.
std::string file_name(const std::string& id) {
  std::string out = id;
  for (auto& c : out) {
    if (c == '/' || c == '\0')
      c = '_';
  }
  if (!out.empty() && out[0] == '.')
    out[0] = '_';
  return out;
}

std::string path_in(const std::string& log_dir, const std::string& id) {
  return log_dir + "/" + file_name(id) + ".log";
}

}  // namespace

struct Child {
  std::string id;
  pid_t pid = 0;
  int pidfd = -1;
  int out_fd = -1;
  int log_fd = -1;
  std::string log_path;
  uint64_t log_bytes = 0;
  std::string cgroup;  // its cgroup directory, or ""
  uint64_t memory_limit = 0;
  int doorbell = -1;   // the node's end (runtime/doorbell.hpp), or -1
  // The last connection offered; none yet: the first ring is owed one
  // (the steady clock's zero is the machine's boot, not a time of ours).
  std::optional<std::chrono::steady_clock::time_point> last_offer;
};

struct ProcessSupervisor::Impl {
  SupervisorOptions options;
  std::shared_ptr<spdlog::logger> log = troupe::log::get("processes");
  int epoll_fd = -1;
  int wake_fd = -1;
  std::atomic<bool> stopping{false};
  std::thread thread;
  mutable std::mutex mutex;
  std::map<std::string, std::unique_ptr<Child>> children;  // by id
  std::map<int, Child*> by_fd;                              // pidfds and output pipes
  std::string cgroup_root;  // "" : RLIMIT_AS

  ~Impl() {
    if (epoll_fd >= 0)
      ::close(epoll_fd);
    if (wake_fd >= 0)
      ::close(wake_fd);
  }

  // Makes a cgroup under which each limited process gets its own, with the
  // memory controller enabled; "" when this node cannot.
  void setup_cgroups() {
    std::string base = options.cgroup_root;
    if (base.empty()) {
      std::string own = own_cgroup2_dir();
      if (own.empty())
        return;
      if (!has_word(read_file(own + "/cgroup.controllers"), "memory"))
        return;
      base = own + "/troupe-" + std::to_string(::getpid());
      std::error_code ec;
      fs::create_directory(base, ec);
      if (ec)
        return;
      // Delegating the memory controller to children works only where no
      // process sits in `own` itself (or `own` is the root cgroup).
      if (!has_word(read_file(own + "/cgroup.subtree_control"), "memory") &&
          !write_file(own + "/cgroup.subtree_control", "+memory")) {
        ::rmdir(base.c_str());
        return;
      }
    }
    if (!has_word(read_file(base + "/cgroup.subtree_control"), "memory") &&
        !write_file(base + "/cgroup.subtree_control", "+memory")) {
      if (options.cgroup_root.empty())
        ::rmdir(base.c_str());
      return;
    }
    cgroup_root = base;
  }

  void open_log(Child& c) {
    if (options.log_dir.empty())
      return;
    c.log_path = path_in(options.log_dir, c.id);
    c.log_fd = ::open(c.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat sb {};
    if (c.log_fd >= 0 && ::fstat(c.log_fd, &sb) == 0)
      c.log_bytes = static_cast<uint64_t>(sb.st_size);
  }

  void write_log(Child& c, const char* data, size_t n) {
    while (n > 0 && c.log_fd >= 0) {
      if (c.log_bytes >= options.log_max_bytes) {
        ::close(c.log_fd);
        std::error_code ec;
        fs::rename(c.log_path, c.log_path + ".1", ec);
        c.log_fd = ::open(c.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        c.log_bytes = 0;
        continue;
      }
      size_t room = static_cast<size_t>(options.log_max_bytes - c.log_bytes);
      ssize_t w = ::write(c.log_fd, data, std::min(n, room));
      if (w <= 0)
        return;
      data += w;
      n -= static_cast<size_t>(w);
      c.log_bytes += static_cast<uint64_t>(w);
    }
  }

  // Reads what the process wrote; closes the pipe at its end.
  void drain(Child& c) {
    char buf[16384];
    while (c.out_fd >= 0) {
      ssize_t n = ::read(c.out_fd, buf, sizeof(buf));
      if (n > 0) {
        write_log(c, buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
      ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.out_fd, nullptr);
      by_fd.erase(c.out_fd);
      ::close(c.out_fd);
      c.out_fd = -1;
    }
  }

  void close_doorbell(Child& c) {
    if (c.doorbell < 0)
      return;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.doorbell, nullptr);
    by_fd.erase(c.doorbell);
    ::close(c.doorbell);
    c.doorbell = -1;
  }

  // The process rang: true when it is owed a connection now (at most one
  // per doorbell_interval_s; a process that rings meanwhile rings again).
  bool rang(Child& c) {
    auto rings = gate_link::take_rings(c.doorbell);
    if (!rings) {
      close_doorbell(c);  // its end is closed: it exits
      return false;
    }
    auto now = std::chrono::steady_clock::now();
    auto interval = std::chrono::duration<double>(options.doorbell_interval_s);
    if (*rings == 0 || (c.last_offer && now - *c.last_offer < interval))
      return false;
    c.last_offer = now;
    return true;
  }

  // Reaps an exited child (blocking when `wait`), and releases its resources.
  ProcessExit reap(Child& c, bool wait) {
    ProcessExit exit;
    exit.pid = c.pid;
    siginfo_t info{};
    int flags = WEXITED | (wait ? 0 : WNOHANG);
    int rc;
    do {
      rc = ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(c.pidfd), &info, flags);
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) {
      if (info.si_code == CLD_EXITED) {
        exit.exit_code = info.si_status;
      } else {
        exit.signal = info.si_status;
        exit.core_dumped = info.si_code == CLD_DUMPED;
      }
    }
    drain(c);
    if (c.out_fd >= 0) {
      // A process the replica started still holds the pipe: what it writes
      // from now on is not this replica's.
      ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.out_fd, nullptr);
      by_fd.erase(c.out_fd);
      ::close(c.out_fd);
      c.out_fd = -1;
    }
    exit.memory_limit_bytes = c.memory_limit;
    if (exit.exit_code == kExitMemoryLimit && c.memory_limit > 0)
      exit.memory_limit_exceeded = true;
    if (!c.cgroup.empty()) {
      std::istringstream events(read_file(c.cgroup + "/memory.events"));
      std::string key;
      uint64_t value = 0;
      while (events >> key >> value) {
        if (key == "oom_kill" && value > 0)
          exit.memory_limit_exceeded = true;
      }
      ::rmdir(c.cgroup.c_str());
    }
    std::string line = "[troupe] process " + std::to_string(c.pid) + " of replica " + c.id + " " +
                       exit.describe() + "\n";
    write_log(c, line.data(), line.size());
    if (c.log_fd >= 0)
      ::close(c.log_fd);
    c.log_fd = -1;
    close_doorbell(c);
    ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.pidfd, nullptr);
    by_fd.erase(c.pidfd);
    ::close(c.pidfd);
    c.pidfd = -1;
    return exit;
  }

  void loop() {
    epoll_event events[32];
    while (!stopping.load()) {
      int n = ::epoll_wait(epoll_fd, events, 32, -1);
      if (n < 0) {
        if (errno == EINTR)
          continue;
        log->critical("epoll_wait failed: {}", std::strerror(errno));
        return;
      }
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd == wake_fd) {
          uint64_t v;
          (void)!::read(wake_fd, &v, sizeof(v));
          continue;
        }
        std::unique_ptr<Child> exited;
        ProcessExit exit;
        std::string ringing;
        {
          std::lock_guard<std::mutex> lock(mutex);
          auto it = by_fd.find(fd);
          if (it == by_fd.end())
            continue;
          Child& c = *it->second;
          if (fd == c.out_fd) {
            drain(c);
            continue;
          }
          if (fd == c.doorbell) {
            if (rang(c))
              ringing = c.id;
          } else {
            exit = reap(c, /*wait=*/false);
            auto cit = children.find(c.id);
            exited = std::move(cit->second);
            children.erase(cit);
          }
        }
        // `fd` stays open: only this thread closes doorbells, when it reaps.
        if (!ringing.empty()) {
          if (options.on_doorbell)
            options.on_doorbell(ringing, fd);
          continue;
        }
        if (!exited)
          continue;
        if (options.on_exit)
          options.on_exit(exited->id, exit);
      }
    }
  }

  void prune_logs() {
    if (options.log_dir.empty())
      return;
    std::vector<std::pair<fs::file_time_type, fs::path>> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(options.log_dir, ec)) {
      if (!e.is_regular_file(ec))
        continue;
      auto name = e.path().filename().string();
      auto stem = name.substr(0, name.find(".log"));
      bool live = false;
      for (const auto& [id, c] : children)
        live = live || file_name(id) == stem;
      if (!live)
        files.emplace_back(e.last_write_time(ec), e.path());
    }
    std::sort(files.begin(), files.end());
    auto now = fs::file_time_type::clock::now();
    auto keep = std::chrono::duration_cast<fs::file_time_type::duration>(
        std::chrono::duration<double>(options.log_keep_s));
    size_t excess = files.size() > options.log_keep_files ? files.size() - options.log_keep_files : 0;
    for (size_t i = 0; i < files.size(); ++i) {
      if (i < excess || now - files[i].first > keep)
        fs::remove(files[i].second, ec);
    }
  }

  // spawn()'s steps (below).
  Status limit_memory(Child& c, const ProcessSpec& spec);
  void watch(std::unique_ptr<Child> c);
};

ProcessSupervisor::ProcessSupervisor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<ProcessSupervisor>> ProcessSupervisor::start(SupervisorOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  if (!impl->options.log_dir.empty()) {
    std::error_code ec;
    fs::create_directories(impl->options.log_dir, ec);
    if (ec) {
      return Status(errc::io_error, "cannot create the replica log directory '" +
                                        impl->options.log_dir + "': " + ec.message());
    }
  }
  impl->epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  impl->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->epoll_fd < 0 || impl->wake_fd < 0)
    return Status(errc::io_error, std::string("epoll/eventfd: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = impl->wake_fd;
  ::epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, impl->wake_fd, &ev);
  if (impl->options.use_cgroups)
    impl->setup_cgroups();
  impl->prune_logs();
  auto* raw = impl.get();
  impl->thread = std::thread([raw] { raw->loop(); });
  raw->log->info("replica processes: memory limits enforced with {}",
                 raw->cgroup_root.empty() ? "RLIMIT_AS" : "cgroup v2 memory.max");
  return std::unique_ptr<ProcessSupervisor>(new ProcessSupervisor(std::move(impl)));
}

ProcessSupervisor::~ProcessSupervisor() {
  shutdown();
}

void ProcessSupervisor::shutdown() {
  auto& im = *impl_;
  if (im.stopping.exchange(true))
    return;
  uint64_t one = 1;
  (void)!::write(im.wake_fd, &one, sizeof(one));
  if (im.thread.joinable())
    im.thread.join();
  std::lock_guard<std::mutex> lock(im.mutex);
  for (auto& [id, c] : im.children) {
    im.log->warn("killing replica process {} ({}) left at shutdown", c->pid, id);
    pidfd_send_signal(c->pidfd, SIGKILL);
    im.reap(*c, /*wait=*/true);
  }
  im.children.clear();
  if (!im.cgroup_root.empty() && im.options.cgroup_root.empty())
    ::rmdir(im.cgroup_root.c_str());
}

namespace {

// The child's environment: the node's, with the spec's entries in place of
// those of the same name.
std::vector<std::string> child_env(const ProcessSpec& spec) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    auto key = entry.substr(0, entry.find('='));
    bool replaced = std::any_of(spec.env.begin(), spec.env.end(),
                                [&](const auto& kv) { return kv.first == key; });
    if (!replaced)
      env.push_back(std::move(entry));
  }
  for (const auto& [k, v] : spec.env)
    env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings)
    out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The passed descriptors, first copied above the range they go to (from
// `first_free` on), so that no dup2 in the child overwrites one that is
// still to be copied.
Result<std::vector<int>> copy_passed(const std::vector<int>& fds, int first_free) {
  std::vector<int> passed;
  for (int fd : fds) {
    int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, first_free);
    if (copy < 0) {
      int err = errno;
      for (int c : passed)
        ::close(c);
      return Status(errc::io_error, std::string("dup of a passed descriptor: ") +
                                        std::strerror(err));
    }
    passed.push_back(copy);
  }
  return passed;
}

// posix_spawn with stdin from `in`, stdout and stderr into `out`, the passed
// descriptors as 3..., nothing else of the node, in `dir` (unless empty):
// 0 or the error number.
int spawn_child(const ProcessSpec& spec, const std::string& dir, int in, int out,
                const std::vector<int>& passed, char* const* argv, char* const* envp,
                pid_t& pid) {
  const int first_free = 3 + static_cast<int>(passed.size());
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in, 0);
  posix_spawn_file_actions_adddup2(&actions, out, 1);
  posix_spawn_file_actions_adddup2(&actions, out, 2);
  for (size_t i = 0; i < passed.size(); ++i)
    posix_spawn_file_actions_adddup2(&actions, passed[i], 3 + static_cast<int>(i));
  // Nothing else of the node (sockets, the checkpoint, logs) leaks into user
  // code.
  posix_spawn_file_actions_addclosefrom_np(&actions, first_free);
  // It runs in the replica log directory: a core file it leaves (with a
  // relative core_pattern) lands next to its log, not in the node's cwd.
  if (!dir.empty())
    posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // The node blocks SIGINT/SIGTERM in every thread: a replica must not
  // inherit that. Its own process group: a terminal's Ctrl-C goes to the
  // node, which stops its replicas in order.
  sigset_t none;
  sigemptyset(&none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP})
    sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  int rc = ::posix_spawn(&pid, spec.executable.c_str(), &actions, &attr, argv, envp);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return rc;
}

}  // namespace

// The limit holds before the process reads its stdin, i.e. before it runs
// any user code: its own cgroup when the node has a cgroup root, else
// RLIMIT_AS. An error: the process was killed and reaped.
Status ProcessSupervisor::Impl::limit_memory(Child& c, const ProcessSpec& spec) {
  bool limited = false;
  if (!cgroup_root.empty()) {
    std::string dir = cgroup_root + "/" + file_name(spec.id);
    std::error_code ec;
    fs::create_directory(dir, ec);
    bool made = !ec && write_file(dir + "/memory.max", std::to_string(spec.memory_limit_bytes));
    // No swap beyond the limit (the file is absent without swap accounting).
    if (made)
      write_file(dir + "/memory.swap.max", "0");
    if (made && write_file(dir + "/cgroup.procs", std::to_string(c.pid))) {
      c.cgroup = dir;
      limited = true;
    } else {
      ::rmdir(dir.c_str());
    }
  }
  if (!limited) {
    rlimit lim{spec.memory_limit_bytes, spec.memory_limit_bytes};
    limited = ::prlimit(c.pid, RLIMIT_AS, &lim, nullptr) == 0;
  }
  if (limited)
    return Status::ok();
  int err = errno;
  pidfd_send_signal(c.pidfd, SIGKILL);
  reap(c, /*wait=*/true);
  return Status(errc::io_error, "cannot apply the memory limit to replica " + spec.id + ": " +
                                    std::strerror(err));
}

// Watches the child's output and exit (the supervisor's thread).
void ProcessSupervisor::Impl::watch(std::unique_ptr<Child> c) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = c->out_fd;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c->out_fd, &ev);
  ev.data.fd = c->pidfd;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c->pidfd, &ev);
  by_fd[c->out_fd] = c.get();
  by_fd[c->pidfd] = c.get();
  if (c->doorbell >= 0) {
    ev.data.fd = c->doorbell;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c->doorbell, &ev);
    by_fd[c->doorbell] = c.get();
  }
  children[c->id] = std::move(c);
}

Result<pid_t> ProcessSupervisor::spawn(const ProcessSpec& spec) {
  gate_link::Fd doorbell(spec.doorbell);  // ours now, closed unless it runs
  auto& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mutex);
  if (im.stopping.load())
    return Status(errc::unavailable, "the node is shutting down");
  if (im.children.count(spec.id))
    return Status(errc::already_exists, "a process for " + spec.id + " runs already");
  im.prune_logs();

  // argv and envp, built before the spawn.
  std::vector<std::string> args{spec.executable};
  args.insert(args.end(), spec.args.begin(), spec.args.end());
  auto argv = pointers(args);
  auto env = child_env(spec);
  auto envp = pointers(env);

  int in_pipe[2];
  int out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0)
    return Status(errc::io_error, std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    return Status(errc::io_error, std::string("pipe: ") + std::strerror(errno));
  }
  auto passed = copy_passed(spec.fds, 3 + static_cast<int>(spec.fds.size()));
  if (!passed) {
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1]})
      ::close(fd);
    return passed.status();
  }
  pid_t pid = 0;
  int rc = spawn_child(spec, im.options.log_dir, in_pipe[0], out_pipe[1], *passed, argv.data(),
                       envp.data(), pid);
  for (int fd : *passed)
    ::close(fd);
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  if (rc != 0) {
    ::close(in_pipe[1]);
    ::close(out_pipe[0]);
    return Status(errc::io_error,
                  "cannot start '" + spec.executable + "': " + std::strerror(rc));
  }
  auto c = std::make_unique<Child>();
  c->id = spec.id;
  c->pid = pid;
  c->pidfd = pidfd_open(pid);
  c->out_fd = out_pipe[0];
  c->memory_limit = spec.memory_limit_bytes;
  if (c->pidfd < 0) {
    int err = errno;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    ::close(in_pipe[1]);
    ::close(out_pipe[0]);
    return Status(errc::io_error, std::string("pidfd_open: ") + std::strerror(err));
  }
  ::fcntl(c->out_fd, F_SETFL, ::fcntl(c->out_fd, F_GETFL) | O_NONBLOCK);
  im.open_log(*c);
  if (spec.memory_limit_bytes > 0) {
    if (auto limited = im.limit_memory(*c, spec); !limited) {
      ::close(in_pipe[1]);
      return limited;
    }
  }
  if (!spec.stdin_data.empty()) {
    // Small (a secret): fits the pipe's buffer, never blocks.
    (void)!::write(in_pipe[1], spec.stdin_data.data(), spec.stdin_data.size());
  }
  ::close(in_pipe[1]);
  c->doorbell = doorbell.release();
  im.watch(std::move(c));
  return pid;
}

bool ProcessSupervisor::signal(const std::string& id, int sig) {
  auto& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mutex);
  auto it = im.children.find(id);
  if (it == im.children.end())
    return false;
  return pidfd_send_signal(it->second->pidfd, sig) == 0;
}

std::string ProcessSupervisor::log_path(const std::string& id) const {
  return impl_->options.log_dir.empty() ? std::string() : path_in(impl_->options.log_dir, id);
}

size_t ProcessSupervisor::running() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->children.size();
}

std::string ProcessSupervisor::memory_enforcement() const {
  return impl_->cgroup_root.empty() ? "RLIMIT_AS" : "cgroup v2 memory.max (" + impl_->cgroup_root + ")";
}

}  // namespace troupe::node
