// A small HTTP/1.1 server (cpp-httplib) for rank 0's endpoint: GET routes
// from a table, each answered from a snapshot the daemon publishes. It runs
// on threads of its own and never touches the step loop: a route's answer
// must be quick and thread-safe (read a copy under a mutex).
//
// The table is the extension point: /metrics, the dashboard page at / and
// its JSON endpoints are rows.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/listen_address.h"

namespace moed::runtime::http {

struct Answer {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// The query string's parameters (a name may come twice: the route decides).
using Query = std::multimap<std::string, std::string>;

struct Route {
  std::string path;  // exact match
  std::string doc;   // one line, listed by the 404 answer
  std::function<Answer(const Query&)> answer;
};

class Server {
 public:
  // Binds `address` and starts serving. Throws a Usage error naming `key`
  // when the address cannot be bound (in use by another process, or not an
  // address of this host). A port bound by another process is never shared
  // (no SO_REUSEPORT).
  Server(const ListenAddress& address, const std::string& key, std::vector<Route> routes);
  // Stops accepting, finishes the answers in flight, joins the threads.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The address bound (with the port chosen when the config said 0).
  const ListenAddress& address() const;
  // "http://127.0.0.1:9464/metrics"
  std::string url(const std::string& path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moed::runtime::http
