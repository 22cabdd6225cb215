#include "tests/support/process.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace troupe::testing {

namespace fs = std::filesystem;

std::string bin_dir() {
  return TROUPE_BIN_DIR;
}
std::string bin(const std::string& name) {
  return bin_dir() + "/" + name;
}

namespace {

pid_t spawn(const std::vector<std::string>& argv, const std::string& out_path,
            const std::string& err_path) {
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0)
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent)
      ::_exit(127);
    int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    int err =
        err_path == out_path ? out : ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out < 0 || err < 0)
      ::_exit(126);
    ::dup2(out, 1);
    ::dup2(err, 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0)
      ::dup2(devnull, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int decode(int status) {
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> argv, std::string output_path)
    : argv_(std::move(argv)), output_path_(std::move(output_path)) {
  pid_ = spawn(argv_, output_path_, output_path_);
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(pid_, SIGCONT);  // a stopped process must be able to die
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_),
      exit_code_(other.exit_code_),
      argv_(std::move(other.argv_)),
      output_path_(std::move(other.output_path_)) {
  other.pid_ = -1;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    this->~ChildProcess();
    pid_ = other.pid_;
    exit_code_ = other.exit_code_;
    argv_ = std::move(other.argv_);
    output_path_ = std::move(other.output_path_);
    other.pid_ = -1;
  }
  return *this;
}

void ChildProcess::reap(int status) {
  exit_code_ = decode(status);
}

bool ChildProcess::running() {
  if (pid_ <= 0 || exit_code_)
    return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reap(status);
    return false;
  }
  return true;
}

void ChildProcess::signal(int sig) {
  if (running())
    ::kill(pid_, sig);
}

std::optional<int> ChildProcess::wait_exit(std::chrono::milliseconds timeout) {
  wait_until([&] { return !running(); }, timeout, 10ms);
  return exit_code_;
}

std::string ChildProcess::output() const {
  return slurp(output_path_);
}

RunResult run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  TempDir dir;
  auto out_path = dir / "out";
  auto err_path = dir / "err";
  pid_t pid = spawn(argv, out_path, err_path);
  RunResult result;
  int status = 0;
  bool done = wait_until([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, timeout, 5ms);
  if (!done) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    result.exit_code = -1;
  } else {
    result.exit_code = decode(status);
  }
  result.out = slurp(out_path);
  result.err = slurp(err_path);
  return result;
}

bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds deadline,
                std::chrono::milliseconds poll_interval) {
  auto until = std::chrono::steady_clock::now() + deadline;
  while (true) {
    if (condition())
      return true;
    if (std::chrono::steady_clock::now() >= until)
      return false;
    std::this_thread::sleep_for(poll_interval);  // poll interval of a deadline wait
  }
}

uint16_t free_port() {
  // Below Linux's ephemeral range (32768+), so that no outgoing connection of
  // another process takes the port between this check and its use.
  static std::minstd_rand rng(static_cast<unsigned>(::getpid()) * 7919u +
                              static_cast<unsigned>(std::time(nullptr)));
  std::uniform_int_distribution<int> pick(20000, 32000);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(pick(rng)));
    int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::close(fd);
    if (rc == 0)
      return ntohs(addr.sin_port);
  }
  throw std::runtime_error("no free loopback port in 20000-32000");
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/troupe-test-XXXXXX";
  char* made = ::mkdtemp(tmpl);
  if (!made)
    throw std::runtime_error("mkdtemp failed");
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

}  // namespace troupe::testing
