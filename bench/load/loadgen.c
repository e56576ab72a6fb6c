/*
 * loadgen: the benchmark's compiled load generator, for HTTP/1.1 servers and gRPC ones (HTTP/2, through libnghttp2).
 * bench/load/compiled.py builds and runs it; run it alone with --help.
 *
 * Open loop (--rate): calls are due on a seeded Poisson schedule for --seconds and each is timed from its scheduled
 * send, so a slow server cannot slow the load down (no coordinated omission); past --max-outstanding calls in flight a
 * due call is not sent (the generator's own refusal). Closed loop (--concurrency): that many calls in flight, each
 * answer followed at once by the next call, for --seconds, each call timed from its send. Every call ends by
 * --deadline-ms after its send (gRPC calls carry it as grpc-timeout too). The request files are used in turn: whole
 * requests as sent for HTTP/1.1, serialized messages for gRPC (the 5-byte message prefix is added here).
 *
 * Every answer's body is compared with the bodies seen before for the same request: the first few distinct ones are
 * written to --bodies (r<request>-v<variant>.body) for the caller to check against in-process ONNX Runtime, and each
 * call's line says which one it got, so that every answer is checked. One line per call goes to --out:
 *   request  scheduled_us  sent_us  done_us  status  variant
 * times from the start, status the HTTP status (HTTP/1.1), the grpc-status (gRPC, 0 is OK) or one of the negative
 * outcomes of --help; variant -1 when the call had no body to compare (or more distinct bodies than are kept).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { NOT_SENT = -1, TIMED_OUT = -2, CONNECTION_ERROR = -3, BAD_ANSWER = -4 };
enum { GRPC_CANCELLED = 1, GRPC_RESOURCE_EXHAUSTED = 8, GRPC_INTERNAL = 13, GRPC_UNAVAILABLE = 14 };
enum { CLOSED, CONNECTING, IDLE, SENDING, RECEIVING, READY };
#define MAX_VARIANTS 4 /* distinct bodies kept per request: more means the server answers one input many ways */
#define MAX_REQUESTS (1 << 12)
#define MAX_BODY (256u << 20) /* an answer larger than this is not an answer these servers give */

typedef struct {
  char *data;
  size_t len;
} Bytes;

typedef struct {
  int64_t scheduled, sent, done; /* ns from the start; sent and done -1 until they happen */
  int request, status, variant;
  int connection, stream; /* where it is in flight (gRPC: its stream id) */
} Call;

typedef struct Stream {
  int call; /* -1 once the call ended without it (deadline) */
  size_t offset;
  Bytes in;
  size_t in_cap;
  int http_status, grpc_status;
} Stream;

typedef struct {
  int fd, state, call; /* HTTP/1.1: the call it carries, -1 when idle */
  size_t written;
  char *in;
  size_t in_len, in_cap;
  int64_t idle_since;
  nghttp2_session *h2; /* gRPC */
  int draining;        /* gRPC: the server sent GOAWAY; new calls go to a new connection */
} Connection;

static int grpc_mode;
static Bytes *requests; /* HTTP/1.1: whole requests; gRPC: prefixed messages */
static int request_count;
static Bytes variants[MAX_REQUESTS][MAX_VARIANTS];
static int variant_count[MAX_REQUESTS];
static const char *bodies_dir, *path = "/", *authority;
static char timeout_value[32];
static Call *calls;
static size_t call_count, call_cap;
static int *inflight, inflight_count, max_outstanding;
static Connection *connections;
static int connection_count, pool_size, open_count, next_connection;
static int *active; /* gRPC: the connection of each of the --connections places the calls are spread over */
static int *idle, idle_count;
static int epoll_fd;
static struct sockaddr_in address;
static int64_t start_ns, deadline_ns, idle_reuse_ns;
static uint64_t seed_state;

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec - start_ns;
}

static void die(const char *what) {
  fprintf(stderr, "loadgen: %s: %s\n", what, strerror(errno));
  exit(2);
}

static void *grow(void *data, size_t size) {
  data = realloc(data, size ? size : 1);
  if (!data) die("memory");
  return data;
}

static Bytes read_file(const char *file_path, size_t prefix) {
  FILE *file = fopen(file_path, "rb");
  if (!file) die(file_path);
  Bytes bytes = {grow(NULL, prefix + 65536), prefix};
  size_t cap = prefix + 65536, got;
  while ((got = fread(bytes.data + bytes.len, 1, cap - bytes.len, file)) > 0) {
    bytes.len += got;
    if (bytes.len == cap) bytes.data = grow(bytes.data, cap *= 2);
  }
  fclose(file);
  return bytes;
}

/* splitmix64: a seeded stream of uniform doubles in [0, 1) for the exponential gaps */
static double uniform(void) {
  uint64_t z = (seed_state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0;
}

static size_t new_call(int64_t scheduled) {
  if (call_count == call_cap) calls = grow(calls, (call_cap = call_cap * 2 + 1024) * sizeof *calls);
  calls[call_count] = (Call){scheduled, -1, -1, (int)(call_count % (size_t)request_count), NOT_SENT, -1, -1, -1};
  return call_count++;
}

/* The body's variant for the call's request: an earlier body equal to it, or a new one written to --bodies. */
static int variant_of(int request, const char *body, size_t len) {
  for (int v = 0; v < variant_count[request]; v++)
    if (variants[request][v].len == len && memcmp(variants[request][v].data, body, len) == 0) return v;
  if (variant_count[request] == MAX_VARIANTS) return -1;
  int v = variant_count[request]++;
  variants[request][v] = (Bytes){grow(NULL, len), len};
  memcpy(variants[request][v].data, body, len);
  char file_path[4096];
  snprintf(file_path, sizeof file_path, "%s/r%d-v%d.body", bodies_dir, request, v);
  FILE *file = fopen(file_path, "wb");
  if (!file || fwrite(body, 1, len, file) != len || fclose(file) != 0) die(file_path);
  return v;
}

static void end_call(int index, int status, int variant) {
  Call *call = &calls[index];
  if (call->done >= 0) return;
  call->done = now_ns();
  call->status = status;
  call->variant = variant;
  for (int i = 0; i < inflight_count; i++)
    if (inflight[i] == index) {
      inflight[i] = inflight[--inflight_count];
      break;
    }
}

static void watch(Connection *c, uint32_t events, int op) {
  struct epoll_event event = {.events = events, .data.u32 = (uint32_t)(c - connections)};
  if (epoll_ctl(epoll_fd, op, c->fd, &event) < 0) die("epoll_ctl");
}

static void close_connection(Connection *c) {
  if (c->fd < 0) return;
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  c->fd = -1;
  c->state = CLOSED;
  c->in_len = 0;
  c->draining = 0;
  open_count--;
  if (c->h2) { /* its streams' calls end with it */
    nghttp2_session *session = c->h2;
    c->h2 = NULL;
    for (int i = inflight_count - 1; i >= 0; i--) {
      int index = inflight[i];
      if (calls[index].connection == (int)(c - connections)) end_call(index, CONNECTION_ERROR, -1);
    }
    nghttp2_session_del(session); /* frees the streams through on_stream_close */
  }
  for (int i = 0; i < idle_count; i++) /* an idle connection the server closed */
    if (&connections[idle[i]] == c) {
      idle[i] = idle[--idle_count];
      break;
    }
}

static int open_socket(Connection *c) {
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->fd < 0) die("socket");
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  open_count++;
  c->state = CONNECTING;
  c->in_len = 0;
  watch(c, EPOLLOUT, EPOLL_CTL_ADD);
  if (connect(c->fd, (struct sockaddr *)&address, sizeof address) < 0 && errno != EINPROGRESS) {
    close_connection(c);
    return -1;
  }
  return 0;
}

/* ---- HTTP/1.1: one call per connection at a time, idle keep-alive connections reused ---- */

static void http_fail(Connection *c, int status) {
  if (c->call >= 0) end_call(c->call, status, -1);
  c->call = -1;
  close_connection(c);
}

static void http_send_more(Connection *c) {
  Bytes *request = &requests[calls[c->call].request];
  while (c->written < request->len) {
    ssize_t n = send(c->fd, request->data + c->written, request->len - c->written, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (c->state != SENDING) watch(c, EPOLLOUT, EPOLL_CTL_MOD);
      c->state = SENDING;
      return;
    }
    if (n <= 0) {
      http_fail(c, CONNECTION_ERROR);
      return;
    }
    c->written += (size_t)n;
  }
  if (c->state != RECEIVING) watch(c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
  c->state = RECEIVING;
}

static int http_connection(void) {
  for (int i = 0; i < connection_count; i++)
    if (connections[i].fd < 0) return open_socket(&connections[i]) < 0 ? -1 : i;
  return -2;
}

static void http_dispatch(int index) {
  Call *call = &calls[index];
  /* The idle stack is last in, first out: when its top has been idle too long, so has every one below it. Servers
   * close idle connections, and one reused while its server closes it fails the call. */
  if (idle_count > 0 && call->sent - connections[idle[idle_count - 1]].idle_since > idle_reuse_ns)
    while (idle_count > 0) close_connection(&connections[idle[idle_count - 1]]);
  int slot = idle_count > 0 ? idle[--idle_count] : http_connection();
  if (slot == -2) { /* every connection busy: the generator's own refusal */
    call->sent = -1;
    call->done = 0;
    return;
  }
  inflight[inflight_count++] = index;
  if (slot < 0) { /* connect() failed at once */
    end_call(index, CONNECTION_ERROR, -1);
    return;
  }
  Connection *c = &connections[slot];
  call->connection = slot;
  c->call = index;
  c->written = 0;
  c->in_len = 0;
  if (c->state == IDLE) http_send_more(c); /* else: connecting, sent once connected */
}

static int same_name(const char *line, const char *end, const char *name) {
  size_t n = strlen(name);
  return (size_t)(end - line) > n && strncasecmp(line, name, n) == 0;
}

/* A chunked body from `p`: its length once whole (decoded in place when `decode`), -1 while incomplete, -2 when
 * malformed. Checked whole first, then decoded, so that an incomplete body is left as it came. */
static long dechunk(char *p, char *end, int decode) {
  char *out = p, *at = p;
  for (;;) {
    char *line_end = memmem(at, (size_t)(end - at), "\r\n", 2);
    if (!line_end) return -1;
    char *digits_end;
    long size = strtol(at, &digits_end, 16);
    if (digits_end == at || size < 0) return -2;
    at = line_end + 2;
    if (size == 0) return end - at >= 2 ? out - p : -1; /* no trailers expected */
    if (end - at < size + 2) return -1;
    if (decode) memmove(out, at, (size_t)size);
    out += size;
    at += size + 2;
  }
}

/* A whole answer in c->in: end the call. Returns 0 while more bytes are needed. */
static int http_answer_complete(Connection *c) {
  char *head_end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
  if (!head_end) return 0;
  int status = 0;
  if (sscanf(c->in, "HTTP/1.%*d %d", &status) != 1) {
    http_fail(c, BAD_ANSWER);
    return 1;
  }
  long length = -1;
  int chunked = 0, closing = 0;
  for (char *line = strstr(c->in, "\r\n") + 2; line < head_end; line = strstr(line, "\r\n") + 2) {
    char *end = strstr(line, "\r\n");
    if (same_name(line, end, "content-length:")) length = strtol(line + 15, NULL, 10);
    if (same_name(line, end, "transfer-encoding:") && memmem(line, (size_t)(end - line), "chunked", 7)) chunked = 1;
    if (same_name(line, end, "connection:") && memmem(line, (size_t)(end - line), "close", 5)) closing = 1;
  }
  char *body = head_end + 4, *end = c->in + c->in_len;
  if (chunked) {
    length = dechunk(body, end, 0);
    if (length == -1) return 0;
    if (length < 0) {
      http_fail(c, BAD_ANSWER);
      return 1;
    }
    dechunk(body, end, 1);
  } else if (length < 0) {
    http_fail(c, BAD_ANSWER); /* a body delimited by the connection's end: not what these servers send */
    return 1;
  } else if (end - body < length) {
    return 0;
  }
  end_call(c->call, status, variant_of(calls[c->call].request, body, (size_t)length));
  c->call = -1;
  c->in_len = 0;
  if (closing) {
    close_connection(c);
  } else {
    c->state = IDLE;
    c->idle_since = now_ns();
    idle[idle_count++] = (int)(c - connections);
  }
  return 1;
}

static void http_receive(Connection *c) {
  for (;;) {
    if (c->in_cap - c->in_len < 65536) c->in = grow(c->in, (c->in_cap = c->in_cap * 2 + 65536) + 1);
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0 || c->call < 0 || c->in_len + (size_t)n > MAX_BODY) { /* closed, reset, or bytes nobody asked for */
      http_fail(c, CONNECTION_ERROR);
      return;
    }
    c->in_len += (size_t)n;
    c->in[c->in_len] = '\0';
    if (http_answer_complete(c)) return;
  }
}

static void http_event(Connection *c, uint32_t events) {
  if (c->state == CONNECTING || c->state == SENDING) {
    int error = 0;
    socklen_t size = sizeof error;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &size);
    if (error || (events & (EPOLLERR | EPOLLHUP))) {
      http_fail(c, CONNECTION_ERROR);
      return;
    }
    if (c->state == CONNECTING) c->state = SENDING;
    if (c->call >= 0)
      http_send_more(c);
    else { /* connected with nothing to send: idle */
      watch(c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
      c->state = IDLE;
      c->idle_since = now_ns();
      idle[idle_count++] = (int)(c - connections);
    }
    return;
  }
  http_receive(c);
}

/* ---- gRPC: HTTP/2 connections opened before the load, calls spread over them in turn, one stream each ---- */

static ssize_t h2_send(nghttp2_session *session, const uint8_t *data, size_t length, int flags, void *user) {
  (void)session, (void)flags;
  Connection *c = user;
  ssize_t n = send(c->fd, data, length, MSG_NOSIGNAL);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? NGHTTP2_ERR_WOULDBLOCK : NGHTTP2_ERR_CALLBACK_FAILURE;
  return n;
}

static ssize_t h2_read_body(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                            uint32_t *flags, nghttp2_data_source *source, void *user) {
  (void)session, (void)stream_id, (void)user;
  Stream *stream = source->ptr;
  Bytes *body = &requests[calls[stream->call >= 0 ? stream->call : 0].request];
  if (stream->call < 0) { /* ended at its deadline before its body was out */
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    return 0;
  }
  size_t n = body->len - stream->offset < length ? body->len - stream->offset : length;
  memcpy(buf, body->data + stream->offset, n);
  stream->offset += n;
  if (stream->offset == body->len) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)n;
}

static int h2_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user) {
  (void)flags, (void)user;
  Stream *stream = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
  if (!stream || frame->hd.type != NGHTTP2_HEADERS) return 0;
  char text[16] = {0};
  memcpy(text, value, valuelen < sizeof text - 1 ? valuelen : sizeof text - 1);
  if (namelen == 7 && memcmp(name, ":status", 7) == 0) stream->http_status = atoi(text);
  if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0) stream->grpc_status = atoi(text);
  return 0;
}

static int h2_data(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data, size_t len,
                   void *user) {
  (void)flags, (void)user;
  Stream *stream = nghttp2_session_get_stream_user_data(session, stream_id);
  if (!stream || stream->call < 0) return 0;
  if (stream->in.len + len > MAX_BODY) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* resets the stream */
  if (stream->in.len + len > stream->in_cap)
    stream->in.data = grow(stream->in.data, stream->in_cap = (stream->in.len + len) * 2);
  memcpy(stream->in.data + stream->in.len, data, len);
  stream->in.len += len;
  return 0;
}

static int h2_frame(nghttp2_session *session, const nghttp2_frame *frame, void *user) {
  (void)session;
  if (frame->hd.type == NGHTTP2_GOAWAY) ((Connection *)user)->draining = 1; /* its streams finish, no new ones */
  return 0;
}

static int h2_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user) {
  (void)user;
  Stream *stream = nghttp2_session_get_stream_user_data(session, stream_id);
  if (!stream) return 0;
  if (stream->call >= 0) {
    int status = stream->grpc_status, variant = -1;
    if (status < 0 && error_code != NGHTTP2_NO_ERROR) /* reset before its trailers: gRPC's mapping of the code */
      status = error_code == NGHTTP2_REFUSED_STREAM      ? GRPC_UNAVAILABLE
               : error_code == NGHTTP2_CANCEL            ? GRPC_CANCELLED
               : error_code == NGHTTP2_ENHANCE_YOUR_CALM ? GRPC_RESOURCE_EXHAUSTED
                                                         : GRPC_INTERNAL;
    else if (stream->http_status != 200)
      status = stream->http_status ? BAD_ANSWER : CONNECTION_ERROR;
    else if (status < 0)
      status = BAD_ANSWER; /* no grpc-status: not a gRPC answer */
    else if (status == 0) {
      /* One uncompressed message: its 5-byte prefix says how long it is. */
      uint8_t *p = (uint8_t *)stream->in.data;
      size_t length = stream->in.len >= 5 ? ((size_t)p[1] << 24 | (size_t)p[2] << 16 | (size_t)p[3] << 8 | p[4]) : 0;
      if (stream->in.len < 5 || p[0] != 0 || length != stream->in.len - 5)
        status = BAD_ANSWER;
      else
        variant = variant_of(calls[stream->call].request, stream->in.data + 5, length);
    }
    end_call(stream->call, status, variant);
  }
  nghttp2_session_set_stream_user_data(session, stream_id, NULL);
  free(stream->in.data);
  free(stream);
  return 0;
}

static void h2_flush(Connection *c) {
  if (!c->h2 || c->state != READY) return;
  /* A failed send, or a session with nothing left to do (the server's GOAWAY), ends the connection. */
  if (nghttp2_session_send(c->h2) != 0 || (!nghttp2_session_want_read(c->h2) && !nghttp2_session_want_write(c->h2))) {
    close_connection(c);
    return;
  }
  watch(c, EPOLLIN | (nghttp2_session_want_write(c->h2) ? EPOLLOUT : 0), EPOLL_CTL_MOD);
}

static int h2_open(Connection *c) {
  if (open_socket(c) < 0) return -1;
  nghttp2_session_callbacks *callbacks;
  nghttp2_session_callbacks_new(&callbacks);
  nghttp2_session_callbacks_set_send_callback(callbacks, h2_send);
  nghttp2_session_callbacks_set_on_header_callback(callbacks, h2_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, h2_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, h2_close);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, h2_frame);
  nghttp2_session_client_new(&c->h2, callbacks, c);
  nghttp2_session_callbacks_del(callbacks);
  /* Windows as large as HTTP/2 allows: the answers' flow is never the generator's to hold back. */
  nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (1U << 31) - 1},
                                       {NGHTTP2_SETTINGS_ENABLE_PUSH, 0}};
  nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, settings, 2);
  nghttp2_session_set_local_window_size(c->h2, NGHTTP2_FLAG_NONE, 0, (1 << 30));
  return 0;
}

/* The connection for the calls of place `place`: its own, or a new one when the server closed or is draining it. */
static int grpc_connection(int place) {
  Connection *c = &connections[active[place]];
  if (c->fd >= 0 && !c->draining) return active[place];
  if (c->fd >= 0) { /* draining: its calls finish there, new ones go to a free slot */
    int slot = -1;
    for (int i = 0; i < pool_size && slot < 0; i++)
      if (connections[i].fd < 0) slot = i;
    if (slot < 0) return -1;
    active[place] = slot;
    c = &connections[slot];
  }
  return h2_open(c) < 0 ? -1 : active[place];
}

static void grpc_dispatch(int index) {
  Call *call = &calls[index];
  int slot = grpc_connection(next_connection);
  next_connection = (next_connection + 1) % connection_count;
  inflight[inflight_count++] = index;
  if (slot < 0) { /* the server went away: try to connect again, once per call */
    end_call(index, CONNECTION_ERROR, -1);
    return;
  }
  Connection *c = &connections[slot];
  Stream *stream = calloc(1, sizeof *stream);
  if (!stream) die("memory");
  stream->call = index;
  stream->grpc_status = -1;
  nghttp2_nv headers[7];
#define HEADER(n, v) ((nghttp2_nv){(uint8_t *)(n), (uint8_t *)(v), strlen(n), strlen(v), NGHTTP2_NV_FLAG_NONE})
  headers[0] = HEADER(":method", "POST");
  headers[1] = HEADER(":scheme", "http");
  headers[2] = HEADER(":path", path);
  headers[3] = HEADER(":authority", authority);
  headers[4] = HEADER("content-type", "application/grpc");
  headers[5] = HEADER("te", "trailers");
  int count = 6;
  if (timeout_value[0]) headers[count++] = HEADER("grpc-timeout", timeout_value);
  nghttp2_data_provider body = {.source.ptr = stream, .read_callback = h2_read_body};
  int32_t id = nghttp2_submit_request(c->h2, NULL, headers, (size_t)count, &body, stream);
  if (id < 0) {
    free(stream);
    end_call(index, CONNECTION_ERROR, -1);
    return;
  }
  call->connection = slot;
  call->stream = id;
  h2_flush(c);
}

static void h2_event(Connection *c, uint32_t events) {
  if (c->state == CONNECTING) {
    int error = 0;
    socklen_t size = sizeof error;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &size);
    if (error || (events & (EPOLLERR | EPOLLHUP))) {
      close_connection(c);
      return;
    }
    c->state = READY;
    h2_flush(c);
    return;
  }
  if (events & EPOLLIN) {
    uint8_t buffer[65536];
    for (;;) {
      ssize_t n = recv(c->fd, buffer, sizeof buffer, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0 || nghttp2_session_mem_recv(c->h2, buffer, (size_t)n) < 0) {
        close_connection(c);
        return;
      }
    }
  }
  h2_flush(c);
}

/* A call past its deadline ends now; its gRPC stream is cancelled, its HTTP/1.1 connection closed. */
static void expire(int index) {
  Call *call = &calls[index];
  Connection *c = &connections[call->connection >= 0 ? call->connection : 0];
  if (call->connection < 0) {
    end_call(index, TIMED_OUT, -1);
    return;
  }
  if (!grpc_mode) {
    http_fail(c, TIMED_OUT);
    return;
  }
  end_call(index, TIMED_OUT, -1);
  if (c->h2) {
    Stream *stream = nghttp2_session_get_stream_user_data(c->h2, call->stream);
    if (stream) stream->call = -1;
    nghttp2_submit_rst_stream(c->h2, NGHTTP2_FLAG_NONE, call->stream, NGHTTP2_CANCEL);
    h2_flush(c);
  }
}

static void dispatch(size_t index) {
  Call *call = &calls[index];
  call->sent = now_ns();
  if (inflight_count >= max_outstanding) { /* the generator's own refusal */
    call->sent = -1;
    call->done = 0;
    return;
  }
  if (grpc_mode)
    grpc_dispatch((int)index);
  else
    http_dispatch((int)index);
}

static void on_event(Connection *c, uint32_t events) {
  if (c->fd < 0) return;
  if (grpc_mode)
    h2_event(c, events);
  else
    http_event(c, events);
}

/* Wait for events until `until` (ns), or one event batch, ending calls past their deadline first. */
static void poll_until(int64_t until) {
  int64_t now = now_ns(), wake = until;
  for (int i = inflight_count - 1; i >= 0; i--) {
    int index = inflight[i];
    int64_t deadline = calls[index].sent + deadline_ns;
    if (deadline <= now)
      expire(index);
    else if (deadline < wake)
      wake = deadline;
  }
  int64_t wait = wake - now_ns();
  struct timespec timeout = {wait > 0 ? wait / 1000000000 : 0, wait > 0 ? wait % 1000000000 : 0};
  struct epoll_event events[256];
  int n = epoll_pwait2(epoll_fd, events, 256, &timeout, NULL);
  if (n < 0 && errno != EINTR) die("epoll_pwait2");
  for (int i = 0; i < n; i++) on_event(&connections[events[i].data.u32], events[i].events);
}

static void usage(FILE *to) {
  fprintf(to,
          "usage: loadgen --port PORT (--rate CALLS_PER_S | --concurrency N) --seconds S --out FILE --bodies DIR\n"
          "               [options] REQUEST_FILE...\n"
          "  Calls 127.0.0.1:PORT for S seconds with each REQUEST_FILE in turn: over HTTP/1.1, a whole request as\n"
          "  sent; with --grpc PATH, a serialized message for the gRPC method PATH. --rate: Poisson arrivals, each\n"
          "  call timed from its scheduled send; --concurrency: N calls in flight, each answer followed by the next.\n"
          "  One line per call to FILE:\n"
          "    request scheduled_us sent_us done_us status variant\n"
          "  status: the HTTP status, or with --grpc the grpc-status (0 OK); -1 not sent (--max-outstanding calls in\n"
          "  flight), -2 past the deadline, -3 connection error, -4 not an answer of the protocol. Distinct answer\n"
          "  bodies (gRPC: the message) go to DIR/r<request>-v<variant>.body.\n"
          "options:\n"
          "  --host IPV4            default 127.0.0.1\n"
          "  --grpc PATH            gRPC over HTTP/2 (h2c) to the method PATH, e.g. /inference.GRPCInferenceService/ModelInfer\n"
          "  --connections N        HTTP/1.1: connections at most (one call each); gRPC: connections the calls are\n"
          "                         spread over; default 1024 (HTTP/1.1), 1 (gRPC)\n"
          "  --max-outstanding N    calls in flight at most (the open loop's bound); default 1024\n"
          "  --seed N               the schedule's seed; default 0\n"
          "  --deadline-ms MS       each call's, from its send; default 2000\n"
          "  --idle-reuse-ms MS     HTTP/1.1: an idle connection is reused only within this; default 1000 (servers\n"
          "                         close idle connections: gunicorn's keep-alive is 2 s)\n");
}

int main(int argc, char **argv) {
  const char *host = "127.0.0.1", *out_path = NULL;
  int port = 0, concurrency = 0;
  double rate = 0, seconds = 0, deadline_ms = 2000, idle_reuse_ms = 1000;
  connection_count = -1;
  max_outstanding = 1024;
  static struct option options[] = {
      {"host", required_argument, 0, 'h'},        {"port", required_argument, 0, 'p'},
      {"rate", required_argument, 0, 'r'},        {"concurrency", required_argument, 0, 'C'},
      {"seconds", required_argument, 0, 's'},     {"seed", required_argument, 0, 'S'},
      {"connections", required_argument, 0, 'c'}, {"max-outstanding", required_argument, 0, 'm'},
      {"deadline-ms", required_argument, 0, 'd'}, {"out", required_argument, 0, 'o'},
      {"bodies", required_argument, 0, 'b'},      {"idle-reuse-ms", required_argument, 0, 'i'},
      {"grpc", required_argument, 0, 'g'},
      {"help", no_argument, 0, 'H'},              {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", options, NULL)) != -1) {
    switch (option) {
      case 'h': host = optarg; break;
      case 'p': port = atoi(optarg); break;
      case 'r': rate = atof(optarg); break;
      case 'C': concurrency = atoi(optarg); break;
      case 's': seconds = atof(optarg); break;
      case 'S': seed_state = strtoull(optarg, NULL, 10); break;
      case 'c': connection_count = atoi(optarg); break;
      case 'm': max_outstanding = atoi(optarg); break;
      case 'd': deadline_ms = atof(optarg); break;
      case 'o': out_path = optarg; break;
      case 'b': bodies_dir = optarg; break;
      case 'i': idle_reuse_ms = atof(optarg); break;
      case 'g': grpc_mode = 1, path = optarg; break;
      case 'H': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (connection_count < 0) connection_count = grpc_mode ? 1 : 1024;
  if (concurrency > 0 && !grpc_mode && connection_count < concurrency) connection_count = concurrency;
  request_count = argc - optind;
  if (port <= 0 || (rate <= 0) == (concurrency <= 0) || seconds <= 0 || connection_count <= 0 ||
      max_outstanding <= 0 || !out_path || !bodies_dir || request_count < 1 || request_count > MAX_REQUESTS) {
    usage(stderr);
    return 2;
  }
  requests = calloc((size_t)request_count, sizeof *requests);
  for (int i = 0; i < request_count; i++) {
    requests[i] = read_file(argv[optind + i], grpc_mode ? 5 : 0);
    if (grpc_mode) { /* uncompressed, then the message's length, big-endian */
      uint32_t length = (uint32_t)(requests[i].len - 5);
      uint8_t prefix[5] = {0, length >> 24, length >> 16 & 0xff, length >> 8 & 0xff, length & 0xff};
      memcpy(requests[i].data, prefix, 5);
    }
  }
  address.sin_family = AF_INET;
  address.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &address.sin_addr) != 1) {
    fprintf(stderr, "loadgen: not an IPv4 address: %s\n", host);
    return 2;
  }
  char authority_text[64];
  snprintf(authority_text, sizeof authority_text, "%s:%d", host, port);
  authority = authority_text;
  if (deadline_ms >= 1) snprintf(timeout_value, sizeof timeout_value, "%lldm", (long long)deadline_ms);
  struct rlimit files;
  getrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_cur < (rlim_t)connection_count + 64) {
    files.rlim_cur = files.rlim_max < (rlim_t)connection_count + 64 ? files.rlim_max : (rlim_t)connection_count + 64;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  signal(SIGPIPE, SIG_IGN);
  /* gRPC: room for the connections the server sends GOAWAY on while their calls finish, beside their successors. */
  pool_size = grpc_mode ? connection_count * 4 : connection_count;
  connections = calloc((size_t)pool_size, sizeof *connections);
  idle = calloc((size_t)pool_size, sizeof *idle);
  active = calloc((size_t)connection_count, sizeof *active);
  inflight = calloc((size_t)max_outstanding + 1, sizeof *inflight);
  for (int i = 0; i < pool_size; i++) connections[i] = (Connection){.fd = -1, .call = -1};
  for (int i = 0; i < connection_count; i++) active[i] = i;
  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) die("epoll_create1");
  deadline_ns = (int64_t)(deadline_ms * 1e6);
  idle_reuse_ns = (int64_t)(idle_reuse_ms * 1e6);
  start_ns = 0;
  start_ns = now_ns();

  /* Connections opened before the clock starts: a connection's set-up is not a call's latency. HTTP/1.1 opens as
   * many as the closed loop keeps busy (the open loop opens them as calls need them). */
  int ready = 0, wanted = grpc_mode ? connection_count : (concurrency > 0 ? concurrency : 0);
  for (int i = 0; i < wanted; i++) {
    if ((grpc_mode ? h2_open(&connections[i]) : open_socket(&connections[i])) < 0) die("connect");
  }
  for (int64_t give_up = now_ns() + 10 * (int64_t)1000000000; ready < wanted && now_ns() < give_up;) {
    poll_until(now_ns() + 10000000);
    ready = 0;
    for (int i = 0; i < wanted; i++)
      ready += connections[i].state == (grpc_mode ? READY : IDLE) && connections[i].fd >= 0;
  }
  if (ready < wanted) {
    fprintf(stderr, "loadgen: could not connect to %s:%d\n", host, port);
    return 1;
  }

  start_ns = 0;
  start_ns = now_ns();
  int64_t end = (int64_t)(seconds * 1e9);
  if (rate > 0) {
    /* The schedule: exponential gaps of mean 1/rate, the first call one gap after the start. */
    for (double at = -log(1.0 - uniform()) / rate; at < seconds; at += -log(1.0 - uniform()) / rate)
      new_call((int64_t)(at * 1e9));
    size_t next = 0;
    while (next < call_count || inflight_count > 0) {
      while (next < call_count && calls[next].scheduled <= now_ns()) dispatch(next++);
      poll_until(next < call_count ? calls[next].scheduled : now_ns() + 1000000);
    }
  } else {
    for (;;) {
      int64_t now = now_ns();
      while (inflight_count < concurrency && now < end) {
        size_t index = new_call(now);
        dispatch(index);
        if (calls[index].done >= 0) break; /* it failed at once (no connection): wait a moment before the next */
      }
      if (inflight_count == 0 && now >= end) break;
      poll_until(now + 1000000);
    }
  }

  FILE *out = fopen(out_path, "w");
  if (!out) die(out_path);
  for (size_t i = 0; i < call_count; i++) {
    Call *call = &calls[i];
    fprintf(out, "%d\t%lld\t%lld\t%lld\t%d\t%d\n", call->request, (long long)(call->scheduled / 1000),
            (long long)(call->sent < 0 ? -1 : call->sent / 1000),
            (long long)(call->sent < 0 || call->done < 0 ? -1 : call->done / 1000), call->status, call->variant);
  }
  if (fclose(out) != 0) die(out_path);
  for (int i = 0; i < pool_size; i++) close_connection(&connections[i]);
  return 0;
}
