// The C ABI over moed::client::Client: exceptions become return codes and a
// message kept in the handle.
#include <cstring>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/moed_client.h"

struct moed_client {
  std::unique_ptr<moed::client::Client> client;
  std::string error;
  int status = 0;
};

namespace {

template <class F>
int guarded(moed_client* c, F&& f) {
  try {
    c->error.clear();
    c->status = 0;
    return f();
  } catch (const moed::client::Error& e) {
    c->error = e.what();
    c->status = e.status() ? int(*e.status()) : 0;
  } catch (const std::exception& e) {
    c->error = e.what();
  }
  return -1;
}

}  // namespace

extern "C" {

moed_client* moed_client_open(const char* const* addresses, size_t count, const moed_client_options* options,
                              char* error, size_t error_size, int* status) {
  if (status) *status = 0;
  try {
    moed::client::Options o;
    if (options) {
      if (options->slots) o.slots = options->slots;
      if (options->max_rows) o.max_rows = options->max_rows;
      o.timeout_ms = options->timeout_ms;
      if (options->reconnect_ms >= 0) o.reconnect_ms = options->reconnect_ms;
      if (options->key_file) o.key_file = options->key_file;
      if (options->spread != MOED_SPREAD_ROUND_ROBIN && options->spread != MOED_SPREAD_LEAST_LOADED)
        throw moed::client::Error("moed client: unknown spread " + std::to_string(options->spread));
      o.spread = moed::client::Spread(options->spread);
    }
    if (!addresses || count == 0) throw moed::client::Error("moed client: no address to connect to");
    std::vector<std::string> list;
    for (size_t i = 0; i < count; ++i) list.emplace_back(addresses[i] ? addresses[i] : "");
    auto c = std::make_unique<moed_client>();
    c->client = std::make_unique<moed::client::Client>(list, o);
    return c.release();
  } catch (const std::exception& e) {
    if (error && error_size) {
      std::strncpy(error, e.what(), error_size - 1);
      error[error_size - 1] = '\0';
    }
    const auto* refused = dynamic_cast<const moed::client::Error*>(&e);
    if (status && refused && refused->status()) *status = int(*refused->status());
    return nullptr;
  }
}

moed_client* moed_client_connect(const char* socket_path, uint32_t slots, uint32_t max_rows, int32_t timeout_ms,
                                 char* error, size_t error_size) {
  const moed_client_options o{slots, max_rows, timeout_ms, -1, nullptr, MOED_SPREAD_ROUND_ROBIN};
  const char* address = socket_path ? socket_path : "";
  return moed_client_open(&address, 1, &o, error, error_size, nullptr);
}

void moed_client_close(moed_client* c) { delete c; }

void moed_client_get_info(const moed_client* c, moed_client_info* out) {
  const auto& k = *c->client;
  *out = {k.rank(), k.ranks(), k.hidden(), k.layers(), k.slots(), k.max_rows()};
}

int moed_client_acquire(moed_client* c) {
  return guarded(c, [&] { return c->client->acquire(); });
}

void* moed_client_rows(moed_client* c, int slot) {
  void* p = nullptr;
  guarded(c, [&] { return p = c->client->rows(slot), 0; });
  return p;
}

uint64_t* moed_client_request_ids(moed_client* c, int slot) {
  uint64_t* p = nullptr;
  guarded(c, [&] { return p = c->client->request_ids(slot), 0; });
  return p;
}

uint32_t* moed_client_positions(moed_client* c, int slot) {
  uint32_t* p = nullptr;
  guarded(c, [&] { return p = c->client->positions(slot), 0; });
  return p;
}

int moed_client_submit(moed_client* c, int slot, int layer, uint32_t rows, int dtype) {
  return guarded(c, [&] {
    if (dtype != MOED_DTYPE_F32 && dtype != MOED_DTYPE_BF16)
      throw moed::client::Error("moed client: unknown dtype " + std::to_string(dtype));
    c->client->submit(slot, layer, rows, moed::wire::DType(dtype));
    return 0;
  });
}

int moed_client_wait(moed_client* c, int slot, int32_t timeout_ms) {
  return guarded(c, [&] { return c->client->wait(slot, timeout_ms), 0; });
}

int moed_client_release(moed_client* c, int slot) {
  return guarded(c, [&] { return c->client->release(slot), 0; });
}

int moed_client_set_reconnect(moed_client* c, int32_t reconnect_ms) {
  return guarded(c, [&] { return c->client->set_reconnect_ms(reconnect_ms), 0; });
}

int moed_client_set_home_silence(moed_client* c, int32_t home_silence_ms) {
  return guarded(c, [&] { return c->client->set_home_silence_ms(home_silence_ms), 0; });
}

uint64_t moed_client_reconnects(const moed_client* c) { return c->client->reconnects(); }

const char* moed_client_error(const moed_client* c) { return c->error.c_str(); }

int moed_client_status(const moed_client* c) { return c->status; }

}  // extern "C"
