#include "runtime/admin/admin_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstdio>
#include <exception>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

namespace moed::runtime::admin {
namespace {

using Clock = std::chrono::steady_clock;

std::string seconds_text(AdminClient::Millis timeout) {
  const double s = static_cast<double>(timeout.count()) / 1000.0;
  std::string out = std::to_string(s);
  out.erase(out.find_last_not_of('0') + 1);
  if (out.back() == '.') out.pop_back();
  return out + " s";
}

bool is_connection_refusal(const std::string& code) {
  return code == code::kForbidden || code == code::kTooManyClients;
}

}  // namespace

AdminClient AdminClient::connect(const std::string& path, Millis timeout) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    throw ConnectError("cannot connect to " + path + ": the path is too long for a Unix socket");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);

  const auto deadline = Clock::now() + timeout;
  for (;;) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) throw ConnectError(std::string("socket(): ") + std::strerror(errno));
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0)
      return AdminClient(std::move(fd), path);
    const int err = errno;
    // A Unix socket's non-blocking connect fails with EAGAIN while the
    // listener's backlog is full: retry until the deadline.
    if (err == EAGAIN || err == EINTR) {
      if (Clock::now() >= deadline)
        throw ConnectError("cannot connect to " + path + ": the daemon accepts no connection (" +
                           seconds_text(timeout) + ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    std::string hint;
    if (err == ENOENT) hint = " (is moed running? set --socket, --dir or $MOED_RUN_DIR)";
    if (err == ECONNREFUSED) hint = " (no daemon listens there: a stale socket?)";
    throw ConnectError("cannot connect to " + path + ": " + std::strerror(err) + hint);
  }
}

bool AdminClient::wait(short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_.get(), events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), INT32_MAX)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) throw ConnectError(std::string("poll(): ") + std::strerror(errno));
  }
}

void AdminClient::send_line(std::string_view line, Millis timeout) {
  const std::string data = std::string(line) + "\n";
  const auto deadline = Clock::now() + timeout;
  std::size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd_.get(), data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait(POLLOUT, deadline))
        throw ConnectError("cannot send to " + path_ + ": no progress within " + seconds_text(timeout));
      continue;
    }
    const int err = errno;
    if (err == EPIPE || err == ECONNRESET) throw ConnectionLost("cannot send to " + path_ + ": " + std::strerror(err));
    throw ConnectError("cannot send to " + path_ + ": " + std::strerror(err));
  }
}

std::string AdminClient::read_line(Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (const auto newline = buffer_.find('\n', scan_); newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      scan_ = 0;
      return line;
    }
    scan_ = buffer_.size();
    if (buffer_.size() > kMaxAnswerLine)
      throw ConnectError("the answer from " + path_ + " is longer than " +
                         std::to_string(kMaxAnswerLine) + " bytes");
    char chunk[64 * 1024];
    const ssize_t n = ::recv(fd_.get(), chunk, sizeof chunk, 0);
    if (n > 0) {
      buffer_.append(chunk, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) throw ConnectionLost("the daemon at " + path_ + " closed the connection without an answer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait(POLLIN, deadline))
        throw ConnectError("no answer from " + path_ + " within " + seconds_text(timeout));
      continue;
    }
    const int err = errno;
    if (err == ECONNRESET) throw ConnectionLost("cannot read from " + path_ + ": " + std::strerror(err));
    throw ConnectError("cannot read from " + path_ + ": " + std::strerror(err));
  }
}

json AdminClient::call(const json& request, Millis timeout, std::string* raw) {
  const json id = request.is_object() && request.contains("id") ? request["id"] : json();
  // A refusal at accept time comes before any request; the send may then fail
  // while the refusal waits to be read, so read before giving up.
  std::exception_ptr send_failure;
  try {
    send_line(request.dump(), timeout);
  } catch (const ConnectError&) {
    send_failure = std::current_exception();
  }
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    std::string line;
    try {
      line = read_line(std::max(left, Millis(0)));
    } catch (const ConnectError&) {
      if (send_failure) std::rethrow_exception(send_failure);
      throw;
    }
    json answer = json::parse(line, nullptr, false);
    if (!answer.is_object())
      throw ConnectError("the daemon at " + path_ + " sent an answer that is not a JSON object");
    const json answer_id = answer.value("id", json());
    if (!answer_id.is_null() && answer_id != id) continue;  // not ours
    if (raw) *raw = std::move(line);
    return answer;
  }
}

namespace {

bool answer_ok_flag(const json& answer) { return answer.value("ok", false) == true; }

class Run {
 public:
  Run(const Invocation& inv, std::ostream& out, std::ostream& err, const RunOptions& options)
      : inv_(inv), out_(out), err_(err), options_(options),
        timeout_(std::chrono::milliseconds(
            static_cast<std::int64_t>(std::ceil(std::max(inv.timeout_s, 0.001) * 1000)))) {}

  int operator()() {
    try {
      AdminClient client = connect();
      std::string line;
      const json answer = call(client, inv_.request, line);
      if (inv_.as_json) out_ << line << "\n" << std::flush;
      if (!answer_ok_flag(answer)) return report_error(answer);
      if (!inv_.as_json) out_ << format_answer(inv_.command, answer) << std::flush;
      if (!inv_.follow) return kExitOk;
      if (inv_.command == "trace_follow") return follow_trace(client, inv_.request.at("request_id"));
      const auto id = migration_id_of(answer);
      if (!id) return kExitOk;  // nothing to migrate (a reoptimize with no moves)
      return follow(client, *id);
    } catch (const ConnectError& e) {
      err_ << "moectl: cannot connect: " << e.what() << "\n";
      return kExitConnect;
    } catch (const std::exception& e) {
      err_ << "moectl: internal: " << e.what() << "\n";
      return kExitError;
    }
  }

 private:
  // Rank 0's socket, or, when it does not answer and moectl chose it by
  // default, the lowest rank's in the run dir that does: after a lost rank
  // 0 under elastic serving the lowest survivor coordinates (docs/elastic.md).
  AdminClient connect() {
    try {
      return AdminClient::connect(inv_.socket, timeout_);
    } catch (const ConnectError&) {
      if (inv_.coordinator_dir.empty()) throw;
      std::map<int, std::string> others;
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(inv_.coordinator_dir, ec)) {
        const std::string name = entry.path().filename().string();
        int rank = 0;
        if (std::sscanf(name.c_str(), "moed-%d.sock", &rank) == 1 && rank > 0 &&
            name == "moed-" + std::to_string(rank) + ".sock")
          others.emplace(rank, entry.path().string());
      }
      for (const auto& [rank, path] : others) {
        try {
          AdminClient client = AdminClient::connect(path, timeout_);
          err_ << "moectl: rank 0's socket does not answer; using rank " << rank
               << "'s, the lowest that does (elastic serving: it coordinates after a loss)\n";
          return client;
        } catch (const ConnectError&) {
        }
      }
      throw;
    }
  }
  json call(AdminClient& client, json request, std::string& line) {
    request["id"] = next_id_++;
    return client.call(request, timeout_, &line);
  }

  static std::string error_code(const json& answer) {
    const json& error = answer.contains("error") ? answer["error"] : json();
    return error.is_object() ? error.value("code", std::string()) : "";
  }

  int report_error(const json& answer) {
    if (!inv_.as_json) err_ << format_error(answer) << "\n";
    return is_connection_refusal(error_code(answer)) ? kExitConnect : kExitError;
  }

  // Polls `migration` until the migration is committed or aborted.
  int follow(AdminClient& client, std::int64_t id) {
    std::string last;
    std::string state = "prepare";  // the last state seen
    for (;;) {
      std::string line;
      json answer;
      try {
        answer = call(client, json{{"cmd", "migration"}, {"migration_id", id}}, line);
      } catch (const ConnectionLost& e) {  // not a timeout: the daemon went away
        end_bar();
        return daemon_gone(id, state, e.what());
      }
      if (!answer_ok_flag(answer)) {
        if (inv_.as_json) out_ << line << "\n" << std::flush;
        end_bar();
        return report_error(answer);
      }
      const json m = answer.contains("migration") ? answer["migration"] : json();
      if (!m.is_object()) {
        end_bar();
        err_ << "moectl: internal: the daemon has no record of migration " << id << "\n";
        return kExitError;
      }
      show(m, line, last);
      state = m.value("state", state);
      if (migration_finished(m)) {
        end_bar();
        if (!migration_aborted(m)) return kExitOk;
        const std::string why = m.value("error", std::string());
        err_ << "moectl: aborted: migration " << id << " aborted before its commit"
             << (why.empty() ? "" : ": " + why) << "; the old placement is still served\n";
        return kExitError;
      }
      std::this_thread::sleep_for(options_.poll_interval);
    }
  }

  // Polls `trace` until a token of the request is traced through every layer,
  // for at most --timeout seconds; then shows what there is.
  int follow_trace(AdminClient& client, const json& request_id) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      std::string line;
      const json answer = call(client, json{{"cmd", "trace"}, {"request_id", request_id}}, line);
      const bool found = answer_ok_flag(answer);
      if (!found && error_code(answer) == code::kAlreadyServed) {  // too late: it will not come
        if (inv_.as_json) out_ << line << "\n" << std::flush;
        return report_error(answer);
      }
      bool complete = false;
      if (found)
        for (const json& t : answer.value("tokens", json::array())) complete = complete || t.value("complete", false);
      const bool late = std::chrono::steady_clock::now() >= deadline;
      if (complete || (found && late)) {
        if (inv_.as_json) out_ << line << "\n" << std::flush;
        else out_ << format_answer("trace", answer) << std::flush;
        if (!complete) err_ << "moectl: request " << request_id.dump() << " is not yet traced through every layer\n";
        return kExitOk;
      }
      if (late) {
        if (inv_.as_json) out_ << line << "\n" << std::flush;
        err_ << "moectl: not_found: request " << request_id.dump() << " was not served within " << inv_.timeout_s
             << " s; it stays followed: `moectl trace " << request_id.dump() << "` once it is\n";
        return kExitError;
      }
      std::this_thread::sleep_for(options_.poll_interval);
    }
  }

  // The daemon closed the connection while the migration ran (a shutdown, a
  // drain, a failed rank). Ranks switch placement only at commit, and a stopping
  // daemon aborts a migration before its commit, so the last state seen
  // says which placement survives.
  int daemon_gone(std::int64_t id, const std::string& state, const std::string& detail) {
    if (state == "commit" || state == "release" || state == "committed") {
      err_ << "moectl: migration " << id << " committed (state " << state
           << ") before the daemon stopped; the new placement is the committed one (" << detail << ")\n";
      return kExitOk;
    }
    err_ << "moectl: aborted: migration " << id << " was in " << state
         << " when the daemon stopped (a shutdown, a drain or a failed rank) and ends without its commit; "
            "the old placement is the committed one ("
         << detail << ")\n";
    return kExitError;
  }

  // One progress report, when something changed since the last.
  void show(const json& m, const std::string& line, std::string& last) {
    if (inv_.as_json) {
      const std::string shown = m.dump();
      if (shown != last) out_ << line << "\n" << std::flush;
      last = shown;
      return;
    }
    if (options_.tty) {
      // Redraw in place; \x1b[K clears what a longer previous bar left.
      out_ << "\r" << progress_bar(m, options_.bar_width) << "\x1b[K" << std::flush;
      bar_drawn_ = true;
      return;
    }
    const std::string text = progress_line(m);
    if (text != last) out_ << text << "\n" << std::flush;
    last = text;
  }

  void end_bar() {
    if (bar_drawn_) out_ << "\n" << std::flush;
    bar_drawn_ = false;
  }

  const Invocation& inv_;
  std::ostream& out_;
  std::ostream& err_;
  RunOptions options_;
  AdminClient::Millis timeout_;
  std::int64_t next_id_ = 1;
  bool bar_drawn_ = false;
};

}  // namespace

int run_moectl(const Invocation& invocation, std::ostream& out, std::ostream& err,
               const RunOptions& options) {
  return Run(invocation, out, err, options)();
}

}  // namespace moed::runtime::admin
