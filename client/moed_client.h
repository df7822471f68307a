/* libmoed_client's C ABI: the same calls as client.h, for C and for
 * ctypes (client/python/moed_client.py). Functions that can fail return a
 * negative value (or NULL) and leave a message in moed_client_error();
 * moed_client_status() then says what the daemon answered (0: the failure
 * was on this side). See client.h for what a layer computes. */
#ifndef MOED_CLIENT_H
#define MOED_CLIENT_H

/* A C header: C's headers and typedefs, whatever C++'s linters prefer. */
/* NOLINTBEGIN(modernize-deprecated-headers,modernize-use-using) */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOED_CLIENT_API __attribute__((visibility("default")))

typedef struct moed_client moed_client;

enum { MOED_DTYPE_F32 = 0, MOED_DTYPE_BF16 = 1 };

/* The daemon's statuses (moed::wire::Status). */
enum {
  MOED_BAD_REQUEST = 1,
  MOED_BUSY = 2,
  MOED_NOT_FINITE = 3,
  MOED_TOO_MANY_CLIENTS = 4,
  MOED_FORBIDDEN = 5,
  MOED_SHUTTING_DOWN = 6,
  MOED_INTERNAL = 7
};

typedef struct {
  int32_t rank, ranks, hidden, layers, slots, max_rows;
} moed_client_info;

enum { MOED_SPREAD_ROUND_ROBIN = 0, MOED_SPREAD_LEAST_LOADED = 1 };

typedef struct {
  uint32_t slots, max_rows; /* what to ask for (0: 4 and 1024; the daemon may grant fewer) */
  int32_t timeout_ms;       /* for connecting and for each wait; < 0: none */
  int32_t reconnect_ms;     /* < 0: the default, 60000; 0: a lost connection fails at once */
  const char* key_file;     /* the cluster's key, for ucx:// addresses; NULL: none */
  int32_t spread;           /* several homes: MOED_SPREAD_ROUND_ROBIN or _LEAST_LOADED */
} moed_client_options;

/* Connects to one front door ("ucx://HOST:PORT", "unix:///PATH" or a socket
 * path), or to `count` ucx:// homes. options may be NULL (the defaults). On
 * failure returns NULL, writes the message into error[error_size] and, where
 * status is not NULL, what the daemon answered into *status (MOED_FORBIDDEN
 * for a key it refused; 0: the failure was on this side). */
MOED_CLIENT_API moed_client* moed_client_open(const char* const* addresses, size_t count,
                                              const moed_client_options* options, char* error, size_t error_size,
                                              int* status);
/* moed_client_open of one address: slots, max_rows: what to ask for (0: 4
 * and 1024); timeout_ms < 0: none. */
MOED_CLIENT_API moed_client* moed_client_connect(const char* socket_path, uint32_t slots, uint32_t max_rows, int32_t timeout_ms,
                                 char* error, size_t error_size);
MOED_CLIENT_API void moed_client_close(moed_client* c);
MOED_CLIENT_API void moed_client_get_info(const moed_client* c, moed_client_info* out);

MOED_CLIENT_API int moed_client_acquire(moed_client* c); /* a free slot, or -1 */
MOED_CLIENT_API void* moed_client_rows(moed_client* c, int slot);
MOED_CLIENT_API uint64_t* moed_client_request_ids(moed_client* c, int slot);
MOED_CLIENT_API uint32_t* moed_client_positions(moed_client* c, int slot);
MOED_CLIENT_API int moed_client_submit(moed_client* c, int slot, int layer, uint32_t rows, int dtype);
MOED_CLIENT_API int moed_client_wait(moed_client* c, int slot, int32_t timeout_ms); /* timeout_ms < 0: the connect timeout */
MOED_CLIENT_API int moed_client_release(moed_client* c, int slot);

/* A lost connection (the daemon restarted on the same socket) is mended
 * within reconnect_ms: the client connects again and submits again what
 * was in flight, so moed_client_wait returns late but right. 60000 from
 * connect; 0: a lost connection fails at once. Pointers from _rows,
 * _request_ids and _positions are valid until the next _submit or _wait:
 * fetch them again. */
MOED_CLIENT_API int moed_client_set_reconnect(moed_client* c, int32_t reconnect_ms);
MOED_CLIENT_API uint64_t moed_client_reconnects(const moed_client* c); /* connections mended so far */
/* Several homes: a home that holds this client's rows and has sent nothing
 * for home_silence_ms is pinged, and one that answers nothing for as long
 * again is failed over (its host or link may be gone without any
 * connection breaking). 3000 from connect; 0 (or < 0): only a broken
 * connection fails a home over. */
MOED_CLIENT_API int moed_client_set_home_silence(moed_client* c, int32_t home_silence_ms);

MOED_CLIENT_API const char* moed_client_error(const moed_client* c);
MOED_CLIENT_API int moed_client_status(const moed_client* c);

#ifdef __cplusplus
}
#endif
/* NOLINTEND(modernize-deprecated-headers,modernize-use-using) */

#endif
