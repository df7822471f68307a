// A small HTTP/1.1 server for rank 0's endpoint: GET (and HEAD) routes from
// a table, each answered from a snapshot the daemon publishes. It runs on
// threads of its own and never touches the step loop: a route's answer must
// be quick and thread-safe (read a copy under a mutex).
//
// One thread does all the socket work, never blocking on a client: it
// accepts, reads each request as its bytes come, and writes each answer as
// the client takes it, under a deadline per request. Only complete requests
// go to the worker threads that compute the answers. A client that trickles
// its request a byte at a time, or never reads its answer, thus holds its
// own connection and nothing else, until its deadline closes it; each peer
// address holds a bounded number of connections. Prometheus can always
// scrape.
//
// The table is the extension point: /metrics, the dashboard page at / and
// its JSON endpoints are rows.
#pragma once

#include <cstddef>
#include <cstdint>
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

// What a client may hold. The defaults serve a browser (up to 6 kept-alive
// connections per host) and a scraper from one address at once.
struct Limits {
  // A request's header and body must have come within this many ms of the
  // moment the connection waits for it (its accept, or the end of the
  // previous answer on a kept-alive connection); past it the connection is
  // closed (with a 408 when part of a request had come).
  int request_ms = 5'000;
  // An answer must have been taken by the client within this many ms.
  int answer_ms = 10'000;
  // Connections from one peer address. A newcomer past it closes that
  // peer's connection that has waited longest for its request (a scraper is
  // never locked out by slow connections of its own host); when all of them
  // are being answered, the newcomer is closed.
  std::size_t per_peer = 16;
  // Connections in all, the same way.
  std::size_t connections = 256;
  // Threads computing answers.
  int workers = 2;
  std::size_t max_header_bytes = 16 * 1024;  // past it: 431
  std::size_t max_body_bytes = 64 * 1024;    // a GET needs none; past it: 413
  int max_requests_per_connection = 100;     // then the connection closes after its answer
};

// What the server has done, for tests and logs.
struct ServerCounts {
  std::size_t open = 0;       // connections now
  std::size_t reading = 0;    // of which waiting for (the rest of) a request
  std::uint64_t accepted = 0, answered = 0;
  std::uint64_t timed_out = 0;  // closed at their deadline (request or answer)
  std::uint64_t evicted = 0;    // closed to let a newcomer in (per peer or in all)
  std::uint64_t refused = 0;    // newcomers closed: every connection of theirs was being answered
};

class Server {
 public:
  // Binds `address` and starts serving. Throws a Usage error naming `key`
  // when the address cannot be bound (in use by another process, or not an
  // address of this host). A port bound by another process is never shared
  // (no SO_REUSEPORT).
  Server(const ListenAddress& address, const std::string& key, std::vector<Route> routes, Limits limits = {});
  // Stops accepting, lets the workers finish the answer each computes,
  // closes every connection, joins the threads.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The address bound (with the port chosen when the config said 0).
  const ListenAddress& address() const;
  // "http://127.0.0.1:9464/metrics"
  std::string url(const std::string& path) const;
  ServerCounts counts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moed::runtime::http
