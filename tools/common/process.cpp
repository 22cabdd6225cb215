#include "tools/common/process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace troupe::proc {

namespace fs = std::filesystem;

namespace {

// Every child that may still run, for kill_all_children(). A fixed array of
// atomics: a signal handler may read it safely.
constexpr size_t kMaxChildren = 1024;
std::array<std::atomic<pid_t>, kMaxChildren> g_children{};

void register_child(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = 0;
    if (slot.compare_exchange_strong(expected, pid))
      return;
  }
}

void unregister_child(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0))
      return;
  }
}

// Forks and execs; only async-signal-safe calls between fork and exec (the
// caller may have threads).
pid_t spawn(const std::vector<std::string>& argv, const std::string& out_path,
            const std::string& err_path, const ChildOptions& options = {}) {
  const char* cwd = options.working_dir.empty() ? nullptr : options.working_dir.c_str();
  bool cores = options.core_dumps;
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const char* out_c = out_path.c_str();
  const char* err_c = err_path.c_str();
  bool same = out_path == err_path;
  pid_t parent = ::getpid();
  // Until its exec the child is a copy of the driver with the driver's
  // signal handlers (a test framework's SIGTERM handler would report a
  // crash from it): signals stay blocked across the fork, and the child
  // unblocks them only once every handler is back to the default, so a
  // signal sent meanwhile waits and then acts as it does on the program.
  sigset_t all, before;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &before);
  pid_t pid = ::fork();
  if (pid != 0)
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (pid < 0)
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // The driver's handlers go (as exec would drop them); what it ignores
    // stays ignored (as across exec), but SIGINT and SIGTERM act.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction now {};
      if (::sigaction(sig, nullptr, &now) != 0)
        continue;  // not a signal number
      bool caught = (now.sa_flags & SA_SIGINFO) ? now.sa_sigaction != nullptr
                                                : now.sa_handler != SIG_DFL && now.sa_handler != SIG_IGN;
      if (caught || sig == SIGINT || sig == SIGTERM)
        ::sigaction(sig, &dfl, nullptr);
    }
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent)
      ::_exit(127);
    int out = ::open(out_c, O_WRONLY | O_CREAT | O_APPEND, 0644);
    int err = same ? out : ::open(err_c, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out < 0 || err < 0)
      ::_exit(126);
    ::dup2(out, 1);
    ::dup2(err, 2);
    if (cwd && ::chdir(cwd) != 0)
      ::_exit(125);
    if (cores) {
      struct rlimit unlimited {
        RLIM_INFINITY, RLIM_INFINITY
      };
      ::setrlimit(RLIMIT_CORE, &unlimited);
    }
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0)
      ::dup2(devnull, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  register_child(pid);
  return pid;
}

int decode(int status) {
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

void kill_all_children() {
  for (auto& slot : g_children) {
    pid_t pid = slot.load();
    if (pid > 0) {
      ::kill(pid, SIGCONT);
      ::kill(pid, SIGKILL);
    }
  }
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Child::Child(std::vector<std::string> argv, std::string output_path, ChildOptions options)
    : options_(std::move(options)), argv_(std::move(argv)), output_path_(std::move(output_path)) {
  pid_ = spawn(argv_, output_path_, output_path_, options_);
}

void Child::reaped(int status) {
  exit_code_ = decode(status);
  core_dumped_ = WIFSIGNALED(status) && WCOREDUMP(status);
  unregister_child(pid_);
}

std::optional<int> Child::stop(std::chrono::milliseconds grace) {
  if (running() && !terminated_) {
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGTERM);
    terminated_ = true;
  }
  auto until = Clock::now() + grace;
  while (running() && Clock::now() < until)
    std::this_thread::sleep_for(10ms);  // poll interval of a deadline wait
  if (running()) {
    kill_now();
    return std::nullopt;
  }
  return exit_code_;
}

std::string Child::describe_exit() const {
  if (!exit_code_)
    return "running";
  int code = *exit_code_;
  if (code > 128) {
    const char* abbrev = ::sigabbrev_np(code - 128);
    std::string name = abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(code - 128);
    return "killed by " + name + (core_dumped_ ? " (core dumped)" : "");
  }
  return "exited with status " + std::to_string(code);
}

std::string tail_lines(const std::string& text, size_t lines) {
  size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n')
    --pos;
  while (lines > 0 && pos > 0) {
    auto nl = text.rfind('\n', pos - 1);
    if (nl == std::string::npos) {
      pos = 0;
      break;
    }
    pos = nl;
    --lines;
  }
  return text.substr(pos == 0 ? 0 : pos + 1);
}

std::string backtrace_of(const std::string& binary, const std::string& core) {
  if (!fs::exists(core))
    return "(no core file at " + core + ")";
  auto r = run({"/usr/bin/gdb", "-batch", "-nx", "-ex", "thread apply all bt 30", binary, core},
               120s);
  if (r.exit_code != 0 && r.out.empty())
    return "(gdb failed: exit " + std::to_string(r.exit_code) + " " + r.err + ")";
  return r.out;
}

Child::~Child() {
  kill_now();
}

std::string Child::output() const {
  return slurp(output_path_);
}

void Child::kill_now() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(pid_, SIGCONT);  // a stopped process must be able to die
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped(status);
  }
}

Child::Child(Child&& other) noexcept
    : pid_(other.pid_),
      exit_code_(other.exit_code_),
      core_dumped_(other.core_dumped_),
      fate_owned_(other.fate_owned_),
      terminated_(other.terminated_),
      options_(std::move(other.options_)),
      argv_(std::move(other.argv_)),
      output_path_(std::move(other.output_path_)) {
  other.pid_ = -1;
}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    kill_now();
    pid_ = other.pid_;
    exit_code_ = other.exit_code_;
    core_dumped_ = other.core_dumped_;
    fate_owned_ = other.fate_owned_;
    terminated_ = other.terminated_;
    options_ = std::move(other.options_);
    argv_ = std::move(other.argv_);
    output_path_ = std::move(other.output_path_);
    other.pid_ = -1;
  }
  return *this;
}

bool Child::running() {
  if (pid_ <= 0 || exit_code_)
    return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped(status);
    return false;
  }
  return true;
}

void Child::signal(int sig) {
  fate_owned_ = true;
  if (!running())
    return;
  if (sig == SIGTERM || sig == SIGKILL)
    ::kill(pid_, SIGCONT);
  if (sig == SIGTERM)
    terminated_ = true;
  ::kill(pid_, sig);
}

std::optional<int> Child::wait_exit(std::chrono::milliseconds timeout) {
  fate_owned_ = true;
  auto until = Clock::now() + timeout;
  while (running() && Clock::now() < until)
    std::this_thread::sleep_for(10ms);  // poll interval of a deadline wait
  return exit_code_;
}

RunResult run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  const TempDir dir("troupe-run");  // removed with the output on return
  const std::string out_path = dir / "out";
  const std::string err_path = dir / "err";
  auto start = Clock::now();
  pid_t pid = spawn(argv, out_path, err_path);
  RunResult result;
  int status = 0;
  bool done = false;
  auto until = start + timeout;
  while (true) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      done = true;
      break;
    }
    if (Clock::now() >= until)
      break;
    std::this_thread::sleep_for(2ms);  // poll interval of a deadline wait
  }
  if (!done) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    result.exit_code = -1;
  } else {
    result.exit_code = decode(status);
  }
  unregister_child(pid);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.out = slurp(out_path);
  result.err = slurp(err_path);
  return result;
}

bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds deadline,
                std::chrono::milliseconds poll_interval, const std::atomic<bool>* give_up) {
  auto until = Clock::now() + deadline;
  while (true) {
    if (condition())
      return true;
    if (Clock::now() >= until || (give_up && give_up->load()))
      return false;
    std::this_thread::sleep_for(poll_interval);  // poll interval of a deadline wait
  }
}

namespace {

// Ports handed out by any process on this machine lately: a file per port
// in kPortClaims, made with O_EXCL. Test processes run side by side (ctest
// -j) and each checks that a port is free when it picks it, but the node it
// starts binds it later: without a claim two of them can pick the same port
// in that window. A claim older than kClaimLife is stale (the longest test
// runs for 10 minutes) and is taken over.
constexpr const char* kPortClaims = "/tmp/troupe-port-claims";
constexpr auto kClaimLife = std::chrono::minutes(15);

bool claim_port(uint16_t port) {
  std::error_code ec;
  std::filesystem::create_directories(kPortClaims, ec);
  ::chmod(kPortClaims, 01777);  // shared by whoever runs tests here (sticky, like /tmp)
  const std::string path = std::string(kPortClaims) + "/" + std::to_string(port);
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      return true;
    }
    if (errno != EEXIST)
      return true;  // no claims possible here (read-only /tmp): rely on the bind check
    auto written = std::filesystem::last_write_time(path, ec);
    if (ec || std::filesystem::file_time_type::clock::now() - written < kClaimLife)
      return false;
    std::filesystem::remove(path, ec);  // stale: take it over
  }
  return false;
}

}  // namespace

uint16_t free_port(uint32_t seed) {
  static std::mutex mu;
  static std::set<uint16_t> given;
  // Two processes starting together must not try the same ports in turn.
  static std::minstd_rand rng(seed ^ (static_cast<uint32_t>(::getpid()) * 7919u) ^
                              static_cast<uint32_t>(std::time(nullptr)));
  std::lock_guard<std::mutex> lock(mu);
  std::uniform_int_distribution<int> pick(20000, 32000);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    auto port = static_cast<uint16_t>(pick(rng));
    if (given.count(port))
      continue;
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::close(fd);
    if (rc == 0 && claim_port(port)) {
      given.insert(port);
      return port;
    }
  }
  throw std::runtime_error("no free loopback port in 20000-32000");
}

std::vector<pid_t> processes_mentioning(const std::string& needle) {
  std::vector<pid_t> out;
  pid_t self = ::getpid();
  DIR* d = ::opendir("/proc");
  if (!d)
    return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == self)
      continue;
    std::string cmdline = slurp("/proc/" + std::string(e->d_name) + "/cmdline");
    if (cmdline.empty())
      continue;  // gone, or a zombie
    // A zombie still has a cmdline of length 0; a live process has its args.
    std::string stat = slurp("/proc/" + std::string(e->d_name) + "/stat");
    auto paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z')
      continue;
    for (auto& c : cmdline) {
      if (c == '\0')
        c = ' ';
    }
    if (cmdline.find(needle) != std::string::npos)
      out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

}  // namespace troupe::proc
